"""The task model against the real control plane and vcsim: no worker waits on a vCenter
task, every resume point is read from the recorded task, and pools take turns for slots.

vcsim's task delays keep a task `running` for a while (as a busy vCenter does) without
locking anything; `world.crash()` stops the controllers mid-flight as `kill -9` would.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api import kinds, names
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

VA = kinds.VSPHERE_AGENT
POOL = kinds.VSPHERE_AGENT_POOL


def status_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("status") or {}


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in status_of(obj).get("conditions") or []}["Ready"]


async def pool_with_iso(world: World, name: str = "pool") -> None:
    if name == "pool":
        await world.create_secret()
        await world.create_infra_env()
    await world.create_pool(name)
    await world.condition(POOL, name, "ISOReady", status="True")


async def created(world: World, name: str) -> dict[str, Any]:
    return await world.condition(VA, name, "Ready", status="True", reason="VMReady")


def calls(counters: dict[str, Any], method: str) -> int:
    return int(counters.get("methods", {}).get(method, 0))


async def recorded(world: World, name: str, phase: str) -> dict[str, Any]:
    """Wait until `status.creation` of `name` records a started task in `phase`."""

    async def check() -> dict[str, Any] | None:
        creation = status_of(await world.get(VA, name)).get("creation") or {}
        return creation if creation.get("phase") == phase and creation.get("taskRef") else None

    found: dict[str, Any] = await world.wait_for(f"{name}: a task recorded in {phase}", check)
    return found


async def vm_of(world: World, bios_uuid: str) -> vsphere.VmFacts | None:
    return await world.service.vm_by_uuid(datacenter="dc1", bios_uuid=bios_uuid)


# --- no worker waits --------------------------------------------------------------------


async def test_one_worker_starts_every_vms_create_before_the_first_create_ends(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.set_delay("CreateVM_Task", 8000, stage="task")
    async with world.run():  # one worker per controller (the world's Deps)
        await pool_with_iso(world)
        for name in ("va1", "va2", "va3"):
            await world.create_vsphere_agent(name)
        for name in ("va1", "va2", "va3"):
            await recorded(world, name, "CreateIssued")
        # Three creates started and recorded by one worker, and none of them ended yet:
        # the worker never waited on a task.
        assert await world.vms() == []
        await vcsim_control.set_delay("CreateVM_Task", 0, stage="task")
        for name in ("va1", "va2", "va3"):
            await created(world, name)
    assert calls(await vcsim_control.counters(), "CreateVM_Task") == 3


# --- resume points ----------------------------------------------------------------------


async def test_a_power_on_recorded_and_finished_while_the_operator_was_down_is_read_by_ref(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.set_delay("PowerOnVM_Task", 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        record = await recorded(world, "va1", "PowerOnIssued")
        await world.crash()
    va = await world.get(VA, "va1")
    assert status_of(va)["vm"]["biosUUID"] == record["biosUUID"]  # recorded with the power-on

    async def powered_on() -> bool:
        vm = await vm_of(world, record["biosUUID"])
        return vm is not None and vm.power_state is vsphere.PowerState.ON

    await world.wait_for("the power-on to end while the operator is down", powered_on)
    await vcsim_control.reset_counters()
    async with world.run():
        va = await created(world, "va1")
    assert "creation" not in status_of(va)
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOnVM_Task") == 0  # read by its ref, not issued again
    assert calls(counters, "CreateVM_Task") == 0
    assert [v.bios_uuid for v in await world.vms()] == [record["biosUUID"]]


async def test_a_failed_power_on_is_reported_once_then_started_again_on_the_same_vm(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.fail_next_tasks("PowerOnVM_Task", 1, "InsufficientResourcesFault")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        failed = await world.condition(VA, "va1", "Ready", status="False", reason="VMCreateFailed")
        assert "powering on VM" in ready(failed)["message"]
        va = await created(world, "va1")
    events = await world.events("VMCreateFailed")
    assert len(events) == 1
    assert events[0]["type"] == "Warning"
    vms = await world.vms()
    assert [v.bios_uuid for v in vms] == [status_of(va)["vm"]["biosUUID"]]  # no second VM
    assert vms[0].power_state is vsphere.PowerState.ON
    counters = await vcsim_control.counters()
    assert calls(counters, "CreateVM_Task") == 1
    assert calls(counters, "PowerOnVM_Task") == 2


@pytest.mark.parametrize("phase", ["CreateIssued", "PowerOnIssued"])
async def test_a_task_vcenter_forgot_is_not_trusted_the_vm_decides(
    world: World, vcsim_control: VcsimControl, phase: str
) -> None:
    method = "CreateVM_Task" if phase == "CreateIssued" else "PowerOnVM_Task"
    await vcsim_control.set_delay(method, 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        record = await recorded(world, "va1", phase)
        await world.crash()

    async def task_ended() -> bool:
        vm = await vm_of(world, record["biosUUID"])
        return vm is not None and (
            phase == "CreateIssued" or vm.power_state is vsphere.PowerState.ON
        )

    await world.wait_for(f"the {method} to end while the operator is down", task_ended)

    def forget(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"]["creation"]["taskRef"] = "task-999999"  # vCenter never knew it
        return obj

    await world.kube.update_status(VA, namespace=world.namespace, name="va1", mutate=forget)
    async with world.run():
        va = await created(world, "va1")
    vms = await world.vms()
    assert [(v.bios_uuid, v.power_state) for v in vms] == [
        (record["biosUUID"], vsphere.PowerState.ON)
    ]
    assert status_of(va)["vm"]["biosUUID"] == record["biosUUID"]
    assert calls(await vcsim_control.counters(), "CreateVM_Task") == 1


# --- deletion ---------------------------------------------------------------------------


async def deleting(world: World, vcsim_control: VcsimControl, method: str) -> dict[str, Any]:
    """va1's VM runs; va1 is deleted with `method` delayed 3 s; returns the recorded
    `status.deletion` once that task has started."""
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        await created(world, "va1")
    await vcsim_control.set_delay(method, 3000, stage="task")
    await world.kube.delete(VA, namespace=world.namespace, name="va1")
    phase = "PowerOffIssued" if method == "PowerOffVM_Task" else "DestroyIssued"
    async with world.run():

        async def started() -> dict[str, Any] | None:
            record = status_of(await world.get(VA, "va1")).get("deletion") or {}
            return record if record.get("phase") == phase and record.get("taskRef") else None

        record: dict[str, Any] = await world.wait_for(f"the deletion in {phase}", started)
        await world.crash()
    return record


async def test_a_destroy_that_finished_while_the_operator_was_down_lets_the_agent_go(
    world: World, vcsim_control: VcsimControl
) -> None:
    record = await deleting(world, vcsim_control, "Destroy_Task")

    async def destroyed() -> bool:
        return await vm_of(world, record["biosUUID"]) is None

    await world.wait_for("the destroy to end while the operator is down", destroyed)
    async with world.run():

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await world.wait_for("the VsphereAgent to go", gone)
    counters = await vcsim_control.counters()
    assert calls(counters, "Destroy_Task") == 1
    deleted = await world.events("VMDeleted")
    assert deleted
    assert record["biosUUID"] in deleted[0]["message"]


async def test_a_power_off_running_at_a_restart_is_waited_for_then_the_vm_destroyed(
    world: World, vcsim_control: VcsimControl
) -> None:
    record = await deleting(world, vcsim_control, "PowerOffVM_Task")
    assert await vm_of(world, record["biosUUID"]) is not None
    async with world.run():

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await world.wait_for("the VsphereAgent to go", gone)
    assert await world.vms() == []
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOffVM_Task") == 1  # the recorded one, not a second
    assert calls(counters, "Destroy_Task") == 1


async def test_a_failed_destroy_is_reported_then_started_again(
    world: World, vcsim_control: VcsimControl
) -> None:
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        await created(world, "va1")
        await vcsim_control.fail_next_tasks("Destroy_Task", 1, "GenericVmConfigFault")
        await world.kube.delete(VA, namespace=world.namespace, name="va1")

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await world.wait_for("the VsphereAgent to go", gone)
    failed = await world.events("VMDeleteFailed")
    assert len(failed) == 1
    assert "destroying VM" in failed[0]["message"]
    assert await world.vms() == []
    assert calls(await vcsim_control.counters(), "Destroy_Task") == 2


# --- the cap and fairness ---------------------------------------------------------------


async def test_a_pool_asking_for_one_vm_during_another_pools_burst_is_served_in_turn(
    world: World, vcsim_control: VcsimControl
) -> None:
    world.registry.task_slots(world.service.vcenter).cap = 2
    await vcsim_control.set_delay("CreateVM_Task", 2000, stage="task")
    await vcsim_control.set_delay("PowerOnVM_Task", 1000, stage="task")
    big = [f"big{i}" for i in range(6)]
    async with world.run():
        await pool_with_iso(world)
        await pool_with_iso(world, "small")
        for name in big:
            await world.create_vsphere_agent(name)

        async def started() -> int:
            stored = [await world.get(VA, name) for name in big]
            return sum(1 for va in stored if status_of(va).get("creation"))

        await world.wait_for("the burst's first creates", started)
        await world.create_vsphere_agent("one", pool="small")

        async def small_started() -> int | None:
            if not status_of(await world.get(VA, "one")).get("creation"):
                return None
            return await started() + 1  # (+1: truthy even when 0 of the burst began)

        begun = await small_started_within(world, small_started)
        # The burst's 6 VMs each need 2 task slots in turn, 2 slots in all: served after
        # the burst, the small pool would begin after all 6; in turn, after about 3.
        assert begun <= 4, f"{begun} of the burst's VMs began before the small pool's one"
        for name in [*big, "one"]:
            await created(world, name)
    assert world.registry.task_slots(world.service.vcenter).in_flight == 0
    assert calls(await vcsim_control.counters(), "CreateVM_Task") == 7


async def test_a_pool_with_nothing_in_flight_starts_before_any_task_of_a_full_cap_ends(
    world: World, vcsim_control: VcsimControl
) -> None:
    slots = world.registry.task_slots(world.service.vcenter)
    slots.cap, slots.headroom = 16, 1  # what a cap of 16 gets (cap // 16)
    await vcsim_control.set_delay("CreateVM_Task", 30000, stage="task")
    big = [f"big{i}" for i in range(17)]
    async with world.run():
        await pool_with_iso(world)
        await pool_with_iso(world, "small")
        for name in big:
            await world.create_vsphere_agent(name)

        async def burst_at_its_share() -> bool:
            return calls(await vcsim_control.counters(), "CreateVM_Task") >= 15

        await world.wait_for(
            "the burst's creates to fill the cap but its headroom", burst_at_its_share
        )
        await world.create_vsphere_agent("one", pool="small")
        await recorded(world, "one", "CreateIssued")  # its create started...
        assert await world.vms() == []  # ...while every create of the burst still runs
        assert calls(await vcsim_control.counters(), "CreateVM_Task") == 16
        assert slots.in_flight == 16
        await vcsim_control.set_delay("CreateVM_Task", 0, stage="task")
        for name in [*big, "one"]:
            await created(world, name)
    assert slots.in_flight == 0


async def small_started_within(world: World, check: Any) -> int:
    return int(await world.wait_for("the small pool's create to begin", check, deadline=60)) - 1


# --- adoption's marker stamp ------------------------------------------------------------


async def adopting(world: World, name: str) -> vsphere.VmFacts:
    legacy = await world.unmarked_vm(world.unique(f"legacy-{name}"))
    await world.create_vsphere_agent(
        name,
        labels={names.LABEL_CREATED_FOR: names.CreatedFor.ADOPTED.value},
        annotations={
            names.ANNOTATION_VM_NAME: legacy.name,
            names.ANNOTATION_VM_BIOS_UUID: legacy.bios_uuid or "",
        },
    )
    return legacy


async def test_one_worker_starts_every_adopted_vms_stamp_before_the_first_one_ends(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.set_delay("ReconfigVM_Task", 8000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        legacy = [await adopting(world, name) for name in ("old1", "old2")]

        async def both_started() -> bool:
            return len(await vcsim_control.request_log("ReconfigVM_Task")) >= 2

        await world.wait_for("both stamps started", both_started)
        for vm in legacy:  # neither stamp has ended: the worker did not wait on one
            found = await vm_of(world, vm.bios_uuid or "")
            assert found is not None
            assert dict(found.markers) == {}
        await vcsim_control.set_delay("ReconfigVM_Task", 0, stage="task")
        for name in ("old1", "old2"):
            await world.condition(VA, name, "Ready", status="True", reason="VMAdopted")
    for vm in legacy:
        found = await vm_of(world, vm.bios_uuid or "")
        assert found is not None
        assert found.markers  # stamped
    assert calls(await vcsim_control.counters(), "ReconfigVM_Task") == 2


async def test_a_failed_stamp_is_reported_then_stamped_again(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.fail_next_tasks("ReconfigVM_Task", 1, "GenericVmConfigFault")
    async with world.run():
        await pool_with_iso(world)
        await adopting(world, "old1")
        await world.condition(VA, "old1", "Ready", status="True", reason="VMAdopted")
    reported = await world.events("AdoptedVMUnavailable")  # (the condition was brief)
    assert len(reported) == 1
    assert reported[0]["type"] == "Warning"
    assert "GenericVmConfigFault" in reported[0]["message"] or "failed" in reported[0]["message"]
    assert calls(await vcsim_control.counters(), "ReconfigVM_Task") == 2
