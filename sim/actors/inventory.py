"""What a booted discovery image reports about its host: the Agent's inventory.

Pure functions from a `VmFact` to the `status.inventory` the Assisted Installer
writes, shaped like a real VMware guest's report (field names as in the upstream
Agent CRD, which the API server prunes to):

- `systemVendor.serialNumber` is VMware's SMBIOS serial: `VMware-` and the 16 bytes
  of the BIOS UUID as hex pairs, 8 then a dash then 8 (`VMware-42 1c 5a 3b ...-...`),
  which is how the operator recognises the VM behind an Agent;
- one interface per vNIC with the VM's MAC, hostname = VM name (as DHCP would give),
  CPU count, memory and one disk per virtual disk plus the CD-ROM (`sr0`).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from sim.actors.vcenter import VmFact

__all__ = ["agent_name", "inventory", "serial_number"]

_MIB = 1024 * 1024
_AGENT_NAMESPACE = uuid.UUID("6f0c5f6e-3d5b-4c1e-9a51-4a1f0e7c2b10")
_CPU_FLAGS = ("fpu", "vme", "sse4_2", "avx", "avx2", "aes", "hypervisor", "x2apic", "lm", "nx")


def serial_number(bios_uuid: str) -> str:
    """VMware's SMBIOS serial for a BIOS UUID: `VMware-42 1c 5a 3b 4d 5e 6f 70-81 ...`."""
    digits = uuid.UUID(bios_uuid).hex
    pairs = [digits[i : i + 2] for i in range(0, 32, 2)]
    return f"VMware-{' '.join(pairs[:8])}-{' '.join(pairs[8:])}"


def agent_name(bios_uuid: str) -> str:
    """The Agent's name: the host id the Assisted Installer derives from the machine."""
    return str(uuid.uuid5(_AGENT_NAMESPACE, bios_uuid.lower()))


def _ipv4(vm: VmFact, nic: int) -> str:
    # Documentation range (RFC 5737): data in an inventory, never an address we talk to.
    host = int(hashlib.sha256(f"{vm.bios_uuid}/{nic}".encode()).hexdigest(), 16) % 250 + 2
    return f"192.0.2.{host}/24"


def inventory(vm: VmFact, *, report_time: str, iso_size: int = 0) -> dict[str, Any]:
    """The `status.inventory` of the host that is this VM."""
    interfaces = [
        {
            "name": f"ens{192 + 32 * i}",
            "macAddress": mac,
            "flags": ["up", "broadcast", "multicast", "running"],
            "ipV4Addresses": [_ipv4(vm, i)],
            "ipV6Addresses": [],
            "hasCarrier": True,
            "mtu": 1500,
            "speedMbps": 10000,
            "vendor": "0x15ad",
            "product": "0x07b0",
            "biosDevName": "",
        }
        for i, mac in enumerate(vm.macs)
    ]
    disks: list[dict[str, Any]] = [
        {
            "id": f"/dev/disk/by-path/pci-0000:03:00.0-scsi-0:0:{i}:0",
            "byPath": f"/dev/disk/by-path/pci-0000:03:00.0-scsi-0:0:{i}:0",
            "name": f"sd{chr(ord('a') + i)}",
            "path": f"/dev/sd{chr(ord('a') + i)}",
            "driveType": "HDD",
            "hctl": f"0:0:{i}:0",
            "model": "Virtual disk",
            "vendor": "VMware",
            "serial": f"6000c29{vm.bios_uuid.replace('-', '')[:25]}{i}",
            "sizeBytes": size,
            "bootable": False,
            "installationEligibility": {"eligible": size >= 20 * 1024**3, "notEligibleReasons": []},
        }
        for i, size in enumerate(vm.disk_bytes)
    ]
    if vm.iso_files:
        disks.append(
            {
                "id": "/dev/sr0",
                "name": "sr0",
                "path": "/dev/sr0",
                "driveType": "ODD",
                "model": "VMware SATA CD00",
                "vendor": "NECVMWar",
                "sizeBytes": iso_size,
                "bootable": True,
                "installationEligibility": {
                    "eligible": False,
                    "notEligibleReasons": ["Drive type is ODD, it must be one of HDD, SSD."],
                },
            }
        )
    memory = vm.memory_mib * _MIB
    return {
        "hostname": vm.name,
        "reportTime": report_time,
        "bmcAddress": "0.0.0.0",
        "bmcV6Address": "::/0",
        "boot": {"currentBootMode": "uefi"},
        "systemVendor": {
            "manufacturer": "VMware, Inc.",
            "productName": "VMware7,1",
            "serialNumber": serial_number(vm.bios_uuid),
            "virtual": True,
        },
        "cpu": {
            "architecture": "x86_64",
            "count": vm.num_cpus,
            "clockMegahertz": 2400,
            "modelName": "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
            "flags": list(_CPU_FLAGS),
        },
        "memory": {"physicalBytes": memory, "usableBytes": max(0, memory - 300 * _MIB)},
        "disks": disks,
        "interfaces": interfaces,
    }
