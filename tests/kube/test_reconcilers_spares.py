"""Warm spares against the real control plane: a waiting AgentMachine gets a ready spare.

The test plays CAPI (it creates a waiting AgentMachine and its Machine) and the `vm`
controller and the Assisted Installer (it records the spare VM's identity and
registers its Agent); `scaleup` and `pool` run in-process (`reconcilers_support`).
With `spec.spares: 1` the pool creates one spare VsphereAgent; its Agent is approved
and named after its VM but carries only the spare selection label (no pool label),
and `status.spares` says it is ready. When the AgentMachine starts to wait, the spare
is handed to it (its Agent gets the pool labels and the AgentMachine's selection
label) and no VsphereAgent is ever created for the AgentMachine; a replacement spare
is created instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.kube import client as kube_client
from agentforge.reconcilers.planning import naming
from sim.actors.waiting import eventually
from sim.controlplane.controlplane import ControlPlane
from sim.controlplane.pytest_plugin import namespace_name
from tests.kube.pool_world import UUID, World
from tests.kube.reconcilers_support import (
    LABELS,
    POOL,
    agent_inventory,
    agent_obj,
    machine_obj,
    running_operator,
)

JsonObj = dict[str, Any]


@pytest.fixture
async def world(
    controlplane: ControlPlane,
    kube: kube_client.KubeClient,
    namespace: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[World]:
    cpns = controlplane.create_namespace(namespace_name(f"{request.node.name}-cp"))
    async with running_operator(controlplane, namespaces=[namespace, cpns]) as op:
        yield World(kube=kube, ns=namespace, cpns=cpns, op=op)


async def test_a_waiting_agent_machine_gets_a_ready_spare_without_a_new_vm(world: World) -> None:
    await world.setup_pool()
    await world.patch(kinds.VSPHERE_AGENT_POOL, POOL, {"spec": {"spares": 1}})
    spare = naming.spare_name(pool=POOL, index=0)
    vm_name = await world.vm_recorded(spare, bios_uuid=UUID)
    va = await world.get(kinds.VSPHERE_AGENT, spare)
    assert va is not None
    labels = va["metadata"]["labels"]
    assert labels[names.LABEL_CREATED_FOR] == "spare"
    spare_label = labels[names.LABEL_AGENT_MACHINE]
    assert naming.is_spare_selection(spare_label)

    # the spare boots and registers: its Agent is approved, named, labelled as a spare
    await world.create(kinds.AGENT, agent_obj(world.ns, "agent-1"))
    await world.patch(kinds.AGENT, "agent-1", {"status": agent_inventory(UUID)}, status=True)
    await world.phase_is(spare, "Available", "AgentAvailable")

    async def spare_ready() -> JsonObj | None:
        agent = await world.get(kinds.AGENT, "agent-1")
        pool = await world.pool()
        if (agent or {}).get("spec", {}).get("approved") and (pool.get("status") or {}).get(
            "spares"
        ) == {"wanted": 1, "ready": 1, "creating": 0}:
            return agent
        return None

    agent = await eventually(spare_ready, what="the spare's Agent prepared and counted ready")
    assert agent["spec"]["hostname"] == vm_name
    assert agent["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == spare_label
    assert not set(LABELS) & set(agent["metadata"]["labels"])  # no AgentMachine selects it
    pool = await world.pool()
    assert pool["status"]["availableAgents"] == 0  # a spare is not capacity
    assert [v["metadata"]["name"] for v in await world.vsphere_agents()] == [spare]

    # demand: the spare is handed over at once, its Agent prepared for the AgentMachine
    await world.waiting_agent_machine("am-1")
    await world.create(kinds.MACHINE, machine_obj(world.cpns, world.ns, "m-1", infra="am-1"))

    async def prepared() -> JsonObj | None:
        found = await world.get(kinds.AGENT, "agent-1")
        labels = (found or {}).get("metadata", {}).get("labels", {})
        return found if labels.get(names.LABEL_AGENT_MACHINE) == "am-1" else None

    agent = await eventually(prepared, what="the spare's Agent prepared for am-1")
    assert {k: agent["metadata"]["labels"].get(k) for k in LABELS} == LABELS
    va = await world.get(kinds.VSPHERE_AGENT, spare)
    assert va is not None
    assert va["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-1"

    # a replacement spare is made; nothing is ever created for am-1
    replacement = naming.spare_name(pool=POOL, index=1)
    await eventually(
        lambda: world.get(kinds.VSPHERE_AGENT, replacement), what="a replacement spare"
    )
    names_ = sorted(v["metadata"]["name"] for v in await world.vsphere_agents())
    assert names_ == sorted([spare, replacement])
    events = await world.kube.list(kinds.EVENT, namespace=world.cpns)
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events.items}
    assert ("am-1", "VsphereAgentHandedOver") in reasons
    assert ("am-1", "VsphereAgentCreated") not in reasons
