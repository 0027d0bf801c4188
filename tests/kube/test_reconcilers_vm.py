"""The vm controller against the real control plane and vcsim: create once, crash-safe, adopt."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import World
from tests.vcsim.support import raw

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

VA = kinds.VSPHERE_AGENT
POOL = kinds.VSPHERE_AGENT_POOL


async def pool_with_iso(world: World, **spec: Any) -> dict[str, Any]:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(**spec)
    return await world.condition(POOL, "pool", "ISOReady", status="True")


def status_of(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def ready(obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in status_of(obj).get("conditions") or []}["Ready"]
    return found


def expected_markers(world: World, pool: dict[str, Any], va: str) -> dict[str, str]:
    return vsphere.OwnershipMarkers(
        pool_namespace=world.namespace,
        pool_name="pool",
        pool_uid=pool["metadata"]["uid"],
        vsphere_agent=va,
    ).to_extra_config()


async def created(world: World, name: str) -> dict[str, Any]:
    return await world.condition(VA, name, "Ready", status="True", reason="VMReady")


async def gone(world: World, kind: kinds.Kind, name: str) -> None:
    async def check() -> bool:
        return await world.get(kind, name) is None

    await eventually(check, what=f"{kind.kind} {name} to be gone")


def method_count(counters: dict[str, Any], method: str) -> int:
    return int(counters.get("methods", {}).get(method, 0))


# --- creation ----------------------------------------------------------------------------


async def test_a_vm_is_created_once_with_the_pools_hardware_markers_iso_and_tags(
    world: World, vcsim_control: VcsimControl
) -> None:
    category = f"cat-{world.namespace}"[:60]
    await world.govc("tags.category.create", category)
    tag_id = (
        await world.govc("tags.create", "-c", category, f"tag-{world.namespace}"[:60])
    ).strip()
    async with world.run() as controllers:
        pool = await pool_with_iso(world, vsphere={"vmTags": [tag_id]})
        await world.create_vsphere_agent("va1")
        va = await created(world, "va1")
        for ctrl in controllers:  # further reconciles must not create again
            await world.reconciled(ctrl, f"{world.namespace}/va1")
    vms = await world.vms()
    assert [v.name for v in vms] == [world.vm_name("va1")]
    vm = vms[0]
    recorded = status_of(va)["vm"]
    assert recorded["name"] == vm.name
    assert recorded["biosUUID"] == vm.bios_uuid
    assert recorded["macAddress"] == vm.primary_mac.replace(":", "-")  # type: ignore[union-attr]
    assert "creation" not in status_of(va)
    assert names.FINALIZER_VSPHERE_AGENT in va["metadata"]["finalizers"]
    assert dict(vm.markers) == expected_markers(world, pool, "va1")
    assert vm.power_state is vsphere.PowerState.ON
    iso_path = status_of(pool)["iso"]["path"]
    assert [c.backing_file for c in vm.cdroms] == [f"[iso-ds] {iso_path}"]
    hardware = await raw(
        world.service, vm.moid, "config.hardware.numCPU", "config.hardware.memoryMB"
    )
    assert hardware == {"config.hardware.numCPU": 2, "config.hardware.memoryMB": 2048}
    attached = await world.govc("tags.attached.ls", "-r", f"/dc1/vm/{world.folder}/{vm.name}")
    assert f"tag-{world.namespace}"[:60] in attached
    assert method_count(await vcsim_control.counters(), "CreateVM_Task") == 1
    # a VM made alone keeps its event on its VsphereAgent, held a moment (GROUP_HOLD_S)
    (event,) = await eventually(lambda: world.events("VMCreated"), what="the VMCreated event")
    assert event["involvedObject"]["name"] == "va1"


async def test_a_recorded_vm_costs_nothing_on_later_reconciles(
    world: World, vcsim_control: VcsimControl, proxy: ProxyControl
) -> None:
    async with world.run() as controllers:
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        await created(world, "va1")
        vm_ctrl = controllers[-1]
        await world.settled(VA, "va1", vm_ctrl)  # the controller saw its own last write
        await vcsim_control.reset_counters()
        await proxy.reset_counts()
        for _ in range(3):
            await world.reconciled(vm_ctrl, f"{world.namespace}/va1")
        counts = await proxy.counts()
    assert (await vcsim_control.counters()).get("methods", {}) == {}
    ours = {k: n for k, n in counts.items() if k[1].startswith("vsphereagents")}
    assert ours == {}


async def test_without_a_cached_iso_the_vm_waits_and_nothing_is_created(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_pool()
    await world.create_vsphere_agent("va1")
    async with world.run(infra_controller=False):
        va = await world.condition(VA, "va1", "Ready", status="False", reason="WaitingForISO")
    assert "ISOReady" in ready(va)["message"]
    assert method_count(await vcsim_control.counters(), "CreateVM_Task") == 0


async def test_one_status_write_while_waiting_for_the_iso_and_the_ejection_controller_waits(
    world: World, proxy: ProxyControl
) -> None:
    # The ejection controller leaves a VM not yet created to the vm controller (it acts
    # once the stored VsphereAgent says Ready=True), so the two never race on one status.
    await world.create_secret()
    await world.create_pool()
    await world.create_vsphere_agent("va1")
    await proxy.reset_counts()
    async with world.run(infra_controller=False, ejection=True) as controllers:
        va = await world.condition(VA, "va1", "Ready", status="False", reason="WaitingForISO")

        async def idle() -> bool:
            return all(len(c.queue) == 0 and not c.queue.processing for c in controllers)

        await eventually(idle, what="the vm and ejection controllers to go idle")
        counts = await proxy.counts()
    assert "ISOEjected" not in {c["type"] for c in va["status"]["conditions"]}
    writes = {k: n for k, n in counts.items() if k[0] in ("update", "patch")}
    assert writes == {
        ("patch", f"{VA.plural}.{names.GROUP}"): 1,  # the finalizer
        ("update", f"{VA.plural}.{names.GROUP}/status"): 1,  # Ready
    }


async def test_a_missing_pool_is_reported_and_vsphere_is_not_called(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_vsphere_agent("va1", pool="nope")
    async with world.run():
        va = await world.condition(VA, "va1", "Ready", status="False", reason="PoolNotFound")
    assert "spec.poolRef.name" in ready(va)["message"]
    assert (await vcsim_control.counters()).get("methods", {}) == {}


async def test_a_crash_after_the_checkpoint_finds_the_vm_instead_of_creating_a_second(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.set_delay("CreateVM_Task", 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")

        async def in_flight() -> dict[str, Any] | None:
            va = await world.get(VA, "va1")
            issued = await vcsim_control.request_log("CreateVM_Task")
            return va if va and status_of(va).get("creation") and issued else None

        va = await eventually(in_flight, what="the checkpoint and an in-flight CreateVM_Task")
        record = status_of(va)["creation"]
        assert record["phase"] == "CreateIssued"
        assert status_of(va)["vm"]["name"] == record["vmName"] == world.vm_name("va1")
        await world.crash()

    async def half_built() -> list[vsphere.VmFacts]:
        return await world.vms()

    leftover = await eventually(half_built, what="the in-flight create to finish in vCenter")
    assert [v.bios_uuid for v in leftover] == [record["biosUUID"]]
    await vcsim_control.clear_delays()
    async with world.run():  # the restarted operator
        va = await created(world, "va1")
    vms = await world.vms()
    assert [(v.name, v.bios_uuid) for v in vms] == [(record["vmName"], record["biosUUID"])]
    assert vms[0].power_state is vsphere.PowerState.ON  # finished, not recreated
    assert status_of(va)["vm"]["biosUUID"] == record["biosUUID"]
    assert method_count(await vcsim_control.counters(), "CreateVM_Task") == 1


async def killed_mid_create(
    world: World, vcsim_control: VcsimControl, *, task_ref_written: bool
) -> dict[str, Any]:
    """The operator killed while va1's CreateVM_Task runs (3 s in vcsim); its creation
    record, without `taskRef` when `task_ref_written` is False (as if killed between the
    task's start and the second status write)."""
    await vcsim_control.set_delay("CreateVM_Task", 3000, stage="task")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")

        async def task_recorded() -> dict[str, Any] | None:
            va = await world.get(VA, "va1")
            return va if va and (status_of(va).get("creation") or {}).get("taskRef") else None

        va = await eventually(task_recorded, what="the create task's moref in status.creation")
        await world.crash()
    record: dict[str, Any] = status_of(va)["creation"]
    assert record["taskRef"].startswith("task-")
    if not task_ref_written:

        def forget(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"]["creation"].pop("taskRef")
            return obj

        await world.kube.update_status(VA, namespace=world.namespace, name="va1", mutate=forget)
    return record


@pytest.mark.parametrize("task_ref_written", [True, False])
async def test_a_restart_while_the_create_task_runs_waits_for_it_and_creates_nothing(
    world: World, vcsim_control: VcsimControl, task_ref_written: bool
) -> None:
    record = await killed_mid_create(world, vcsim_control, task_ref_written=task_ref_written)
    assert await world.vms() == [], "restarted while the task is still in flight"
    async with world.run():
        if not task_ref_written:  # no task to ask about: the running create is waited for

            async def waiting() -> dict[str, Any] | None:
                va = await world.get(VA, "va1")
                return va if va and "still run in folder" in ready(va)["message"] else None

            await eventually(waiting, what="Ready to say it waits for the create in flight")
        va = await created(world, "va1")
    vms = await world.vms()
    assert [(v.name, v.bios_uuid) for v in vms] == [(record["vmName"], record["biosUUID"])]
    assert vms[0].power_state is vsphere.PowerState.ON
    assert "creation" not in status_of(va)
    issued = await vcsim_control.request_log("CreateVM_Task")
    assert len(issued) == 1  # waited for the task (or for the creates in flight in the folder)
    assert not await world.events("VMNameConflict")


@pytest.mark.parametrize("task_ref_written", [True, False])
async def test_deleting_while_the_create_task_runs_waits_for_it_then_deletes_its_vm(
    world: World, vcsim_control: VcsimControl, task_ref_written: bool
) -> None:
    """Killed mid-create, deleted while down: the restarted operator must not drop the
    finalizer before the in-flight create has finished, or its VM outlives the
    VsphereAgent."""
    record = await killed_mid_create(world, vcsim_control, task_ref_written=task_ref_written)
    await world.kube.delete(VA, namespace=world.namespace, name="va1")
    assert await world.vms() == [], "deleted while the task is still in flight"
    async with world.run():
        if not task_ref_written:  # no task to ask about: the creates in the folder hold it

            async def waiting() -> dict[str, Any] | None:
                va = await world.get(VA, "va1")
                return va if va and "still run in folder" in ready(va)["message"] else None

            held = await eventually(waiting, what="Ready to say the delete waits for the create")
            assert ready(held)["reason"] == "VMDeleting"
            assert names.FINALIZER_VSPHERE_AGENT in held["metadata"]["finalizers"]
        await gone(world, VA, "va1")
    assert await world.vms() == []
    counters = await vcsim_control.counters()
    assert method_count(counters, "CreateVM_Task") == 1
    assert method_count(counters, "Destroy_Task") == 1
    deleted = await world.events("VMDeleted")
    assert deleted
    assert record["biosUUID"] in deleted[0]["message"]


async def test_a_failed_create_keeps_the_record_and_the_retry_makes_exactly_one_vm(
    world: World, vcsim_control: VcsimControl
) -> None:
    await vcsim_control.fail_next_tasks("CreateVM_Task", 1, "InsufficientResourcesFault")
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        va = await created(world, "va1")
    events = await world.events("VMCreateFailed")
    assert events
    assert events[0]["type"] == "Warning"
    assert world.vm_name("va1") in events[0]["message"]
    vms = await world.vms()
    assert [v.bios_uuid for v in vms] == [status_of(va)["vm"]["biosUUID"]]
    assert method_count(await vcsim_control.counters(), "CreateVM_Task") == 2


async def test_a_same_named_vm_that_is_not_ours_is_a_conflict_and_left_alone(
    world: World, vcsim_control: VcsimControl
) -> None:
    squatter = await world.unmarked_vm(world.vm_name("va1"))
    await vcsim_control.reset_counters()
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent("va1")
        va = await world.condition(VA, "va1", "Ready", status="False", reason="VMNameConflict")
    assert squatter.name in ready(va)["message"]
    after = await world.service.vm_by_uuid(datacenter="dc1", bios_uuid=squatter.bios_uuid or "")
    assert after is not None
    assert dict(after.markers) == {}
    assert method_count(await vcsim_control.counters(), "ReconfigVM_Task") == 0


# --- adoption ---------------------------------------------------------------------------


async def test_an_adopted_vm_is_stamped_and_recorded_never_created(
    world: World, vcsim_control: VcsimControl
) -> None:
    legacy = await world.unmarked_vm(world.unique("legacy"))
    await vcsim_control.reset_counters()  # count the operator's calls only
    async with world.run():
        pool = await pool_with_iso(world)
        await world.create_vsphere_agent(
            "adopted",
            labels={names.LABEL_CREATED_FOR: names.CreatedFor.ADOPTED.value},
            annotations={
                names.ANNOTATION_VM_NAME: legacy.name,
                names.ANNOTATION_VM_BIOS_UUID: legacy.bios_uuid or "",
            },
        )
        va = await world.condition(VA, "adopted", "Ready", status="True", reason="VMAdopted")
    after = await world.service.vm_by_uuid(datacenter="dc1", bios_uuid=legacy.bios_uuid or "")
    assert after is not None
    assert dict(after.markers) == expected_markers(world, pool, "adopted")
    assert status_of(va)["vm"]["biosUUID"] == legacy.bios_uuid
    assert status_of(va)["vm"]["name"] == legacy.name
    assert [v.name for v in await world.vms()] == [legacy.name]
    assert method_count(await vcsim_control.counters(), "CreateVM_Task") == 0


async def test_an_adopted_vm_whose_uuid_differs_from_the_pinned_one_is_not_stamped(
    world: World, vcsim_control: VcsimControl
) -> None:
    legacy = await world.unmarked_vm(world.unique("legacy"))
    await vcsim_control.reset_counters()  # count the operator's calls only
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent(
            "adopted",
            labels={names.LABEL_CREATED_FOR: names.CreatedFor.ADOPTED.value},
            annotations={
                names.ANNOTATION_VM_NAME: legacy.name,
                names.ANNOTATION_VM_BIOS_UUID: "42000000-0000-0000-0000-000000000001",
            },
        )
        await world.condition(VA, "adopted", "Ready", status="False", reason="AdoptedVMUnavailable")
    counted = await vcsim_control.counters()
    assert method_count(counted, "ReconfigVM_Task") == 0
    assert method_count(counted, "CreateVM_Task") == 0


async def test_an_adopted_vm_with_another_owners_markers_is_left_alone(
    world: World, vcsim_control: VcsimControl
) -> None:
    foreign = vsphere.OwnershipMarkers(
        pool_namespace="elsewhere", pool_name="p", pool_uid="u", vsphere_agent="x"
    )
    await world.tasks.create(
        world.service,
        vsphere.VmRequest(
            name=world.unique("theirs"),
            placement=world.placement,
            hardware=vsphere.Hardware(cpus=1, memory_mib=512, disk_gib=1),
            iso_file="[iso-ds] none.iso",
            markers=foreign,
            power_on=False,
        ),
    )
    async with world.run():
        await pool_with_iso(world)
        await world.create_vsphere_agent(
            "adopted",
            labels={names.LABEL_CREATED_FOR: names.CreatedFor.ADOPTED.value},
            annotations={names.ANNOTATION_VM_NAME: world.unique("theirs")},
        )
        await world.condition(VA, "adopted", "Ready", status="False", reason="VMOwnershipMismatch")
    theirs = next(v for v in await world.vms() if v.name == world.unique("theirs"))
    assert dict(theirs.markers) == foreign.to_extra_config()
    assert method_count(await vcsim_control.counters(), "ReconfigVM_Task") == 0
