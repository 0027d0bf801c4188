"""Pure builders of the vSphere specs the operator sends: create, eject, stamp.

No I/O here: every input is a value (names, morefs already resolved; the value types
live in `model.specs` and are re-exported here), so the specs are unit-tested without
a vCenter. The create spec follows what `govc vm.create`
sends (its own IDE controller for the CD-ROM, temporary negative device keys, the
disk pinned to the datastore Storage DRS recommended). No spec ever carries an
automatic-answer option (`answer.msg.*`, `tools.*autoanswer*`): answering VM
questions is a per-question decision (see `cdrom`).
"""

from __future__ import annotations

from typing import Any

from agentforge.vsphere.model.facts import Cdrom
from agentforge.vsphere.model.markers import OwnershipMarkers
from agentforge.vsphere.model.specs import (
    FORBIDDEN_OPTION_PREFIXES,
    Firmware,
    Hardware,
    NetworkTarget,
    NicType,
    ScsiType,
    datastore_path,
)
from agentforge.vsphere.vmomi import Lazy, vim

Dev: Any = Lazy("vim.vm.device")
Op: Any = Lazy("vim.vm.device.VirtualDeviceSpec.Operation")

KEY_SCSI, KEY_DISK, KEY_IDE, KEY_CDROM, KEY_NIC = -101, -102, -103, -104, -105


_SCSI = {  # the device class names, read from pyVmomi when a spec is built
    ScsiType.PVSCSI: "ParaVirtualSCSIController",
    ScsiType.LSILOGIC: "VirtualLsiLogicController",
    ScsiType.LSILOGIC_SAS: "VirtualLsiLogicSASController",
    ScsiType.BUSLOGIC: "VirtualBusLogicController",
}
_NIC = {
    NicType.VMXNET3: "VirtualVmxnet3",
    NicType.E1000: "VirtualE1000",
    NicType.E1000E: "VirtualE1000e",
}


def create_spec(
    *,
    name: str,
    hardware: Hardware,
    network: NetworkTarget,
    datastore_name: str | None,
    datastore_ref: Any,
    iso_file: str,
    markers: OwnershipMarkers,
    bios_uuid: str | None = None,
) -> Any:
    """The `VirtualMachineConfigSpec` of a new VM booting `iso_file` (`[ds] path`).

    With `datastore_name=None` the files are left unplaced: that is the spec Storage
    DRS is asked to place (`RecommendDatastores`). `bios_uuid`, when given, becomes
    `config.uuid`, so a caller that recorded it first can find the VM after a crash.
    """
    location = datastore_path(datastore_name) if datastore_name else ""
    scsi = getattr(Dev, _SCSI[ScsiType(hardware.scsi_type)])(
        key=KEY_SCSI, busNumber=0, sharedBus=Dev.VirtualSCSIController.Sharing.noSharing
    )
    disk = Dev.VirtualDisk(
        key=KEY_DISK,
        controllerKey=KEY_SCSI,
        unitNumber=0,
        capacityInKB=hardware.disk_gib * 1024 * 1024,
        backing=Dev.VirtualDisk.FlatVer2BackingInfo(
            diskMode="persistent",
            thinProvisioned=not hardware.eager_scrub,
            eagerlyScrub=hardware.eager_scrub,
            fileName=location,
            datastore=datastore_ref,
        ),
    )
    ide = Dev.VirtualIDEController(key=KEY_IDE, busNumber=0)
    cdrom = Dev.VirtualCdrom(
        key=KEY_CDROM,
        controllerKey=KEY_IDE,
        unitNumber=0,
        backing=Dev.VirtualCdrom.IsoBackingInfo(fileName=iso_file),
        connectable=Dev.VirtualDevice.ConnectInfo(
            connected=True, startConnected=True, allowGuestControl=True
        ),
    )
    nic = getattr(Dev, _NIC[NicType(hardware.nic_type)])(
        key=KEY_NIC,
        addressType="generated",
        backing=nic_backing(network),
        connectable=Dev.VirtualDevice.ConnectInfo(
            connected=True, startConnected=True, allowGuestControl=True
        ),
    )
    changes = [
        Dev.VirtualDeviceSpec(operation=Op.add, device=scsi),
        Dev.VirtualDeviceSpec(
            operation=Op.add, fileOperation=Dev.VirtualDeviceSpec.FileOperation.create, device=disk
        ),
        Dev.VirtualDeviceSpec(operation=Op.add, device=ide),
        Dev.VirtualDeviceSpec(operation=Op.add, device=cdrom),
        Dev.VirtualDeviceSpec(operation=Op.add, device=nic),
    ]
    extra = {"disk.enableUUID": "TRUE", **markers.to_extra_config()}
    return vim.vm.ConfigSpec(
        name=name,
        guestId=hardware.guest_id,
        numCPUs=hardware.cpus,
        memoryMB=hardware.memory_mib,
        firmware=str(hardware.firmware),
        uuid=bios_uuid,
        files=vim.vm.FileInfo(vmPathName=location),
        extraConfig=options(extra),
        deviceChange=changes,
    )


def nic_backing(network: NetworkTarget) -> Any:
    """Standard port groups back a NIC by name; distributed ones by switch and key."""
    if network.distributed:
        return Dev.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
            port=vim.dvs.PortConnection(
                switchUuid=network.switch_uuid, portgroupKey=network.portgroup_key
            )
        )
    return Dev.VirtualEthernetCard.NetworkBackingInfo(deviceName=network.name, network=network.ref)


def eject_spec(cdrom: Cdrom) -> Any:
    """Disconnect one CD-ROM and leave it without medium (a client device, not connected).

    Only the device is edited: no extraConfig, so no automatic answer can sneak in.
    """
    device = Dev.VirtualCdrom(
        key=cdrom.key,
        controllerKey=cdrom.controller_key,
        unitNumber=cdrom.unit_number,
        backing=Dev.VirtualCdrom.RemotePassthroughBackingInfo(
            deviceName="", exclusive=False, useAutoDetect=False
        ),
        connectable=Dev.VirtualDevice.ConnectInfo(
            connected=False, startConnected=False, allowGuestControl=True
        ),
    )
    return vim.vm.ConfigSpec(deviceChange=[Dev.VirtualDeviceSpec(operation=Op.edit, device=device)])


def stamp_spec(markers: OwnershipMarkers) -> Any:
    """Write the ownership markers (and nothing else) into a VM's extraConfig."""
    return vim.vm.ConfigSpec(extraConfig=options(markers.to_extra_config()))


def options(values: dict[str, str]) -> list[Any]:
    for key in values:
        if key.lower().startswith(FORBIDDEN_OPTION_PREFIXES) or "autoanswer" in key.lower():
            raise ValueError(f"refusing to set automatic-answer option {key}")
    return [vim.option.OptionValue(key=k, value=v) for k, v in values.items()]


__all__ = [
    "FORBIDDEN_OPTION_PREFIXES",
    "KEY_CDROM",
    "KEY_DISK",
    "KEY_IDE",
    "KEY_NIC",
    "KEY_SCSI",
    "Firmware",
    "Hardware",
    "NetworkTarget",
    "NicType",
    "ScsiType",
    "create_spec",
    "datastore_path",
    "eject_spec",
    "nic_backing",
    "options",
    "stamp_spec",
]
