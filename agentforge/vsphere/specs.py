"""Pure builders of the vSphere specs the operator sends: create, eject, stamp.

No I/O here: every input is a value (names, morefs already resolved), so the specs
are unit-tested without a vCenter. The create spec follows what `govc vm.create`
sends (its own IDE controller for the CD-ROM, temporary negative device keys, the
disk pinned to the datastore Storage DRS recommended). No spec ever carries an
automatic-answer option (`answer.msg.*`, `tools.*autoanswer*`): answering VM
questions is a per-question decision (see `cdrom`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from agentforge.vsphere.facts import Cdrom
from agentforge.vsphere.markers import OwnershipMarkers
from agentforge.vsphere.vmomi import vim

Dev = vim.vm.device
Op = Dev.VirtualDeviceSpec.Operation

KEY_SCSI, KEY_DISK, KEY_IDE, KEY_CDROM, KEY_NIC = -101, -102, -103, -104, -105
FORBIDDEN_OPTION_PREFIXES = ("answer.", "tools.autoanswer", "msg.autoanswer")


class ScsiType(enum.StrEnum):
    PVSCSI = "pvscsi"
    LSILOGIC = "lsilogic"
    LSILOGIC_SAS = "lsilogic-sas"
    BUSLOGIC = "buslogic"


class Firmware(enum.StrEnum):
    EFI = "efi"
    BIOS = "bios"


class NicType(enum.StrEnum):
    VMXNET3 = "vmxnet3"
    E1000 = "e1000"
    E1000E = "e1000e"


_SCSI = {
    ScsiType.PVSCSI: Dev.ParaVirtualSCSIController,
    ScsiType.LSILOGIC: Dev.VirtualLsiLogicController,
    ScsiType.LSILOGIC_SAS: Dev.VirtualLsiLogicSASController,
    ScsiType.BUSLOGIC: Dev.VirtualBusLogicController,
}
_NIC = {
    NicType.VMXNET3: Dev.VirtualVmxnet3,
    NicType.E1000: Dev.VirtualE1000,
    NicType.E1000E: Dev.VirtualE1000e,
}


@dataclass(frozen=True, slots=True)
class Hardware:
    """The template of a VM (pool `spec.template` + `spec.vsphere` hardware fields)."""

    cpus: int = 4
    memory_mib: int = 16384
    disk_gib: int = 100
    eager_scrub: bool = False
    scsi_type: ScsiType = ScsiType.PVSCSI
    firmware: Firmware = Firmware.EFI
    guest_id: str = "rhel9_64Guest"
    nic_type: NicType = NicType.VMXNET3

    def __post_init__(self) -> None:
        if self.cpus < 1 or self.memory_mib < 4 or self.disk_gib < 1:
            raise ValueError("hardware needs cpus >= 1, memory_mib >= 4 and disk_gib >= 1")
        ScsiType(self.scsi_type)
        Firmware(self.firmware)
        NicType(self.nic_type)


@dataclass(frozen=True, slots=True)
class NetworkTarget:
    """A resolved network: a standard port group, or a distributed one (switch + key)."""

    name: str
    ref: Any
    switch_uuid: str | None = None
    portgroup_key: str | None = None

    @property
    def distributed(self) -> bool:
        return self.portgroup_key is not None


def datastore_path(datastore: str, path: str = "") -> str:
    """`[ds] path` as vSphere spells datastore paths."""
    return f"[{datastore}] {path}".rstrip() if path else f"[{datastore}]"


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
    scsi = _SCSI[ScsiType(hardware.scsi_type)](
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
    nic = _NIC[NicType(hardware.nic_type)](
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


def option_keys(spec: Any) -> list[str]:
    """Every extraConfig key a spec would set (for audits and tests)."""
    return [str(o.key) for o in getattr(spec, "extraConfig", None) or []]
