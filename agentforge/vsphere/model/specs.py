"""The values a VM is built from (pure: no pyVmomi): its hardware template, the
resolved network it joins, datastore paths, and the option keys no spec may carry.

`vsphere.specs` turns them into pyVmomi config specs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

FORBIDDEN_OPTION_PREFIXES = ("answer.", "tools.autoanswer", "msg.autoanswer")
"""No spec ever carries an automatic-answer option: answering VM questions is a
per-question decision (see `vsphere.cdrom`)."""


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
