"""The values a VM is built from (pure: no pyVmomi): its hardware template, the
resolved network it joins, datastore paths, and the option keys no spec may carry.

`vsphere/vm/build_specs.py` turns them into pyVmomi config specs.

Datastores and their files as values (pure): a datastore of a datacenter by name,
and a file found on it (`vsphere/iso/datastore_files.py` does the I/O).

Where a pool's VMs go (pure values): what the user wrote, what resolving it found,
and every problem found on the way (`vsphere/vm/resolve_placement.py` resolves and checks).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentforge.vsphere.model import errors

FORBIDDEN_OPTION_PREFIXES = ("answer.", "tools.autoanswer", "msg.autoanswer")
"""No spec ever carries an automatic-answer option: answering VM questions is a
per-question decision (see `vsphere/vm/cdrom.py`)."""


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


@dataclass(frozen=True, slots=True)
class Location:
    """A datastore of a datacenter, by name."""

    datacenter: str
    datastore: str

    def path(self, relative: str) -> str:
        return datastore_path(self.datastore, relative.strip("/"))


@dataclass(frozen=True, slots=True)
class DatastoreFile:
    path: str  # relative to the datastore root
    size: int | None
    modified: datetime | None


@dataclass(frozen=True, slots=True)
class Placement:
    datacenter: str
    resource_pool: str
    folder: str
    network: str
    datastore_cluster: str
    iso_datastore: str
    datastore: str = ""
    """A single datastore for the disks instead of `datastore_cluster` (a failure domain
    may name one); empty: the datastore cluster."""
    host: str = ""
    """The ESXi host to create the VM on, below the datacenter's host folder
    (`<cluster>/<host>`: a spread pool's chosen host); empty: DRS picks."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a placement: which object, what, and how to fix it."""

    subject: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message} ({self.fix})"


class PlacementInvalid(errors.InvalidSpec):
    """The placement has problems; `problems` lists all of them."""

    def __init__(self, problems: list[Problem]) -> None:
        text = "; ".join(str(p) for p in problems) or "placement could not be resolved"
        super().__init__(text, subject=problems[0].subject if problems else "placement")
        self.problems = problems


@dataclass(frozen=True, slots=True)
class ResolvedPlacement:
    placement: Placement
    datacenter: Any
    vm_root: Any
    folder: Any | None
    resource_pool: Any
    network: NetworkTarget
    storage_pod: Any
    pod_datastores: Mapping[str, str]
    iso_datastore: Any
    host: Any = None
    """The chosen HostSystem (`placement.host`), else None."""
    free_storage: int = 0
    """Free bytes for the disks when resolved: the datastore's, or the sum over the
    datastore cluster's accessible datastores (a spread pool's tie-break between domains;
    as old as the resolution, so `VsphereService.inspect_storage` reads it fresh)."""
