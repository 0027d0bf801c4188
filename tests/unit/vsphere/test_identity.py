"""Identities compare only in canonical form: lower-case UUIDs and colon MACs."""

from __future__ import annotations

import pytest

from agentforge.vsphere import identity


@pytest.mark.parametrize(
    "raw",
    ["00-50-56-AB-CD-EF", "00:50:56:ab:cd:ef", "0050.56ab.cdef", " 00:50:56:AB:CD:EF "],
)
def test_every_mac_spelling_normalizes_to_lower_case_colons(raw: str) -> None:
    assert identity.normalize_mac(raw) == "00:50:56:ab:cd:ef"


def test_a_vmware_smbios_serial_yields_the_bios_uuid() -> None:
    serial = "VMware-42 1c 5a 3b 11 22 33 44-55 66 77 88 99 aa bb cc"
    assert identity.uuid_from_serial(serial) == "421c5a3b-1122-3344-5566-778899aabbcc"


def test_upper_case_uuid_is_lowered() -> None:
    assert (
        identity.normalize_uuid("421C5A3B-1122-3344-5566-778899AABBCC")
        == "421c5a3b-1122-3344-5566-778899aabbcc"
    )


@pytest.mark.parametrize("raw", ["", "zz:50:56:ab:cd:ef", "00:50:56:ab:cd"])
def test_malformed_macs_are_rejected(raw: str) -> None:
    with pytest.raises(ValueError, match="MAC"):
        identity.normalize_mac(raw)


@pytest.mark.parametrize("raw", ["", "421c5a3b", "g21c5a3b-1122-3344-5566-778899aabbcc"])
def test_malformed_uuids_are_rejected(raw: str) -> None:
    with pytest.raises(ValueError, match="UUID"):
        identity.normalize_uuid(raw)
