"""Look-alikes against the real control plane: a hosted cluster of the same name elsewhere.

Two hosted clusters called `demo`, each with an AgentMachine called `am-1`, in two
control plane namespaces. The other cluster's provider binds Agents of our InfraEnv
(the Agent namespace is shared); its bindings name `demo` and `am-1` too, but in its
own namespace (`spec.clusterDeploymentName.namespace`, annotation
`agentMachineRefNamespace`). The pool must tell them from its own (docs/design/0002,
"References: namespace and name").
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from tests.kube.pool_world import UUID, World
from tests.kube.reconcilers_support import (
    agent_inventory,
    agent_obj,
    machine_obj,
)

JsonObj = dict[str, Any]
ELSEWHERE = "clusters-demo-elsewhere"


@pytest.fixture
def world(pool_world: World) -> World:
    return pool_world


def bound_elsewhere(ns: str, name: str) -> JsonObj:
    """An Agent bound by the look-alike cluster's provider to its own `am-1`."""
    agent = agent_obj(ns, name)
    agent["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = "am-1"
    agent["metadata"]["annotations"] = {names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: ELSEWHERE}
    agent["spec"] = {
        "approved": True,
        "role": "worker",
        "clusterDeploymentName": {"name": "demo", "namespace": ELSEWHERE},
    }
    return agent


async def test_an_agent_bound_to_a_namesake_cluster_does_not_keep_the_agent_machine_waiting(
    world: World,
) -> None:
    """The VM's stale Agent (same BIOS UUID, a name that sorts first) is bound to the
    other `demo`. It is not this pool's bound worker: the VM's own Agent is prepared
    for `am-1`, and once CAPI binds it the AgentMachine has its VM."""
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    await world.create(
        kinds.MACHINE, machine_obj(world.cpns, world.ns, "machine-am-1", infra="am-1")
    )
    # Both Agents report the VM's BIOS UUID before the VM's identity is recorded: had
    # the look-alike alone been there first, the VM would rightly look taken by another
    # cluster (`AgentBoundElsewhere`) and am-1 would get a new VM.
    await world.create(kinds.AGENT, bound_elsewhere(world.ns, "a-look-alike"))
    await world.patch(kinds.AGENT, "a-look-alike", {"status": agent_inventory(UUID)}, status=True)
    await world.create(kinds.AGENT, agent_obj(world.ns, "agent-1"))
    await world.patch(kinds.AGENT, "agent-1", {"status": agent_inventory(UUID)}, status=True)
    vm_name = await world.vm_recorded("am-1", bios_uuid=UUID)

    vm = await world.phase_is("am-1", "Available", "AgentAvailable")
    assert vm["agentRef"]["name"] == "agent-1"
    prepared = await world.get(kinds.AGENT, "agent-1")
    assert prepared is not None
    assert prepared["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-1"
    assert prepared["spec"]["hostname"] == vm_name
    assert prepared["spec"]["approved"] is True

    await world.bind("agent-1", "am-1")  # CAPI: our am-1 takes the Agent it selects
    vm = await world.phase_is("am-1", "Bound", "AgentBound")
    assert vm["agentRef"]["name"] == "agent-1"
    assert vm["machineRef"]["name"] == "machine-am-1"

    async def counted() -> JsonObj | None:
        pool = await world.pool()
        status = pool.get("status") or {}
        return pool if (status.get("boundAgents"), status.get("matchingAgents")) == (1, 1) else None

    pool = await eventually(counted, what="the pool counting its one bound Agent")
    assert [(v["name"], v["phase"]) for v in pool["status"]["ownedVMs"]] == [(vm_name, "Bound")]
    look_alike = await world.get(kinds.AGENT, "a-look-alike")
    assert look_alike is not None
    assert names.LABEL_AGENT_MACHINE not in look_alike["metadata"]["labels"]  # never prepared


async def test_a_vm_taken_by_a_namesake_cluster_is_replaced_for_the_agent_machine(
    world: World,
) -> None:
    """The other `demo`'s provider binds the Agent of our VM (its `am-1` selects what
    ours would). That VM serves nobody of this pool now (Orphaned,
    AgentBoundElsewhere) and is never deleted while bound; our `am-1` gets a new VM
    instead of waiting for ever."""
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    await world.create(
        kinds.MACHINE, machine_obj(world.cpns, world.ns, "machine-am-1", infra="am-1")
    )
    await world.vm_recorded("am-1", bios_uuid=UUID)
    await world.create(kinds.AGENT, agent_obj(world.ns, "agent-1"))
    await world.patch(kinds.AGENT, "agent-1", {"status": agent_inventory(UUID)}, status=True)
    await world.phase_is("am-1", "Available", "AgentAvailable")

    taken = bound_elsewhere(world.ns, "agent-1")
    await world.patch(
        kinds.AGENT,
        "agent-1",
        {
            "metadata": {
                "labels": taken["metadata"]["labels"],
                "annotations": taken["metadata"]["annotations"],
            },
            "spec": {"clusterDeploymentName": taken["spec"]["clusterDeploymentName"]},
        },
    )
    vm = await world.phase_is("am-1", "Orphaned", "AgentBoundElsewhere")
    assert "agentRef" not in vm

    async def replacement() -> JsonObj | None:
        for va in await world.vsphere_agents():
            labels = va["metadata"]["labels"]
            if va["metadata"]["name"] != "am-1" and labels[names.LABEL_AGENT_MACHINE] == "am-1":
                return va
        return None

    new_va = await eventually(replacement, what="a new VsphereAgent for am-1")
    assert new_va["metadata"]["name"].startswith("am-1-workers-")
    pool = await world.pool()
    assert not any(a["type"] == "DeleteVM" for a in pool["status"]["plannedActions"])
    assert await world.get(kinds.VSPHERE_AGENT, "am-1") is not None
