"""AgentMachines replaced while their VMs boot: the VM count stays bounded and settles.

The real operator against the control plane and vcsim. CAPI (the NodePool driver and
the Machine controller) deletes Machines and creates replacements with new names,
round after round, while the VMs cannot finish booting (vcsim holds `PowerOnVM_Task`
for a while), the situation the issue met: a MachineHealthCheck remediation or a
rollout. Throughout, the pool's own status (one object, written by one plan) must keep
the documented bound (docs/design/0002, "Hand-over"): owned VMs that are capacity <=
AgentMachines without an Agent + VMs whose Agent is or was bound + spare VMs, where
spare VMs are Released. Then the VMs boot and the pool must settle at the demand:
one bound VM per AgentMachine, the replacements served by the VMs made for the
AgentMachines they replaced (hand-overs, not new VMs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

from agentforge.api import kinds, names
from agentforge.reconcilers.planning.assignment import HANDOVER_GRACE
from sim.vcsim import VcsimControl
from sim.world import World
from tests.e2e.support import (
    CONVERGE_S,
    OperatorHarness,
    eventually,
    vsphere_writes,
    wait_converged,
)
from tests.e2e.test_capacity import POOL, set_up

DEMAND = 4
REPLACED = 3
ROUNDS = 3
BOOT_HELD_MS = 20_000
"""PowerOnVM_Task stays running this long: the VMs exist but cannot register an Agent."""


def _owned(pool: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pool.get("status") or {}).get("ownedVMs") or [])


def bound_holds(pool: dict[str, Any]) -> str | None:
    """None when the pool's status keeps the bound, else what broke it."""
    status = pool.get("status") or {}
    owned = _owned(pool)
    capacity = [v for v in owned if v.get("phase") != "Orphaned"]
    held = [v for v in owned if v.get("phase") in ("Bound", "Released")]
    without = int(status.get("agentMachinesWithoutAgent") or 0)
    if len(capacity) <= without + len(held):
        return None
    phases = sorted((v.get("phase"), v.get("reason")) for v in owned)
    return (
        f"{len(capacity)} owned VMs > {without} without Agent + {len(held)} bound/spare: {phases}"
    )


async def test_agent_machines_replaced_while_their_vms_boot_keep_the_vm_count_bounded(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await set_up(world)
    nodepool = world.nodepool(POOL)
    await vcsim_control.set_delay("PowerOnVM_Task", BOOT_HELD_MS, stage="task")
    await nodepool.scale(DEMAND)

    async def vsphere_agents() -> list[dict[str, Any]]:
        listed = await world.client.list(kinds.VSPHERE_AGENT, namespace=world.namespace)
        return [v for v in listed.items if not v["metadata"].get("deletionTimestamp")]

    async def serving(ams: list[str]) -> bool:
        labels = {
            v["metadata"]["labels"].get(names.LABEL_AGENT_MACHINE) for v in await vsphere_agents()
        }
        return set(ams) <= labels

    breaches: list[str] = []
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            pool = await world.client.get(
                kinds.VSPHERE_AGENT_POOL, namespace=world.namespace, name=POOL
            )
            peak = max(peak, len(_owned(pool)))
            broken = bound_holds(pool)
            if broken:
                breaches.append(broken)
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    try:
        first = [m["metadata"]["name"] for m in await nodepool.agent_machines()]
        await eventually(
            lambda: serving(first), within=60, what=f"a VsphereAgent for each of {first}"
        )
        # every Machine scaled away so far: an AgentMachine outlives its Machine's deletion
        # (CAPI drains first), so one replaced in an earlier round may still be listed
        # without a deletionTimestamp while its VM already serves its replacement
        gone: set[str] = set()
        for round_ in range(ROUNDS):
            gone.update(await nodepool.scale(DEMAND - REPLACED))  # the newest Machines go
            await nodepool.scale(DEMAND)  # ... and the MachineSet replaces them
            live = [
                m["metadata"]["name"]
                for m in await nodepool.agent_machines()
                if not m["metadata"].get("deletionTimestamp") and m["metadata"]["name"] not in gone
            ]
            await eventually(
                functools.partial(serving, live),
                within=60,
                what=f"round {round_ + 1}: a VsphereAgent serving each of {live}",
            )
        await vcsim_control.set_delay("PowerOnVM_Task", 0, stage="task")
        # a spare left by a race between informers is cleaned up HANDOVER_GRACE later
        snap = await wait_converged(
            world,
            pool=POOL,
            nodepool=POOL,
            replicas=DEMAND,
            within=CONVERGE_S + HANDOVER_GRACE.total_seconds(),
        )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    assert breaches == [], breaches[:5]
    created = (await vsphere_writes(vcsim_control)).get("CreateVM_Task", 0)
    print(f"churn: {ROUNDS} x {REPLACED} replaced; {created} VMs created, peak {peak} owned")
    # without hand-overs every replacement gets a new VM: DEMAND + ROUNDS * REPLACED
    assert created <= DEMAND + ROUNDS, f"{created} VMs created for a demand of {DEMAND}"
    handed = [
        e
        for e in snap.events
        if e.get("reason") == "VsphereAgentHandedOver"
        and (e.get("involvedObject") or {}).get("kind") == "VsphereAgentPool"
    ]
    assert handed, "the replacements were served by the VMs of the AgentMachines they replaced"
    assert len(snap.vms_of_pool(POOL)) == DEMAND
    assert world.violations == []
