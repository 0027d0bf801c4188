"""The capacity bridge end to end: NodePool demand becomes VMs, Agents, bound Machines.

The real operator process (its ServiceAccount, `config/rbac`) runs against the real
control plane and vcsim; the actors play HyperShift/CAPI (Machines, AgentMachines,
binding, drain) and the Assisted Installer (Agents for VMs booting the ISO). Every
wait is for a named state within a deadline; the world's rule checks (no bound Agent
deleted, no VM of a bound Agent deleted) run at teardown of each test.
"""

from __future__ import annotations

import time

import pytest

from agentforge.api import names
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from tests.e2e.support import (
    OperatorHarness,
    consistently,
    eventually,
    vsphere_writes,
    wait_converged,
)

POOL = "workers"
TASK_DELAY_S = 8.0  # longer than a restart: the restarted operator meets the task in flight


async def set_up(world: World, pool: str = POOL, **pool_fields: object) -> None:
    await world.create_infraenv()
    await world.create_credentials()
    await world.create_pool(pool, folder=f"e2e/{world.namespace}", **pool_fields)


def vms_by_uuid(snap: Snapshot, pool: str = POOL) -> dict[str, str]:
    return {vm.bios_uuid: vm.name for vm in snap.vms_of_pool(pool)}


def gone(snap: Snapshot, pool: str = POOL) -> bool:
    return (
        not (snap.machines or snap.agent_machines or snap.vms_of_pool(pool) or snap.vsphere_agents)
        and not snap.agents
    )


async def test_scale_0_3_5_2_0_converges_with_the_right_vms_and_no_bound_agent_deleted(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await set_up(world)
    nodepool = world.nodepool(POOL)

    await nodepool.scale(3)
    three = vms_by_uuid(await wait_converged(world, pool=POOL, nodepool=POOL, replicas=3))

    await nodepool.scale(5)
    five = vms_by_uuid(await wait_converged(world, pool=POOL, nodepool=POOL, replicas=5))
    assert three.items() <= five.items(), "scale-up must not replace running VMs"
    assert (await vsphere_writes(vcsim_control)).get("CreateVM_Task") == 5

    await nodepool.scale(2)
    snap = await wait_converged(world, pool=POOL, nodepool=POOL, replicas=2)
    two = vms_by_uuid(snap)
    assert two.items() <= three.items(), "scale-down keeps the VMs of the oldest Machines"
    snap = await eventually(
        world.snapshot, lambda s: len(s.agents) == 2, within=60, what="Agents of deleted VMs gone"
    )

    await nodepool.scale(0)
    await eventually(world.snapshot, gone, within=120, what="every Machine, VM and Agent gone")
    writes = await vsphere_writes(vcsim_control)
    assert writes.get("CreateVM_Task") == 5
    assert writes.get("Destroy_Task") == 5
    assert world.violations == []


async def test_retain_keeps_vms_and_agents_after_scale_down(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await set_up(world, cleanup_policy="Retain")
    nodepool = world.nodepool(POOL)
    await nodepool.scale(2)
    kept = vms_by_uuid(await wait_converged(world, pool=POOL, nodepool=POOL, replicas=2))

    await nodepool.scale(0)

    def settled(snap: Snapshot) -> bool:
        status = snap.pool_status(POOL)
        return (
            not snap.machines
            and not snap.agent_machines
            and not snap.bound_agents()
            and int(status.get("agentMachines") or 0) == 0
            and int(status.get("boundAgents") or 0) == 0
        )

    await eventually(world.snapshot, settled, within=90, what="AgentMachines gone, Agents unbound")
    snap = await consistently(
        world.snapshot,
        lambda s: vms_by_uuid(s) == kept and len(s.agents) == 2,
        duration=5,
        what="Retain keeps both VMs and both Agents",
    )
    assert all(a["metadata"].get("deletionTimestamp") is None for a in snap.agents)
    assert "Destroy_Task" not in await vsphere_writes(vcsim_control)


async def test_two_pools_sharing_an_infraenv_stay_isolated(
    world: World, operator: OperatorHarness
) -> None:
    await set_up(world, "blue")
    await world.create_pool("green", folder=f"e2e/{world.namespace}")
    blue, green = world.nodepool("blue"), world.nodepool("green")

    await blue.scale(2)
    await green.scale(1)
    snap = await wait_converged(world, pool="blue", nodepool="blue", replicas=2)
    snap = await wait_converged(world, pool="green", nodepool="green", replicas=1)
    green_vms = vms_by_uuid(snap, "green")
    for pool in ("blue", "green"):
        owned = {v["name"] for v in snap.pool_status(pool).get("ownedVMs") or []}
        assert owned == snap.vm_names(pool), f"pool {pool} lists exactly its own VMs"
        for vm in snap.vms_of_pool(pool):
            agent = snap.agent_of_vm(vm)
            assert agent is not None
            assert agent["metadata"]["labels"]["agent-pool"] == pool
            assert agent["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF].startswith(pool)

    await blue.scale(0)
    snap = await wait_converged(world, pool="blue", nodepool="blue", replicas=0)
    snap = await wait_converged(world, pool="green", nodepool="green", replicas=1)
    assert vms_by_uuid(snap, "green") == green_vms, "green's VM survives blue's scale-down"


@pytest.mark.parametrize("kill_during", ["CreateVM_Task", "PowerOnVM_Task"])
async def test_kill_9_during_scale_up_then_restart_leaves_no_duplicate_and_no_orphan_vm(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl, kill_during: str
) -> None:
    await set_up(world)
    await vcsim_control.set_delay(kill_during, int(TASK_DELAY_S * 1000), stage="task")
    await world.nodepool(POOL).scale(2)
    await eventually(
        lambda: vcsim_control.request_log(kill_during),
        lambda entries: len(entries) >= 1,
        within=90,
        what=f"the operator issuing {kill_during}",
    )
    # Tasks issued until now end by this time: a duplicate they cause shows up before it.
    in_flight_until = time.monotonic() + TASK_DELAY_S + 1.0
    operator.kill()
    await vcsim_control.set_delay(kill_during, 0, stage="task")
    await operator.restart()

    key = f"{world.namespace}/{POOL}"

    def settled_or_duplicated(snap: Snapshot) -> bool:
        names = [vm.name for vm in snap.vms_of_pool(POOL)]
        duplicated = len(names) != len(set(names))
        return duplicated or snap.converged(pool=POOL, nodepool_key=key, replicas=2)

    snap = await eventually(
        world.snapshot,
        settled_or_duplicated,
        within=120,
        what="two bound replicas (or a duplicate VM)",
        interval=0.5,
    )
    vm_names = [vm.name for vm in snap.vms_of_pool(POOL)]
    assert len(vm_names) == len(set(vm_names)) == 2, f"no duplicate VM:\n{snap.describe()}"
    recorded = {
        ((va.get("status") or {}).get("vm") or {}).get("name") for va in snap.vsphere_agents
    }
    assert set(vm_names) == recorded, "every VM is recorded by a VsphereAgent: no orphan"
    assert snap.vm_names() == set(vm_names), "no VM of this world outside the pool"
    await consistently(
        world.snapshot,
        lambda s: len(s.vms_of_pool(POOL)) == 2,
        duration=max(2.0, in_flight_until - time.monotonic()),
        what="no late duplicate VM once the tasks in flight at the kill have ended",
    )


@pytest.mark.parametrize("kill_during", ["PowerOffVM_Task", "Destroy_Task"])
async def test_kill_9_during_scale_down_then_restart_destroys_every_vm_once(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl, kill_during: str
) -> None:
    # The power-off is only noted in memory, the destroy recorded in status.deletion:
    # either way the restarted operator finishes the scale-down (every VM destroyed,
    # every Agent deleted, never a bound one: the world's rule checks) and creates
    # nothing for a VsphereAgent on its way out.
    await set_up(world)
    await world.nodepool(POOL).scale(2)
    await wait_converged(world, pool=POOL, nodepool=POOL, replicas=2)
    await vcsim_control.set_delay(kill_during, int(TASK_DELAY_S * 1000), stage="task")
    await world.nodepool(POOL).scale(0)
    await eventually(
        lambda: vcsim_control.request_log(kill_during),
        lambda entries: len(entries) >= 1,
        within=90,
        what=f"the operator issuing {kill_during}",
    )
    operator.kill()
    await vcsim_control.set_delay(kill_during, 0, stage="task")
    await operator.restart()
    snap = await eventually(
        world.snapshot, gone, within=120, what="every Machine, VM and Agent gone"
    )
    assert snap.vm_names() == set(), "no VM of this world left"
    assert (await vsphere_writes(vcsim_control)).get("CreateVM_Task") == 2
    assert world.violations == []
