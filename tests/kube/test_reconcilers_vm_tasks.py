"""The task model against the real control plane and vcsim: no worker waits on a vCenter
task, every resume point is read from the recorded task, and pools take turns for slots.

vcsim's task delays keep a task `running` for a while (as a busy vCenter does) without
locking anything; `world.crash()` stops the controllers mid-flight as `kill -9` would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api import kinds, names
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.reconcilers.vm.context import identity_edit
from agentforge.vsphere.vm import owned as vms
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

VA = kinds.VSPHERE_AGENT
POOL = kinds.VSPHERE_AGENT_POOL


def status_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("status") or {}


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in status_of(obj).get("conditions") or []}["Ready"]
    return found


async def pool_with_iso(world: World, name: str = "pool") -> None:
    if name == "pool":
        await world.create_secret()
        await world.create_infra_env()
    await world.create_pool(name)
    await world.condition(POOL, name, "ISOReady", status="True")


async def created(world: World, name: str) -> dict[str, Any]:
    return await world.condition(VA, name, "Ready", status="True", reason="VMReady")


async def one_vm(world: World) -> dict[str, Any]:
    """The pool with its ISO, and va1 whose VM runs (returned Ready)."""
    await pool_with_iso(world)
    await world.create_vsphere_agent("va1")
    return await created(world, "va1")


def calls(counters: dict[str, Any], method: str) -> int:
    return int(counters.get("methods", {}).get(method, 0))


async def recorded(world: World, name: str, phase: str) -> dict[str, Any]:
    """Wait until `status.creation` of `name` records a started task in `phase`."""

    async def check() -> dict[str, Any] | None:
        creation = status_of(await world.get(VA, name)).get("creation") or {}
        return creation if creation.get("phase") == phase and creation.get("taskRef") else None

    found: dict[str, Any] = await eventually(check, what=f"{name}: a task recorded in {phase}")
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


async def power_on_issued(vcsim_control: VcsimControl) -> bool:
    """vcsim received a PowerOnVM_Task (the operator started the power-on)."""
    return bool(await vcsim_control.request_log("PowerOnVM_Task"))


async def test_a_power_on_started_and_finished_while_the_operator_was_down_is_read_from_the_vm(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.set_delay("PowerOnVM_Task", 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        await eventually(
            lambda: power_on_issued(vcsim_control), what="the operator issuing PowerOnVM_Task"
        )
        await world.crash()
    va = await world.get(VA, "va1")
    record = status_of(va)["creation"]
    # The power-on is not recorded: the record still names the create, no identity yet.
    assert record["phase"] == "CreateIssued"
    assert record["taskRef"]
    assert "biosUUID" not in status_of(va)["vm"]

    async def powered_on() -> bool:
        vm = await vm_of(world, record["biosUUID"])
        return vm is not None and vm.power_state is vsphere.PowerState.ON

    await eventually(powered_on, what="the power-on to end while the operator is down")
    await vcsim_control.reset_counters()
    async with world.run():
        va = await created(world, "va1")
    assert "creation" not in status_of(va)
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOnVM_Task") == 0  # the VM runs: read, not powered on again
    assert calls(counters, "CreateVM_Task") == 0
    vms = await world.vms()
    assert [v.bios_uuid for v in vms] == [record["biosUUID"]]
    recorded_vm = status_of(va)["vm"]
    assert recorded_vm["biosUUID"] == record["biosUUID"]  # the identity, from the lookup
    assert recorded_vm["moRef"] == vms[0].moid
    assert recorded_vm["macAddress"]


async def created_while_down(world: World, vcsim_control: VcsimControl) -> dict[str, Any]:
    """va1's CreateVM_Task is recorded, the operator crashes, the create ends (the VM is
    there, powered off); returns the record."""
    await vcsim_control.set_delay("CreateVM_Task", 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        record = await recorded(world, "va1", "CreateIssued")
        await world.crash()

    async def vm_there() -> bool:
        return await vm_of(world, record["biosUUID"]) is not None

    await eventually(vm_there, what="the CreateVM_Task to end while the operator is down")
    await vcsim_control.clear_delays()
    return record


async def as_the_previous_version(
    world: World, record: dict[str, Any], *, task_ref: str | None = None
) -> str:
    """Do what the previous version did once the create ended: start `PowerOnVM_Task` and
    record it with the VM's identity (phase PowerOnIssued). `task_ref` overrides the moref
    written (a task vCenter never knew). Returns the power-on's moref."""
    vm = await vm_of(world, record["biosUUID"])
    assert vm is not None
    session = await world.service.session()
    task = await session.call(
        vms.ref_of(session, vm.moid).PowerOnVM_Task, subject=vm.name, action="power on"
    )
    started: str = task._moId
    write_identity = identity_edit(name=vm.name, vm=vm)

    def issued(obj: dict[str, Any]) -> dict[str, Any]:
        write_identity(obj)
        creation = obj["status"]["creation"]
        creation["phase"] = "PowerOnIssued"
        creation["taskRef"] = task_ref or started
        return obj

    await world.kube.update_status(VA, namespace=world.namespace, name="va1", mutate=issued)
    # as the upgraded process lists it (a cache still at CreateIssued would finish the
    # ended create and start a power-on of its own)
    await world.caught_up(VA, "va1")
    return started


async def test_a_power_on_the_previous_version_recorded_is_resumed_by_its_ref(
    world: World, vcsim_control: VcsimControl
) -> None:
    # An upgrade while a power-on is in flight: the record says PowerOnIssued with the
    # power-on's moref and the VM's identity; the new version waits for that task and
    # finishes without a power-on of its own.
    record = await created_while_down(world, vcsim_control)
    await vcsim_control.set_delay("PowerOnVM_Task", 2000, stage="task")
    power_on = await as_the_previous_version(world, record)
    await vcsim_control.reset_counters()
    async with world.run():
        va = await created(world, "va1")
    assert "creation" not in status_of(va)
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOnVM_Task") == 0  # the recorded one, waited for
    assert calls(counters, "CreateVM_Task") == 0
    vms = await world.vms()
    assert [(v.bios_uuid, v.power_state) for v in vms] == [
        (record["biosUUID"], vsphere.PowerState.ON)
    ]
    assert status_of(va)["vm"]["biosUUID"] == record["biosUUID"]
    assert (await world.service.task(task_ref=power_on)).state is vsphere.TaskState.SUCCESS


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
    # CreateIssued: this version's record of the create; PowerOnIssued: the previous
    # version's record of a power-on (with the identity), read after an upgrade.
    record = await created_while_down(world, vcsim_control)
    if phase == "PowerOnIssued":
        await as_the_previous_version(world, record, task_ref="task-999999")

        async def powered_on() -> bool:
            vm = await vm_of(world, record["biosUUID"])
            return vm is not None and vm.power_state is vsphere.PowerState.ON

        await eventually(powered_on, what="the previous version's power-on to end")
    else:

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
    counters = await vcsim_control.counters()
    assert calls(counters, "CreateVM_Task") == 1
    assert calls(counters, "PowerOnVM_Task") == 1  # the operator's, or the previous version's


async def test_the_vm_controller_writes_a_created_vms_status_three_times(
    world: World, proxy: ProxyControl
) -> None:
    # The checkpoint (read back before CreateVM_Task), the create's moref, and the
    # identity with the record cleared and Ready=True. The power-on is not recorded.
    async with world.run() as controllers:
        vm_ctrl = next(c for c in controllers if c.name == vm.CONTROLLER_NAME)
        await pool_with_iso(world)
        await proxy.reset_counts()
        await world.create_vsphere_agent("va1")
        await created(world, "va1")
        await world.settled(VA, "va1", vm_ctrl)  # nothing left for the vm controller
        rows = await proxy.count_rows()
    status_writes = [
        r
        for r in rows
        if r.verb == "update"
        and r.resource == f"{VA.plural}.{names.GROUP}/status"
        and r.namespace == world.namespace
    ]
    stored = sum(r.count for r in status_writes if r.status < 400)
    refused = sum(r.count for r in status_writes if r.status >= 400)
    assert (stored, refused) == (3, 0)


# --- deletion ---------------------------------------------------------------------------


async def destroying(world: World, vcsim_control: VcsimControl) -> dict[str, Any]:
    """va1's VM runs; va1 is deleted with `Destroy_Task` delayed 3 s; returns the
    recorded `status.deletion` once the destroy has started."""
    async with world.run():
        await one_vm(world)
    await vcsim_control.set_delay("Destroy_Task", 3000, stage="task")
    await world.kube.delete(VA, namespace=world.namespace, name="va1")
    phase = "DestroyIssued"
    async with world.run():

        async def started() -> dict[str, Any] | None:
            record = status_of(await world.get(VA, "va1")).get("deletion") or {}
            return record if record.get("phase") == phase and record.get("taskRef") else None

        record: dict[str, Any] = await eventually(started, what=f"the deletion in {phase}")
        await world.crash()
    return record


async def test_a_destroy_that_finished_while_the_operator_was_down_lets_the_agent_go(
    world: World, vcsim_control: VcsimControl
) -> None:
    record = await destroying(world, vcsim_control)

    async def destroyed() -> bool:
        return await vm_of(world, record["biosUUID"]) is None

    await eventually(destroyed, what="the destroy to end while the operator is down")
    async with world.run():

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await eventually(gone, what="the VsphereAgent to go")
    counters = await vcsim_control.counters()
    assert calls(counters, "Destroy_Task") == 1
    deleted = await world.events("VMDeleted")
    assert deleted
    assert record["biosUUID"] in deleted[0]["message"]


async def test_a_power_off_running_unrecorded_at_a_restart_is_started_again_then_one_destroy(
    world: World, vcsim_control: VcsimControl
) -> None:
    # The power-off is noted in memory only (it is idempotent): the restarted process
    # reads the VM, which still runs, and powers it off again; vCenter refuses that as
    # already off, or runs it once the first one ended. Either way one destroy follows.
    async with world.run():
        va = await one_vm(world)
    bios_uuid = status_of(va)["vm"]["biosUUID"]
    await vcsim_control.set_delay("PowerOffVM_Task", 3000, stage="task")
    await vcsim_control.reset_counters()
    await world.kube.delete(VA, namespace=world.namespace, name="va1")
    async with world.run():

        async def started() -> bool:
            return calls(await vcsim_control.counters(), "PowerOffVM_Task") == 1

        await eventually(started, what="the power-off to start")
        await world.crash()
    assert "deletion" not in status_of(await world.get(VA, "va1"))  # nothing recorded
    assert await vm_of(world, bios_uuid) is not None
    async with world.run():

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await eventually(gone, what="the VsphereAgent to go")
    assert await world.vms() == []
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOffVM_Task") in (1, 2)
    assert calls(counters, "Destroy_Task") == 1
    assert await world.events("VMDeleteFailed") == []


async def test_a_power_off_the_previous_version_recorded_is_resumed_by_its_ref(
    world: World, vcsim_control: VcsimControl
) -> None:
    # An upgrade while a power-off is in flight: the previous version recorded it
    # (phase PowerOffIssued); the new one waits for that task, starts no power-off of
    # its own, and destroys the VM once.
    async with world.run():
        va = await one_vm(world)
    vm = await vm_of(world, status_of(va)["vm"]["biosUUID"])
    assert vm is not None
    await vcsim_control.set_delay("PowerOffVM_Task", 2000, stage="task")
    session = await world.service.session()
    task = await session.call(
        vms.ref_of(session, vm.moid).PowerOffVM_Task, subject=vm.name, action="power off"
    )
    await vcsim_control.reset_counters()

    def issued(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"]["deletion"] = {
            "vmName": vm.name,
            "biosUUID": vm.bios_uuid,
            "phase": "PowerOffIssued",
            "taskRef": task._moId,
            "startedAt": "2026-03-01T12:00:00Z",
        }
        return obj

    await world.kube.update_status(VA, namespace=world.namespace, name="va1", mutate=issued)
    await world.kube.delete(VA, namespace=world.namespace, name="va1")
    await world.caught_up(VA, "va1")
    async with world.run():

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await eventually(gone, what="the VsphereAgent to go")
    assert await world.vms() == []
    counters = await vcsim_control.counters()
    assert calls(counters, "PowerOffVM_Task") == 0  # the recorded one, waited for
    assert calls(counters, "Destroy_Task") == 1


async def test_a_failed_destroy_is_reported_then_started_again(
    world: World, vcsim_control: VcsimControl
) -> None:
    async with world.run():
        await one_vm(world)
        await vcsim_control.fail_next_tasks("Destroy_Task", 1, "GenericVmConfigFault")
        await world.kube.delete(VA, namespace=world.namespace, name="va1")

        async def gone() -> bool:
            return await world.get(VA, "va1") is None

        await eventually(gone, what="the VsphereAgent to go")
    failed = await world.events("VMDeleteFailed")
    assert len(failed) == 1
    assert "destroying VM" in failed[0]["message"]
    assert await world.vms() == []
    assert calls(await vcsim_control.counters(), "Destroy_Task") == 2


async def test_an_unreachable_vcenter_costs_a_recorded_creation_one_write_not_one_per_retry(
    world: World, vcsim_control: VcsimControl
) -> None:
    """A vCenter that stops answering is no attempt of the VM: `attempts` stays, the
    failure is written once, and the pass comes back when the breaker lets calls
    through again. (Counting it wrote the status on every pass, and each write's own
    watch event ran the next pass at once: a write every 2 s per VsphereAgent.)"""
    async with world.run():
        await pool_with_iso(world)
        netloc = world.service.vcenter
        world.registry.guard.unreachable(  # as a timed-out call opens it: 10 s
            netloc, vsphere.NetworkError("vCenter did not answer", subject=f"vCenter {netloc}")
        )
        # the checkpoint asks vCenter nothing; the create after it fails fast (opening the
        # breaker after the create started raced it: a task in flight waits for its end)
        await world.create_vsphere_agent("va1")
        failed = await world.condition(VA, "va1", "Ready", status="False", reason="VMCreateFailed")
        assert "unreachable" in ready(failed)["message"]
        versions = set()
        for _ in range(25):  # 5 s of the breaker's 10 s
            va = await world.get(VA, "va1")
            assert va is not None, "the VsphereAgent stays while vCenter is unreachable"
            versions.add(va["metadata"]["resourceVersion"])
            await asyncio.sleep(0.2)
        assert len(versions) == 1, f"{len(versions)} status writes while vCenter was unreachable"
        assert status_of(va)["creation"]["phase"] == "CreateIssued"  # recorded, not started
        assert not status_of(va)["creation"].get("attempts")
        await created(world, "va1")  # once the breaker lets calls through again
    assert calls(await vcsim_control.counters(), "CreateVM_Task") == 1


# --- the cap and fairness ---------------------------------------------------------------


async def a_burst_and_a_small_pool(world: World, vms: int) -> list[str]:
    """The default pool with `vms` VsphereAgents (`big0`...), and an empty pool `small`."""
    await pool_with_iso(world)
    await pool_with_iso(world, "small")
    big = [f"big{i}" for i in range(vms)]
    for name in big:
        await world.create_vsphere_agent(name)
    return big


async def test_a_pool_asking_for_one_vm_during_another_pools_burst_is_served_in_turn(
    world: World, vcsim_control: VcsimControl
) -> None:
    world.registry.task_slots(world.service.vcenter).cap = 2
    await vcsim_control.set_delay("CreateVM_Task", 2000, stage="task")
    await vcsim_control.set_delay("PowerOnVM_Task", 1000, stage="task")
    async with world.run():
        big = await a_burst_and_a_small_pool(world, 6)

        async def started() -> int:
            stored = [await world.get(VA, name) for name in big]
            return sum(1 for va in stored if status_of(va).get("creation"))

        await eventually(started, what="the burst's first creates")
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
    # long enough that no create of the burst ends before the small pool's starts (a few
    # seconds), which the test then waits out
    await vcsim_control.set_delay("CreateVM_Task", 15000, stage="task")
    async with world.run():
        big = await a_burst_and_a_small_pool(world, 17)

        async def burst_at_its_share() -> bool:
            return calls(await vcsim_control.counters(), "CreateVM_Task") >= 15

        await eventually(
            burst_at_its_share, what="the burst's creates to fill the cap but its headroom"
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
    return int(await eventually(check, what="the small pool's create to begin", within=60)) - 1


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

        await eventually(both_started, what="both stamps started")
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
