"""Pool status against the real control plane: counts, conditions, quiet steady state, time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge.api import kinds
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl
from tests.kube.pool_world import UUID, World, pool_with
from tests.kube.reconcilers_support import IDENTITY, Operator

WRITES = ("create", "update", "patch", "delete", "get", "list")


@pytest.fixture
def world(pool_world: World) -> World:
    return pool_world


def _reconciles(controller: str) -> float:
    return sum(
        REGISTRY.get_sample_value(
            "agent_forge_reconcile_total", {"controller": controller, "result": result}
        )
        or 0.0
        for result in ("success", "error", "requeue", "requeue_after")
    )


async def _idle(op: Operator) -> bool:
    """No key queued, in a pass, or due later: a routine status change the pacer holds
    back (FAST_STATUS_INTERVAL_S) is a delayed key, written when it is due."""
    return all(
        len(c.queue) == 0 and not c.queue.processing and not c.queue.delayed for c in op.controllers
    )


async def _condition(world: World, type_: str, status: str) -> dict[str, Any] | None:
    conditions = (await world.pool()).get("status", {}).get("conditions", [])
    found = next((c for c in conditions if c["type"] == type_), None)
    return found if found is not None and found["status"] == status else None


async def test_status_counts_and_conditions_follow_the_world(world: World) -> None:
    _, vm_name, _ = await world.prepared("am-1")
    pool = await eventually(
        lambda: pool_with(
            world,
            agentMachines=1,
            waitingAgentMachines=1,
            unreadyAgentMachines=1,
            agentMachinesWithoutAgent=1,
            desiredReplicas=1,
            matchingAgents=1,
            availableAgents=1,
            boundAgents=0,
        ),
        what="counts of one waiting AgentMachine and one available Agent",
    )
    assert pool["status"]["observedGeneration"] == pool["metadata"]["generation"]
    by_type = {c["type"]: c for c in pool["status"]["conditions"]}
    assert (
        by_type["AgentMachineDemandFound"]["status"],
        by_type["InfraEnvAvailable"]["status"],
    ) == (
        "True",
        "True",
    )
    assert by_type["CapacitySatisfied"]["reason"] == "Provisioning"
    assert by_type["Ready"]["status"] == "Unknown"  # the infra controller has not reported yet

    # the `infra` controller's part: vSphere answers and the ISO is cached
    await world.patch(
        kinds.VSPHERE_AGENT_POOL,
        "workers",
        {"status": {"conditions": [
            *pool["status"]["conditions"],
            {"type": "VsphereReady", "status": "True", "reason": "VsphereConnected",
             "message": "ok", "lastTransitionTime": "2026-03-01T00:00:00Z"},
            {"type": "ISOReady", "status": "True", "reason": "ISOCached",
             "message": "ok", "lastTransitionTime": "2026-03-01T00:00:00Z"},
        ]}},
        status=True,
    )  # fmt: skip
    ready = await eventually(lambda: _condition(world, "Ready", "True"), what="Ready=True")
    assert ready["reason"] == "Reconciled"
    pool = await world.pool()
    assert [vm["name"] for vm in pool["status"]["ownedVMs"]] == [vm_name]


async def test_nothing_is_written_when_nothing_changed(world: World, proxy: ProxyControl) -> None:
    await world.prepared("am-1")
    await eventually(lambda: _settled(world), what="the plan to settle")
    await eventually(lambda: _idle(world.op), what="the controllers to go idle")
    await proxy.reset_counts()
    before = _reconciles("pool")
    # An Agent change the planner reads (an annotation) but that changes nothing.
    await world.patch(kinds.AGENT, "agent-1", {"metadata": {"annotations": {"touched": "1"}}})

    async def replanned() -> bool:
        return _reconciles("pool") > before and await _idle(world.op)

    await eventually(replanned, what="the pool to be replanned")
    rows = await proxy.count_rows(IDENTITY)
    assert [(r.verb, r.resource) for r in rows if r.verb in WRITES] == []


async def _settled(world: World) -> bool:
    pool = await world.pool()
    actions = (pool.get("status") or {}).get("plannedActions") or []
    return [a["type"] for a in actions] == ["Noop"]


async def test_a_vm_never_discovered_is_orphaned_then_replaced(world: World) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    first = await eventually(lambda: world.get(kinds.VSPHERE_AGENT, "am-1"), what="a VsphereAgent")
    vm_name = first["metadata"]["annotations"]["agent-forge.containeroo.ch/vm-name"]
    await world.patch(
        kinds.VSPHERE_AGENT, "am-1", {"status": {"vm": {"name": vm_name, "biosUUID": UUID}}},
        status=True,
    )  # fmt: skip
    await world.phase_is("am-1", "Provisioning", "AgentPending")

    world.op.clock.offset += timedelta(minutes=31)
    await world.patch(kinds.AGENT_MACHINE, "am-1", {"metadata": {"annotations": {"tick": "1"}}})
    await world.phase_is("am-1", "Orphaned", "DiscoveryTimeout")

    world.op.clock.offset += timedelta(minutes=31)
    await world.patch(kinds.AGENT_MACHINE, "am-1", {"metadata": {"annotations": {"tick": "2"}}})

    async def deleting() -> bool:
        current = await world.get(kinds.VSPHERE_AGENT, "am-1")
        return bool(current and current["metadata"].get("deletionTimestamp"))

    # Clean-up deletes the orphan; the vm controller's part (not running here): its VM
    # is gone, so it drops the finalizer the VsphereAgent was created with.
    await eventually(deleting, what="the orphan to be deleted")
    await world.patch(kinds.VSPHERE_AGENT, "am-1", {"metadata": {"finalizers": None}})

    async def replaced() -> dict[str, Any] | None:
        current = await world.get(kinds.VSPHERE_AGENT, "am-1")
        if current and current["metadata"]["uid"] != first["metadata"]["uid"]:
            return current
        return None

    # The AgentMachine still waits, so scaleup asks again.
    await eventually(replaced, what="the orphan to be replaced by a new VsphereAgent")
