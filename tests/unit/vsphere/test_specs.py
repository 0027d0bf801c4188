"""The specs sent to vCenter: hardware as asked, markers set, no automatic answers."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.vsphere.model.markers import OwnershipMarkers
from agentforge.vsphere.vm import build_specs as specs
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vmomi import vim

MARKERS = OwnershipMarkers(pool_namespace="ns", pool_name="p", pool_uid="u", vsphere_agent="a")
STANDARD = specs.NetworkTarget(name="VM Network", ref=vim.Network("network-1"))
DISTRIBUTED = specs.NetworkTarget(
    name="dvpg1",
    ref=vim.dvs.DistributedVirtualPortgroup("dvportgroup-1"),
    switch_uuid="50 2a",
    portgroup_key="dvportgroup-1",
)
ISO = "[iso-ds] agent-forge/ns/p/abc.iso"


def build(hardware: specs.Hardware | None = None, network: specs.NetworkTarget = STANDARD) -> Any:
    return specs.create_spec(
        name="vm-1",
        hardware=hardware or specs.Hardware(),
        network=network,
        datastore_name="ds1",
        datastore_ref=vim.Datastore("datastore-1"),
        iso_file=ISO,
        markers=MARKERS,
    )


def devices(spec: Any, kind: Any) -> list[Any]:
    return [c.device for c in spec.deviceChange if isinstance(c.device, kind)]


def extra(spec: Any) -> dict[str, str]:
    return {o.key: o.value for o in spec.extraConfig}


def test_create_spec_sets_disk_uuid_and_every_ownership_marker() -> None:
    values = extra(build())
    assert values["disk.enableUUID"] == "TRUE"
    assert MARKERS.to_extra_config().items() <= values.items()


def test_create_spec_carries_the_template_hardware() -> None:
    spec = build(specs.Hardware(cpus=8, memory_mib=32768, disk_gib=120, guest_id="otherGuest64"))
    assert (spec.numCPUs, spec.memoryMB, spec.guestId) == (8, 32768, "otherGuest64")
    (disk,) = devices(spec, vim.vm.device.VirtualDisk)
    assert disk.capacityInKB == 120 * 1024 * 1024
    assert disk.backing.fileName == "[ds1]"
    assert spec.files.vmPathName == "[ds1]"


@pytest.mark.parametrize(("eager", "thin"), [(False, True), (True, False)])
def test_disk_is_thin_unless_eagerly_scrubbed(eager: bool, thin: bool) -> None:
    (disk,) = devices(build(specs.Hardware(eager_scrub=eager)), vim.vm.device.VirtualDisk)
    assert disk.backing.thinProvisioned is thin
    assert disk.backing.eagerlyScrub is eager


@pytest.mark.parametrize(
    ("scsi", "cls"),
    [
        ("pvscsi", vim.vm.device.ParaVirtualSCSIController),
        ("lsilogic", vim.vm.device.VirtualLsiLogicController),
        ("lsilogic-sas", vim.vm.device.VirtualLsiLogicSASController),
        ("buslogic", vim.vm.device.VirtualBusLogicController),
    ],
)
def test_scsi_controller_type_is_honoured(scsi: str, cls: Any) -> None:
    spec = build(specs.Hardware(scsi_type=specs.ScsiType(scsi)))
    (controller,) = devices(spec, vim.vm.device.VirtualSCSIController)
    assert type(controller) is cls
    (disk,) = devices(spec, vim.vm.device.VirtualDisk)
    assert disk.controllerKey == controller.key


@pytest.mark.parametrize(
    ("nic", "cls"),
    [
        ("vmxnet3", vim.vm.device.VirtualVmxnet3),
        ("e1000", vim.vm.device.VirtualE1000),
        ("e1000e", vim.vm.device.VirtualE1000e),
    ],
)
def test_nic_adapter_type_is_honoured(nic: str, cls: Any) -> None:
    (card,) = devices(
        build(specs.Hardware(nic_type=specs.NicType(nic))), vim.vm.device.VirtualEthernetCard
    )
    assert type(card) is cls


@pytest.mark.parametrize("firmware", ["efi", "bios"])
def test_firmware_is_honoured(firmware: str) -> None:
    assert build(specs.Hardware(firmware=specs.Firmware(firmware))).firmware == firmware


def test_standard_port_group_backs_the_nic_by_name() -> None:
    (card,) = devices(build(network=STANDARD), vim.vm.device.VirtualEthernetCard)
    assert isinstance(card.backing, vim.vm.device.VirtualEthernetCard.NetworkBackingInfo)
    assert card.backing.deviceName == "VM Network"


def test_distributed_port_group_backs_the_nic_by_switch_and_key() -> None:
    (card,) = devices(build(network=DISTRIBUTED), vim.vm.device.VirtualEthernetCard)
    backing = card.backing
    assert isinstance(backing, vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo)
    assert (backing.port.switchUuid, backing.port.portgroupKey) == ("50 2a", "dvportgroup-1")


def test_cdrom_holds_the_iso_connected_at_power_on() -> None:
    (cd,) = devices(build(), vim.vm.device.VirtualCdrom)
    assert cd.backing.fileName == ISO
    assert cd.connectable.connected
    assert cd.connectable.startConnected


def test_unplaced_spec_leaves_files_for_storage_drs() -> None:
    spec = specs.create_spec(
        name="vm",
        hardware=specs.Hardware(),
        network=STANDARD,
        datastore_name=None,
        datastore_ref=None,
        iso_file=ISO,
        markers=MARKERS,
    )
    assert spec.files.vmPathName == ""


CDROM = facts.Cdrom(
    key=3000,
    controller_key=200,
    unit_number=0,
    kind=facts.MediumKind.ISO,
    backing_file=ISO,
    connected=True,
    start_connected=True,
)


def test_eject_spec_disconnects_and_clears_the_medium_of_that_device_only() -> None:
    spec = specs.eject_spec(CDROM)
    (change,) = spec.deviceChange
    assert change.operation == "edit"
    device = change.device
    assert device.key == 3000
    assert not isinstance(device.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
    assert device.connectable.connected is False
    assert device.connectable.startConnected is False


def _option_keys(spec: Any) -> list[str]:
    """Every extraConfig key `spec` would set."""
    return [str(o.key) for o in getattr(spec, "extraConfig", None) or []]


def _auto_answer_keys(spec: Any) -> list[str]:
    return [
        k
        for k in _option_keys(spec)
        if k.lower().startswith(("answer.", "tools.")) or "autoanswer" in k.lower()
    ]


def test_eject_spec_sets_no_automatic_answer_option() -> None:
    spec = specs.eject_spec(CDROM)
    assert _auto_answer_keys(spec) == []
    assert not spec.extraConfig


def test_create_and_stamp_specs_set_no_automatic_answer_option() -> None:
    assert _auto_answer_keys(build()) == []
    assert _auto_answer_keys(specs.stamp_spec(MARKERS)) == []


@pytest.mark.parametrize(
    "key", ["answer.msg.cdromdisconnect.locked", "tools.autoanswer", "msg.autoAnswer"]
)
def test_automatic_answer_options_are_refused_outright(key: str) -> None:
    with pytest.raises(ValueError, match="automatic-answer"):
        specs.options({key: "TRUE"})


def test_stamp_spec_writes_only_the_markers() -> None:
    assert set(_option_keys(specs.stamp_spec(MARKERS))) == set(MARKERS.to_extra_config())
