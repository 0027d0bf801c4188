"""Identity rules: a VMware serial encodes the BIOS UUID; MACs compare in one spelling."""

from __future__ import annotations

import pytest

from agentforge.api import identity

UUID = "423297c6-d72e-28bb-b279-1209c29ab72b"


@pytest.mark.parametrize(
    "serial",
    [
        "VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7 2b",
        "VMware-42 32 97 C6 D7 2E 28 BB-B2 79 12 09 C2 9A B7 2B",
        "vmware-423297c6d72e28bbb2791209c29ab72b",
        "  VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7 2b  ",
    ],
)
def test_vmware_serial_yields_the_bios_uuid_grouped_8_4_4_4_12(serial: str) -> None:
    assert identity.bios_uuid_from_serial(serial) == UUID


@pytest.mark.parametrize(
    "serial",
    [
        None,
        "",
        "VMware-",
        "VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7",
        "VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7 2b 00",
        "VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7 zz",
        "CZJ1234567",
        "423297c6-d72e-28bb-b279-1209c29ab72b",
    ],
)
def test_other_serials_yield_no_uuid(serial: str | None) -> None:
    assert identity.bios_uuid_from_serial(serial) is None


@pytest.mark.parametrize(
    "mac",
    ["00:50:56:aa:bb:cc", "00:50:56:AA:BB:CC", "00-50-56-aa-bb-cc", " 00-50-56-AA-bb-CC "],
)
def test_mac_addresses_normalize_to_lower_case_colon_form(mac: str) -> None:
    assert identity.normalize_mac(mac) == "00:50:56:aa:bb:cc"
    assert identity.hyphenated_mac(mac) == "00-50-56-aa-bb-cc"


@pytest.mark.parametrize(
    "mac", [None, "", "00:50:56:aa:bb", "00:50-56:aa:bb:cc", "0050.56aa.bbcc", "00:50:56:aa:bb:gg"]
)
def test_malformed_mac_addresses_normalize_to_none(mac: str | None) -> None:
    assert identity.normalize_mac(mac) is None
    assert identity.hyphenated_mac(mac) is None


@pytest.mark.parametrize("value", [UUID, UUID.upper(), UUID.replace("-", "")])
def test_uuids_normalize_to_lower_case_8_4_4_4_12(value: str) -> None:
    assert identity.normalize_uuid(value) == UUID


def test_malformed_uuid_normalizes_to_none() -> None:
    assert identity.normalize_uuid("not-a-uuid") is None
    assert identity.normalize_uuid(None) is None
