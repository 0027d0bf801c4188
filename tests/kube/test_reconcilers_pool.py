"""`scaleup` + `pool` against the real control plane: demand, preparation, phases, clean-up.

The controllers run in-process (see `reconcilers_support`); the test plays HyperShift,
CAPI, the Assisted Installer and the `vm` controller by writing their objects as
admin, and waits for named outcomes within deadlines.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from tests.kube.pool_world import UUID, World, pool_with
from tests.kube.reconcilers_support import (
    LABELS,
    NODE_POOL,
    POOL,
    SHARED_MAC,
    agent_inventory,
    agent_obj,
)

JsonObj = dict[str, Any]


@pytest.fixture
def world(pool_world: World) -> World:
    return pool_world


async def test_a_waiting_agent_machine_gets_a_pinned_selector_and_one_vsphere_agent(
    world: World,
) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    va = await eventually(
        lambda: world.get(kinds.VSPHERE_AGENT, "am-1"), what="a VsphereAgent for am-1"
    )
    assert va["metadata"]["labels"] == {
        names.LABEL_POOL: POOL,
        names.LABEL_CREATED_FOR: "agent-machine",
        names.LABEL_AGENT_MACHINE: "am-1",
    }
    assert va["metadata"]["ownerReferences"][0]["name"] == POOL
    assert va["metadata"]["finalizers"] == [names.FINALIZER_VSPHERE_AGENT]
    am = await world.get(kinds.AGENT_MACHINE, "am-1")
    assert am is not None
    assert am["spec"]["agentLabelSelector"]["matchLabels"] == {
        **LABELS,
        names.LABEL_AGENT_MACHINE: "am-1",
    }
    pool = await eventually(
        lambda: pool_with(world, waitingAgentMachines=1, agentMachines=1),
        what="the pool counting one waiting AgentMachine",
    )
    assert names.FINALIZER_POOL in pool["metadata"]["finalizers"]
    assert [v["metadata"]["name"] for v in await world.vsphere_agents()] == ["am-1"]


async def test_two_pools_for_one_nodepool_get_a_warning_and_no_vsphere_agent(world: World) -> None:
    await world.setup_pool()
    await world.setup_pool(name="twin")
    await world.waiting_agent_machine("am-1")

    async def warning() -> JsonObj | None:
        found = await world.kube.list(kinds.EVENT, namespace=world.cpns)
        return next((e for e in found.items if e.get("reason") == "AmbiguousPoolMatch"), None)

    event = await eventually(warning, what="a Warning event on the AgentMachine")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "am-1"
    assert f"{world.ns}/{POOL}" in event["message"]
    assert f"{world.ns}/twin" in event["message"]

    async def ambiguous() -> JsonObj | None:
        conditions = (await world.pool()).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c.get("reason") == "AmbiguousPoolMatch"), None)

    await eventually(ambiguous, what="the pool reporting AmbiguousPoolMatch")
    assert await world.vsphere_agents() == []


async def test_an_agent_with_the_vms_bios_uuid_is_prepared_and_the_vm_available(
    world: World,
) -> None:
    va, vm_name, agent_name = await world.prepared("am-1")
    agent = await world.get(kinds.AGENT, agent_name)
    assert agent is not None
    labels = agent["metadata"]["labels"]
    assert labels["customer"] == "acme"
    assert labels[names.LABEL_NODEPOOL] == "workers"
    assert labels[names.LABEL_NODEPOOL_ROLE] == "worker"
    assert labels[names.LABEL_AGENT_MACHINE] == "am-1"
    assert agent["spec"]["role"] == "worker"
    assert agent["spec"]["hostname"] == vm_name
    assert agent["spec"]["approved"] is True
    vm = await world.phase_is(va, "Available", "AgentAvailable")
    assert vm["agentRef"]["name"] == agent_name
    assert vm["biosUUID"] == UUID
    pool = await eventually(
        lambda: pool_with(world, matchingAgents=1, availableAgents=1),
        what="the pool listing the VM",
    )
    assert [(v["name"], v["phase"]) for v in pool["status"]["ownedVMs"]] == [(vm_name, "Available")]


async def test_phases_follow_binding_and_machine_deletion_then_cleanup_deletes(
    world: World,
) -> None:
    va, _, agent = await world.prepared("am-1")
    await world.bind(agent, "am-1")
    vm = await world.phase_is(va, "Bound", "AgentBound")
    assert vm["machineRef"]["name"] == "machine-am-1"

    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.phase_is(va, "Released", "MachineDeleting")

    await world.unbind(agent)  # CAPI: drain done, AgentMachine deleted, Agent reclaimed
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await world.phase_is(va, "Released", "MachineDeleting")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})

    async def deleting() -> bool:
        found = await world.get(kinds.VSPHERE_AGENT, va)
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    # held by the vm controller's finalizer (set at creation): VM and Agent are its job
    await eventually(deleting, what="the released VsphereAgent to be deleted")
    assert await world.get(kinds.AGENT, agent) is not None


async def test_retain_keeps_a_released_vm(world: World) -> None:
    va, _, agent = await world.prepared("am-1", cleanup="Retain")
    await world.bind(agent, "am-1")
    await world.phase_is(va, "Bound")
    await world.unbind(agent)
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})
    await world.phase_is(va, "Released", "MachineDeleted")
    pool = await eventually(
        lambda: pool_with(world, agentMachines=0), what="the pool's plan after the release"
    )
    assert not any(a["type"] == "DeleteVM" for a in pool["status"]["plannedActions"])
    assert await world.get(kinds.VSPHERE_AGENT, va) is not None


async def test_a_vm_whose_agent_is_bound_is_never_cleaned_up(world: World) -> None:
    va, _, agent = await world.prepared("am-1")
    await world.bind(agent, "am-1")
    await world.phase_is(va, "Bound")
    # The Machine disappears while CAPI still has the Agent bound: never clean up.
    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await eventually(
        lambda: pool_with(world, agentMachines=0, desiredReplicas=0),
        what="the pool seeing no AgentMachine",
    )
    # Released (MachineDeleting) while the Machine was being deleted, Bound again
    # once it is gone: the Agent is still bound to it.
    await world.phase_is(va, "Bound", "AgentBound")
    assert await world.get(kinds.VSPHERE_AGENT, va) is not None
    pool = await world.pool()
    assert not any(
        a["type"] in ("DeleteVM", "DeleteAgent") for a in pool["status"]["plannedActions"]
    )


async def test_pool_deletion_removes_vsphere_agents_then_its_finalizer(world: World) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    await world.waiting_agent_machine("am-2")
    await eventually(lambda: _count(world, 2), what="two VsphereAgents")
    # Both were created with the vm controller's finalizer; am-2 loses it, as one made
    # by an older version the vm controller has not seen yet.
    await world.patch(kinds.VSPHERE_AGENT, "am-2", {"metadata": {"finalizers": None}})
    await eventually(lambda: _has_finalizer(world), what="the pool finalizer")
    await world.kube.delete(kinds.VSPHERE_AGENT_POOL, namespace=world.ns, name=POOL)

    async def only_held_one_left() -> bool:
        left = await world.vsphere_agents()
        return [v["metadata"]["name"] for v in left] == ["am-1"] and bool(
            left[0]["metadata"].get("deletionTimestamp")
        )

    await eventually(only_held_one_left, what="am-2 gone and am-1 deleting")

    async def reports_deleting() -> bool:
        conditions = ((await world.pool()).get("status") or {}).get("conditions") or []
        return any(
            (c["type"], c["status"], c["reason"]) == ("Ready", "False", "Deleting")
            for c in conditions
        )

    await eventually(reports_deleting, what="the pool to report Ready=False Deleting")
    assert await world.get(kinds.VSPHERE_AGENT_POOL, POOL) is not None  # held by the finalizer

    await world.patch(kinds.VSPHERE_AGENT, "am-1", {"metadata": {"finalizers": None}})

    async def pool_gone() -> bool:
        return await world.get(kinds.VSPHERE_AGENT_POOL, POOL) is None

    await eventually(pool_gone, what="the pool to be gone")


async def _count(world: World, n: int) -> bool:
    return len(await world.vsphere_agents()) == n


async def _has_finalizer(world: World) -> bool:
    return names.FINALIZER_POOL in (await world.pool())["metadata"].get("finalizers", [])


async def test_two_pools_whose_vms_share_a_mac_each_prepare_and_count_their_own_agent(
    world: World,
) -> None:
    """Claims across pools go by BIOS UUID first: a shared MAC (vcsim repeats them)
    must not make each pool see its own Agent as claimed by the other."""
    other_uuid = "421c5a3b-0011-2233-4455-0000000000bb"
    pools = {
        POOL: ("am-1", UUID, "agent-1", NODE_POOL),
        "blue": ("am-b", other_uuid, "agent-b", "blue"),
    }
    await world.setup_pool()
    await world.setup_pool(name="blue", node_pool="blue")
    for va, bios_uuid, agent, node_pool in pools.values():
        await world.waiting_agent_machine(va, node_pool=node_pool)
        await world.vm_recorded(va, bios_uuid=bios_uuid, mac=SHARED_MAC)
        await world.create(kinds.AGENT, agent_obj(world.ns, agent))
        await world.patch(kinds.AGENT, agent, {"status": agent_inventory(bios_uuid)}, status=True)
    for va, _, agent, node_pool in pools.values():
        vm = await world.phase_is(va, "Available", "AgentAvailable")
        assert vm["agentRef"]["name"] == agent
        prepared = await world.get(kinds.AGENT, agent)
        assert prepared is not None
        assert prepared["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == va
        assert prepared["metadata"]["labels"][names.LABEL_NODEPOOL] == node_pool
    for pool, (va, _, agent, _) in pools.items():
        await world.bind(agent, va)
        await world.phase_is(va, "Bound", "AgentBound")
        await eventually(
            _bound_agents(world, pool, 1), what=f"pool {pool} counting one bound Agent"
        )
    assert [await world.vm_phase(va) for va, *_ in pools.values()] == [("Bound", "AgentBound")] * 2


def _bound_agents(world: World, pool: str, n: int) -> Any:
    async def check() -> JsonObj | None:
        return await pool_with(world, pool, boundAgents=n)

    return check
