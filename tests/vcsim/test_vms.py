"""VMs: created idempotently with markers, read in one round trip, deleted only if ours."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest

from agentforge.kube.store import ObjectKey
from agentforge.vsphere import (
    AlreadyExists,
    Firmware,
    Hardware,
    NicType,
    OwnershipMarkers,
    OwnershipMismatch,
    Placement,
    PowerState,
    ScsiType,
    TaskState,
    VsphereError,
    VsphereService,
)
from agentforge.vsphere.tasks import waiter as tasks
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vm import provision
from agentforge.vsphere.vmomi import vim
from sim.actors.waiting import eventually
from sim.vsphere_tasks import TaskDriver
from tests.vcsim import support

pytestmark = pytest.mark.vcsim


@pytest.mark.parametrize(
    ("hardware", "network"),
    [
        (Hardware(cpus=2, memory_mib=2048, disk_gib=20), "VM Network"),
        (
            Hardware(
                cpus=1,
                memory_mib=1024,
                disk_gib=30,
                eager_scrub=True,
                scsi_type=ScsiType.LSILOGIC_SAS,
                firmware=Firmware.BIOS,
                nic_type=NicType.E1000E,
                guest_id="otherLinux64Guest",
            ),
            "dvpg1",
        ),
    ],
)
async def test_a_created_vm_has_the_asked_hardware_markers_and_iso(
    driver: TaskDriver,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    hardware: Hardware,
    network: str,
) -> None:
    where = dataclasses.replace(placement, network=network)
    vm = await driver.create(service, support.request(where, markers, hardware=hardware))
    assert vm.power_state is PowerState.ON
    assert vm.ownership == markers
    assert vm.bios_uuid
    assert vm.primary_mac
    (cd,) = vm.cdroms
    assert cd.backing_file == support.ISO
    assert cd.connected
    assert cd.start_connected
    got = await support.raw(
        service,
        vm.moid,
        "config.hardware.numCPU",
        "config.hardware.memoryMB",
        "config.firmware",
        "config.guestId",
        "config.hardware.device",
        "datastore",
    )
    assert got["config.hardware.numCPU"] == hardware.cpus
    assert got["config.hardware.memoryMB"] == hardware.memory_mib
    assert got["config.firmware"] == str(hardware.firmware)
    devices = got["config.hardware.device"]
    nic = next(d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard))
    if network == "dvpg1":
        assert isinstance(
            nic.backing, vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo
        )
    else:
        assert nic.backing.deviceName == "VM Network"
    disk = next(d for d in devices if isinstance(d, vim.vm.device.VirtualDisk))
    assert disk.capacityInKB == hardware.disk_gib * 1024 * 1024
    assert {ds.name for ds in got["datastore"]} <= {"ds1", "ds2"}  # placed by Storage DRS
    assert (await support.extra_config(service, vm.moid))["disk.enableUUID"] == "TRUE"


async def test_creating_the_same_vm_twice_returns_the_first(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    req = support.request(placement, markers)
    first = await driver.create(service, req)
    second = await driver.create(service, req)
    assert second.moid == first.moid
    assert await support.vm_names_in_folder(service, placement) == [req.name]


async def test_a_same_named_vm_of_another_owner_is_reported_and_left_alone(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    theirs = dataclasses.replace(markers, pool_uid=str(uuid.uuid4()))
    req = support.request(placement, theirs)
    existing = await driver.create(service, req)
    with pytest.raises(AlreadyExists, match="not ours"):
        await driver.create(service, dataclasses.replace(req, markers=markers))
    again = await service.vm_by_uuid(datacenter="dc1", bios_uuid=existing.bios_uuid or "")
    assert again is not None
    assert again.ownership == theirs
    assert again.power_state is PowerState.ON


async def test_a_vm_left_unfinished_by_a_failed_tag_is_kept_ours_and_finished_later(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    req = support.request(
        placement, markers, tag_ids=("urn:vmomi:InventoryServiceTag:missing:GLOBAL",)
    )
    with pytest.raises(VsphereError, match="tag"):
        await driver.create(service, req)
    kept = await service.vm_by_name(placement=placement, name=req.name)
    assert kept is not None
    assert kept.ownership == markers
    assert kept.power_state is PowerState.OFF  # never powered on untagged
    finished = await driver.create(service, dataclasses.replace(req, tag_ids=()))
    assert (finished.moid, finished.power_state) == (kept.moid, PowerState.ON)


@pytest.mark.parametrize("fault", ["InsufficientResourcesFault", "TaskInProgress"])
async def test_a_vm_whose_power_on_failed_is_kept_and_powered_on_by_the_next_attempt(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    fault: str,
) -> None:
    await service.session()
    req = support.request(placement, markers)
    await vcsim.control.fail_next_tasks("PowerOnVM_Task", 1, fault)
    with pytest.raises(VsphereError):
        await driver.create(service, req)
    assert await support.vm_names_in_folder(service, placement) == [req.name]
    vm = await driver.create(service, req)  # the next pass: ours by name, powered on again
    assert vm.power_state is PowerState.ON
    assert await support.vm_names_in_folder(service, placement) == [req.name]
    assert (await vcsim.control.counters())["faults_injected"] == 1


async def test_a_cancelled_create_leaves_the_half_built_vm_for_the_next_attempt(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    request = dataclasses.replace(support.request(placement, markers), bios_uuid=str(uuid.uuid4()))
    await vcsim.control.set_delay("PowerOnVM_Task", 3000, stage="task")
    mark = await vcsim.control.last_seq()
    create = asyncio.create_task(driver.create(service, request))

    async def powering_on() -> bool:
        return "PowerOnVM_Task" in await _methods_since(vcsim, mark)

    await eventually(powering_on, within=30, what="the create to power the VM on", interval=0.05)
    create.cancel()  # a lost Lease or a shutdown, mid-way through the create
    with pytest.raises(asyncio.CancelledError):
        await create
    found = await service.vm_by_uuid(datacenter="dc1", bios_uuid=request.bios_uuid or "")
    assert found is not None, "the half-built VM is still there"
    methods = await _methods_since(vcsim, mark)
    assert "Destroy_Task" not in methods
    assert "PowerOffVM_Task" not in methods
    await vcsim.control.clear_delays()
    resumed = await driver.create(service, request)  # the next leader, from the checkpoint
    assert resumed.moid == found.moid
    assert resumed.power_state is PowerState.ON


async def _methods_since(vcsim: Any, mark: int) -> list[str]:
    return [str(e.get("method") or e["path"]) for e in await vcsim.control.request_log(since=mark)]


async def test_tags_are_attached_by_id(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    tag_id = await _make_tag(service)
    vm = await driver.create(service, support.request(placement, markers, tag_ids=(tag_id,)))
    assert tag_id in await _attached_tags(service, vm.moid)


async def test_facts_of_many_vms_cost_one_request(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    made = await asyncio.gather(
        *(driver.create(service, support.request(placement, markers)) for _ in range(4))
    )
    uuids = [vm.bios_uuid or "" for vm in made]
    before = await vcsim.control.counters()
    got = await service.vms_by_uuid(datacenter="dc1", bios_uuids=uuids)
    after = await vcsim.control.counters()
    assert sorted(got) == sorted(uuids)
    # The task watcher may still be finishing its last poll of the creates' tasks.
    watcher = {"WaitForUpdatesEx", "CancelWaitForUpdates", "ModifyListView"}
    changed = {
        m: support.method_delta(before, after, m)
        for m in after["methods"]
        if m not in watcher and support.method_delta(before, after, m)
    }
    assert sum(changed.values()) == 1, changed


async def test_lookup_by_uuid_in_a_fresh_session_finds_the_vm(
    driver: TaskDriver,
    service: VsphereService,
    registry: Any,
    credentials: Any,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await driver.create(service, support.request(placement, markers))
    await registry.close()
    fresh = VsphereService(
        registry=type(registry)(options=registry.options), credentials=credentials
    )
    try:
        found = await fresh.vm_by_uuid(datacenter="dc1", bios_uuid=(vm.bios_uuid or "").upper())
        by_name = await fresh.vm_by_name(placement=placement, name=vm.name)
    finally:
        await fresh._registry.close()
    assert found is not None
    assert found.moid == vm.moid
    assert by_name is not None
    assert by_name.moid == vm.moid


async def test_delete_powers_off_and_destroys_our_vm_and_is_idempotent(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    vm = await driver.create(service, support.request(placement, markers))
    uuid_ = vm.bios_uuid or ""
    assert await driver.delete(service, datacenter="dc1", bios_uuid=uuid_, markers=markers)
    assert await service.vm_by_uuid(datacenter="dc1", bios_uuid=uuid_) is None
    gone = await driver.delete(service, datacenter="dc1", bios_uuid=uuid_, markers=markers)
    assert gone is False


@pytest.mark.parametrize("owner", ["unmarked", "foreign"])
async def test_delete_refuses_a_vm_that_is_not_ours_and_touches_nothing(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    owner: str,
) -> None:
    other = dataclasses.replace(markers, vsphere_agent="someone-else")
    vm = await driver.create(service, support.request(placement, other))
    if owner == "unmarked":
        await _strip_markers(service, vm.moid)
    before = await vcsim.control.counters()
    with pytest.raises(OwnershipMismatch):
        await driver.delete(
            service, datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers
        )
    after = await vcsim.control.counters()
    for method in ("PowerOffVM_Task", "Destroy_Task", "ReconfigVM_Task"):
        assert support.method_delta(before, after, method) == 0
    again = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert again is not None
    assert again.power_state is PowerState.ON


async def test_stamping_adopts_an_unmarked_vm_and_is_idempotent(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    vm = await driver.create(service, support.request(placement, markers))
    await _strip_markers(service, vm.moid)
    stamped = await driver.stamp(
        service, datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers
    )
    assert stamped.ownership == markers
    again = await driver.stamp(
        service, datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers
    )
    assert again.ownership == markers


async def test_stamping_refuses_to_overwrite_another_owners_markers(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    theirs = dataclasses.replace(markers, pool_name="other-pool")
    vm = await driver.create(service, support.request(placement, theirs))
    before = await vcsim.control.counters()
    with pytest.raises(OwnershipMismatch):
        await driver.stamp(service, datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers)
    after = await vcsim.control.counters()
    assert support.method_delta(before, after, "ReconfigVM_Task") == 0
    got = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert got is not None
    assert got.ownership == theirs


@pytest.mark.parametrize("step", ["delete", "stamp"])
async def test_a_started_task_is_in_progress_when_read_and_its_end_wakes_the_key(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    step: str,
) -> None:
    vm = await driver.create(service, support.request(placement, markers))
    bios_uuid = vm.bios_uuid or ""
    if step == "stamp":
        await _strip_markers(service, vm.moid)
    method = "PowerOffVM_Task" if step == "delete" else "ReconfigVM_Task"
    await vcsim.control.set_delay(method, 3000, stage="task")
    key = ObjectKey(f"test/{step}")
    try:
        slot = await driver.slot(service, key)
        if step == "delete":
            task = (
                await service.start_delete(
                    datacenter="dc1", bios_uuid=bios_uuid, markers=markers, slot=slot
                )
            ).task
        else:
            _, task = await service.start_stamp(
                datacenter="dc1", bios_uuid=bios_uuid, markers=markers, slot=slot
            )
        assert task is not None
        assert (await service.task(task_ref=task)).running  # looked up while it runs
        done = await driver.ended(service, key, task)  # (woken by its end)
    finally:
        driver.waits.forget(key)
        await vcsim.control.clear_delays()
    assert (done.state, done.error) == (TaskState.SUCCESS, None)
    got = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert got is not None
    if step == "delete":
        assert got.power_state is PowerState.OFF
    else:
        assert got.ownership == markers


# --- helpers ----------------------------------------------------------------------------


async def _strip_markers(service: VsphereService, moid: str) -> None:
    """Make a VM look like one the Go operator created: no agentforge markers."""
    session = await service.session()
    ref = vms.ref_of(session, moid)
    keys = [k for k in await support.extra_config(service, moid) if k.startswith("agentforge.")]
    spec = vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key=k, value="") for k in keys])
    await tasks.run_task(
        session, lambda: ref.ReconfigVM_Task(spec=spec), subject=moid, action="strip"
    )
    assert not [k for k in await support.extra_config(service, moid) if k.startswith("agentforge.")]


async def _make_tag(service: VsphereService) -> str:
    session = await service.session()
    token = await provision._token(session, fresh=False)
    http = session.http()
    headers = {provision.HEADER: token}
    name = uuid.uuid4().hex[:8]
    async with http.post(
        "/rest/com/vmware/cis/tagging/category",
        json={
            "create_spec": {
                "name": f"cat-{name}",
                "description": "",
                "cardinality": "MULTIPLE",
                "associable_types": [],
            }
        },
        headers=headers,
    ) as resp:
        category = (await resp.json())["value"]
    async with http.post(
        "/rest/com/vmware/cis/tagging/tag",
        json={"create_spec": {"name": f"tag-{name}", "description": "", "category_id": category}},
        headers=headers,
    ) as resp:
        return str((await resp.json())["value"])


async def _attached_tags(service: VsphereService, moid: str) -> list[str]:
    session = await service.session()
    token = await provision._token(session, fresh=False)
    async with session.http().post(
        provision.ATTACH_PATH,
        params={"~action": "list-attached-tags"},
        json={"object_id": {"id": moid, "type": "VirtualMachine"}},
        headers={provision.HEADER: token},
    ) as resp:
        return list((await resp.json())["value"])
