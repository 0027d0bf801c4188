"""How a VM and the Agent it registered are recognised as the same machine: the one
canonical BIOS UUID and MAC, for `api/`, `vsphere/` and the reconcilers alike.

The SMBIOS serial an Agent reports for a VMware VM encodes the VM's BIOS UUID
(`config.uuid`), and MAC addresses are spelled three ways across the systems
involved (vSphere and Assisted Installer with colons in either case, the Go
operator's status with hyphens). These functions turn every spelling into one
canonical form so that identities compare with `==`; anything that is not a
well-formed identity yields None, never a guess (`require_uuid`/`require_mac` raise
instead, for callers that hold a value vCenter or our own status already vetted).

Accepted: UUIDs as 32 hex digits, 8-4-4-4-12 dashes optional, either case, surrounding
whitespace; VMware SMBIOS serials (`VMware-` prefix, any case, hex pairs separated by
spaces and dashes); MACs as six two-digit octets joined by all colons or all hyphens,
either case. Rejected, on purpose: braces, dotted (`0050.56aa.bbcc`) and bare MACs,
mixed separators, serials of other vendors, anything of another length. The
byte-swapped first three UUID fields that Linux shows in `product_uuid` are a
*different* string and are not matched here: nothing the operator compares comes
from there (the Agent inventory's serial keeps vCenter's byte order).

Pure: the standard library only, so every layer may import it (import-linter
contract "identity is pure").
"""

from __future__ import annotations

import re
from typing import Final

_HEX32 = re.compile(r"[0-9a-f]{32}")
_MAC = re.compile(r"[0-9a-f]{2}([:-])[0-9a-f]{2}(\1[0-9a-f]{2}){4}")
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
VMWARE_SERIAL_PREFIX: Final = "vmware-"


def _group_uuid(hex32: str) -> str:
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


def bios_uuid_from_serial(serial: str | None) -> str | None:
    """The BIOS UUID encoded in a VMware SMBIOS serial, lower-case 8-4-4-4-12.

    `VMware-42 1c 5a 3b 00 11 22 33-44 55 66 77 88 99 aa bb` -> strip the `VMware-`
    prefix, spaces and dashes; the 32 hex digits that remain are the UUID. Serials
    of other vendors, or of a different length, give None.
    """
    if not serial:
        return None
    text = serial.strip().lower()
    if not text.startswith(VMWARE_SERIAL_PREFIX):
        return None
    digits = text[len(VMWARE_SERIAL_PREFIX) :].replace(" ", "").replace("-", "")
    if not _HEX32.fullmatch(digits):
        return None
    return _group_uuid(digits)


def normalize_uuid(value: str | None) -> str | None:
    """A UUID in lower-case 8-4-4-4-12 form (dashes optional on input), else None."""
    if not value:
        return None
    text = value.strip().lower()
    if not _UUID.fullmatch(text):
        return None
    return _group_uuid(text.replace("-", ""))


def normalize_mac(value: str | None) -> str | None:
    """A MAC address as lower-case colon-separated octets, else None.

    Accepts `00:50:56:AA:BB:CC` and the Go operator's `00-50-56-aa-bb-cc`; mixed
    separators are rejected.
    """
    if not value:
        return None
    text = value.strip().lower()
    if not _MAC.fullmatch(text):
        return None
    canonical = text.replace("-", ":")
    # already canonical: the caller's own string, so a record keeps no copy of it
    return value if canonical == value else canonical


def hyphenated_mac(value: str | None) -> str | None:
    """A MAC address in the Go operator's status form, `00-50-56-aa-bb-cc`."""
    mac = normalize_mac(value)
    return mac.replace(":", "-") if mac else None


def require_uuid(value: str) -> str:
    """`normalize_uuid`, raising ValueError instead of returning None."""
    uuid = normalize_uuid(value)
    if uuid is None:
        raise ValueError(f"not a UUID: {value!r}")
    return uuid


def require_mac(value: str) -> str:
    """`normalize_mac`, raising ValueError instead of returning None."""
    mac = normalize_mac(value)
    if mac is None:
        raise ValueError(f"not a MAC address: {value!r}")
    return mac
