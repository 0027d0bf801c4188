"""ISO ejection in a pool's life: opting out mid-operation, scale-down, and ISO retention.

- Opting out stops new ejections and reattaches nothing, but an operation already
  recorded (here: waiting on a guest-locked door, the operator killed meanwhile) still
  finishes, lock answer included; `Ejected` conditions stay.
- Scale-down never starts an ejection, and one recorded before is finished before the
  VM is deleted; drain and CAPI's deletion hooks still decide when (the world fails the
  test if a bound Agent's VM disappears).
- Pruning old ISOs keeps a file any VM still holds; once the last holder ejected it, a
  later refresh beyond retention removes it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentforge.api import kinds, names
from agentforge.reconcilers.ejection.run import CrashPoint
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from tests.e2e import ejection_support as ej
from tests.e2e.support import OperatorHarness, consistently, eventually

# In this module the `operator` fixture is not started for the test: each test starts it
# (`ej.run_operator`), with a crash point when it wants one.
operator = ej.unstarted_operator

POOL = ej.POOL
STAYS_S = 3.0
WAITING = CrashPoint.QUESTION_RECORDED.value


def by_name(snap: Snapshot) -> dict[str, dict[str, Any]]:
    return {va["metadata"]["name"]: va for va in ej.vas_of(snap)}


async def test_opting_out_lets_a_recorded_ejection_finish_and_starts_no_new_one(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.run_operator(operator, crash_at=WAITING)
    await ej.set_up(world, eject_after_install=True)
    await world.nodepool(POOL).scale(1)
    snap = await ej.wait_reasons(world, {"Ejected"})
    (early,) = by_name(snap)

    ej.hold_installation(world)
    await world.nodepool(POOL).scale(2)
    snap = await ej.bound(world, 2)
    (locked_name,) = set(by_name(snap)) - {early}
    locked = ej.vm_of(snap, by_name(snap)[locked_name])
    await vcsim_control.lock_cdrom(locked.moref)
    ej.release_installation(world)
    await ej.crashed(operator, point=WAITING)  # the lock question is recorded, not answered

    await ej.set_ejection(world, False)
    await ej.run_operator(operator)
    snap = await ej.wait_reasons(world, {"Ejected"})
    answered = await ej.answers(vcsim_control, locked.moref)
    assert [a["answer_choice"] for a in answered] == ["0"]
    assert len(await ej.disconnects(vcsim_control, locked.moref)) == 1

    ej.hold_installation(world)
    await world.nodepool(POOL).scale(3)
    await ej.bound(world, 3)
    ej.release_installation(world)
    snap = await eventually(
        world.snapshot, lambda s: len(s.installed_agents()) == 3, within=60, what="3 installed"
    )
    (late,) = set(by_name(snap)) - {early, locked_name}
    late_vm = ej.vm_of(snap, by_name(snap)[late])

    def settled(s: Snapshot) -> bool:
        reasons = ej.ejected_reasons(s)
        return (
            reasons == {early: "Ejected", locked_name: "Ejected", late: "Disabled"}
            and ej.pool_iso(s) in (s.vm(late_vm.name) or late_vm).iso_files
        )

    await eventually(world.snapshot, settled, within=60, what="the late worker Disabled")
    await consistently(world.snapshot, settled, duration=STAYS_S, what="no new ejection when off")
    assert await ej.disconnects(vcsim_control, late_vm.moref) == []
    for name in (early, locked_name):
        vm = ej.vm_of(snap, by_name(snap)[name])
        assert ej.pool_iso(snap) not in (snap.vm(vm.name) or vm).iso_files, "nothing reattached"


async def test_scale_down_finishes_a_recorded_ejection_before_the_vm_goes(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.run_operator(operator, crash_at=WAITING)
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(1)
    snap = await ej.bound(world, 1)
    vm = ej.vm_of(snap, ej.vas_of(snap)[0])
    await vcsim_control.lock_cdrom(vm.moref)
    ej.release_installation(world)
    await ej.crashed(operator, point=WAITING)

    await world.nodepool(POOL).scale(0)  # CAPI drains and unbinds while the operator is down
    await ej.run_operator(operator)
    await eventually(
        world.snapshot,
        lambda s: not s.vms_of_pool(POOL) and not ej.vas_of(s) and not s.agents,
        within=120,
        what="the VM, its VsphereAgent and its Agent gone",
    )
    (answer,) = await ej.answers(vcsim_control, vm.moref)
    assert len(await ej.disconnects(vcsim_control, vm.moref)) == 1
    destroys = [
        e
        for e in await vcsim_control.request_log("Destroy_Task")
        if (e.get("target") or {}).get("value") == vm.moref
    ]
    assert len(destroys) == 1
    assert answer["seq"] < destroys[0]["seq"], "the ejection finished before the VM was deleted"
    assert world.violations == []


async def _force_refresh(world: World, token: str) -> None:
    await world.client.patch_merge(
        kinds.VSPHERE_AGENT_POOL,
        namespace=world.namespace,
        name=POOL,
        patch={"metadata": {"annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: token}}},
    )
    await eventually(
        world.snapshot,
        lambda s: (s.pool_status(POOL).get("iso") or {}).get("forceRefreshToken") == token,
        within=60,
        what=f"the ISO refresh for token {token}",
    )


async def _iso_files(world: World) -> list[str]:
    prefix = f"agent-forge/{world.namespace}/{POOL}"
    listed = await asyncio.to_thread(world.vcsim.govc, "datastore.ls", "-ds", "iso-ds", prefix)
    return sorted(line.strip() for line in listed.splitlines() if line.strip().endswith(".iso"))


async def _set_macs(world: World, agent: dict[str, Any], macs: list[str]) -> None:
    inventory = dict(agent["status"]["inventory"])
    interfaces = inventory.get("interfaces") or []
    inventory["interfaces"] = [
        {**i, "macAddress": m} for i, m in zip(interfaces, macs, strict=False)
    ]
    await world.client.patch_status(
        kinds.AGENT,
        namespace=world.namespace,
        name=agent["metadata"]["name"],
        patch={"status": {"inventory": inventory}},
    )


async def test_an_iso_still_held_is_kept_and_pruned_after_its_last_holder_ejected_it(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.run_operator(operator)
    await ej.set_up(world, retain_versions=1)
    await world.nodepool(POOL).scale(2)
    snap = await ej.bound(world, 2)
    snap = await eventually(
        world.snapshot, lambda s: len(s.installed_agents()) == 2, within=60, what="2 installed"
    )
    old = ej.pool_iso(snap).removeprefix("[iso-ds] ").rpartition("/")[2]
    holder = ej.vm_of(snap, ej.vas_of(snap)[1])
    holder_agent = snap.agent_of_vm(holder)
    assert holder_agent is not None
    real_macs = [i["macAddress"] for i in holder_agent["status"]["inventory"]["interfaces"]]
    await _set_macs(world, holder_agent, ["00:50:56:3f:ff:fd"] * len(real_macs))

    await world.infraenvs.change_image("discovery", namespace=world.namespace, new_url=True)
    snap = await eventually(
        world.snapshot,
        lambda s: not ej.pool_iso(s).endswith(old),
        within=60,
        what="the new ISO cached",
    )
    assert old in await _iso_files(world), "beyond retention but held by 2 VMs: kept"

    await ej.set_ejection(world, True)
    snap = await eventually(
        world.snapshot,
        lambda s: sorted(ej.ejected_reasons(s).values()) == ["Ejected", "EjectionFailed"],
        within=90,
        what="one worker ejected, the other refused (identity)",
    )
    await _force_refresh(world, "1")
    assert old in await _iso_files(world), "still held by one VM: kept"

    await _set_macs(world, holder_agent, real_macs)
    await ej.wait_reasons(world, {"Ejected"})
    await _force_refresh(world, "2")
    await eventually(
        lambda: _iso_files(world),
        lambda files: old not in files,
        within=60,
        what=f"{old} removed once nobody holds it",
    )
    assert len(await _iso_files(world)) == 1
