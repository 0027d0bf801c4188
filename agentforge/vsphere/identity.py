"""Canonical forms of the identities that tie a VM to its Agent: BIOS UUID and MAC.

vCenter, the Agent inventory and the Go operator each spell them differently
(`42 1c 5a ...` in SMBIOS serials, upper-case or hyphenated MACs). Comparisons are
only meaningful between canonical forms: UUIDs as lower-case 8-4-4-4-12, MACs as
lower-case colon-separated octets.
"""

from __future__ import annotations

import re

_HEX = re.compile(r"[0-9a-f]+")


def normalize_uuid(value: str) -> str:
    """`421C5A3B-...`, `421c5a3b...` or `42 1c 5a ...` -> `421c5a3b-xxxx-xxxx-xxxx-xxxxxxxxxxxx`."""
    text = value.strip().lower()
    if text.startswith("vmware-"):
        text = text[len("vmware-") :]
    digits = "".join(ch for ch in text if ch not in " -{}")
    if len(digits) != 32 or not _HEX.fullmatch(digits):
        raise ValueError(f"not a UUID: {value!r}")
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def uuid_from_serial(serial: str) -> str:
    """The BIOS UUID behind a VMware SMBIOS serial (`VMware-42 1c 5a ... -...`)."""
    return normalize_uuid(serial)


def normalize_mac(value: str) -> str:
    """`00-50-56-AB-CD-EF`, `0050.56ab.cdef` or `00:50:56:ab:cd:ef` -> `00:50:56:ab:cd:ef`."""
    digits = "".join(ch for ch in value.strip().lower() if ch not in ":-. ")
    if len(digits) != 12 or not _HEX.fullmatch(digits):
        raise ValueError(f"not a MAC address: {value!r}")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))
