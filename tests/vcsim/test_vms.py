"""VMs: created idempotently with markers, read in one round trip, deleted only if ours."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from prometheus_client import REGISTRY

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
    VsphereError,
    VsphereService,
    tags,
    tasks,
    vms,
)
from agentforge.vsphere.vmomi import vim
from sim.actors.waiting import eventually
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
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    hardware: Hardware,
    network: str,
) -> None:
    where = dataclasses.replace(placement, network=network)
    vm = await service.create_vm(request=support.request(where, markers, hardware=hardware))
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
    service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    req = support.request(placement, markers)
    first = await service.create_vm(request=req)
    second = await service.create_vm(request=req)
    assert second.moid == first.moid
    assert await support.vm_names_in_folder(service, placement) == [req.name]


async def test_a_same_named_vm_of_another_owner_is_reported_and_left_alone(
    service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    theirs = dataclasses.replace(markers, pool_uid=str(uuid.uuid4()))
    req = support.request(placement, theirs)
    existing = await service.create_vm(request=req)
    with pytest.raises(AlreadyExists, match="not ours"):
        await service.create_vm(request=dataclasses.replace(req, markers=markers))
    again = await service.vm_by_uuid(datacenter="dc1", bios_uuid=existing.bios_uuid or "")
    assert again is not None
    assert again.ownership == theirs
    assert again.power_state is PowerState.ON


async def test_a_vm_half_built_by_a_failed_tag_is_removed(
    service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    req = support.request(
        placement, markers, tag_ids=("urn:vmomi:InventoryServiceTag:missing:GLOBAL",)
    )
    with pytest.raises(VsphereError, match="tag"):
        await service.create_vm(request=req)
    assert await support.vm_names_in_folder(service, placement) == []


async def test_a_vm_half_built_by_a_failed_power_on_is_removed(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.session()
    await vcsim.control.fail_next_tasks("PowerOnVM_Task", 1, "InsufficientResourcesFault")
    with pytest.raises(VsphereError, match="power on"):
        await service.create_vm(request=support.request(placement, markers))
    assert await support.vm_names_in_folder(service, placement) == []
    assert (await vcsim.control.counters())["faults_injected"] == 1


async def test_a_cancelled_create_leaves_the_half_built_vm_for_the_next_attempt(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    request = dataclasses.replace(support.request(placement, markers), bios_uuid=str(uuid.uuid4()))
    await vcsim.control.set_delay("PowerOnVM_Task", 3000, stage="task")
    mark = await vcsim.control.last_seq()
    create = asyncio.create_task(service.create_vm(request=request))

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
    resumed = await service.create_vm(request=request)  # the next leader, from the checkpoint
    assert resumed.moid == found.moid
    assert resumed.power_state is PowerState.ON


async def _methods_since(vcsim: Any, mark: int) -> list[str]:
    return [str(e.get("method") or e["path"]) for e in await vcsim.control.request_log(since=mark)]


async def test_a_transient_task_failure_is_retried(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.session()
    await vcsim.control.fail_next_tasks("PowerOnVM_Task", 2, "TaskInProgress")
    vm = await service.create_vm(request=support.request(placement, markers))
    assert vm.power_state is PowerState.ON
    assert (await vcsim.control.counters())["faults_injected"] == 2


async def test_tags_are_attached_by_id(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    tag_id = await _make_tag(service)
    vm = await service.create_vm(request=support.request(placement, markers, tag_ids=(tag_id,)))
    assert tag_id in await _attached_tags(service, vm.moid)


async def test_facts_of_many_vms_cost_one_request(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    made = await asyncio.gather(
        *(service.create_vm(request=support.request(placement, markers)) for _ in range(4))
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
    service: VsphereService,
    registry: Any,
    credentials: Any,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await service.create_vm(request=support.request(placement, markers))
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
    service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    vm = await service.create_vm(request=support.request(placement, markers))
    uuid_ = vm.bios_uuid or ""
    deleted_before = _metric("agent_forge_vsphere_vm_operations_total", "delete", "success")
    assert await service.delete_vm(datacenter="dc1", bios_uuid=uuid_, markers=markers) is True
    assert _metric("agent_forge_vsphere_vm_operations_total", "delete", "success") == (
        deleted_before + 1
    )
    assert await service.vm_by_uuid(datacenter="dc1", bios_uuid=uuid_) is None
    assert await service.delete_vm(datacenter="dc1", bios_uuid=uuid_, markers=markers) is False


@pytest.mark.parametrize("owner", ["unmarked", "foreign"])
async def test_delete_refuses_a_vm_that_is_not_ours_and_touches_nothing(
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    owner: str,
) -> None:
    other = dataclasses.replace(markers, vsphere_agent="someone-else")
    vm = await service.create_vm(request=support.request(placement, other))
    if owner == "unmarked":
        await _strip_markers(service, vm.moid)
    before = await vcsim.control.counters()
    with pytest.raises(OwnershipMismatch):
        await service.delete_vm(datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers)
    after = await vcsim.control.counters()
    for method in ("PowerOffVM_Task", "Destroy_Task", "ReconfigVM_Task"):
        assert support.method_delta(before, after, method) == 0
    again = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert again is not None
    assert again.power_state is PowerState.ON


async def test_stamping_adopts_an_unmarked_vm_and_is_idempotent(
    service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    vm = await service.create_vm(request=support.request(placement, markers))
    await _strip_markers(service, vm.moid)
    stamped = await service.stamp_markers(
        datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers
    )
    assert stamped.ownership == markers
    again = await service.stamp_markers(
        datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers
    )
    assert again.ownership == markers


async def test_stamping_refuses_to_overwrite_another_owners_markers(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    theirs = dataclasses.replace(markers, pool_name="other-pool")
    vm = await service.create_vm(request=support.request(placement, theirs))
    before = await vcsim.control.counters()
    with pytest.raises(OwnershipMismatch):
        await service.stamp_markers(datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers)
    after = await vcsim.control.counters()
    assert support.method_delta(before, after, "ReconfigVM_Task") == 0
    got = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert got is not None
    assert got.ownership == theirs


# --- helpers ----------------------------------------------------------------------------


def _metric(name: str, operation: str, result: str) -> float:
    value = REGISTRY.get_sample_value(name, {"operation": operation, "result": result})
    return value or 0.0


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
    token = await tags._token(session, fresh=False)
    http = session.http()
    headers = {tags.HEADER: token}
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
    token = await tags._token(session, fresh=False)
    async with session.http().post(
        tags.ATTACH_PATH,
        params={"~action": "list-attached-tags"},
        json={"object_id": {"id": moid, "type": "VirtualMachine"}},
        headers={tags.HEADER: token},
    ) as resp:
        return list((await resp.json())["value"])
