"""Identity rules: a VMware serial encodes the BIOS UUID; MACs compare in one spelling."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge import identity

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


# --- properties: every spelling the producers use, and what must never match ------------

HEX = "0123456789abcdef"
_bytes16 = st.binary(min_size=16, max_size=16)
_bytes6 = st.binary(min_size=6, max_size=6)
_pad = st.sampled_from(["", " ", "  ", "\t", "\n"])


def _dashed(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _cased(text: str, draw_case: list[bool]) -> str:
    return (
        "".join(c.upper() if up else c for c, up in zip(text, draw_case, strict=False))
        + text[len(draw_case) :]
    )


@st.composite
def uuid_spellings(draw: st.DrawFn) -> tuple[bytes, str]:
    """vCenter `config.uuid` (8-4-4-4-12) and its undashed form, in any case mix."""
    raw = draw(_bytes16)
    text = draw(st.sampled_from([_dashed(raw), raw.hex()]))
    case = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return raw, draw(_pad) + _cased(text, case) + draw(_pad)


@st.composite
def serial_spellings(draw: st.DrawFn) -> tuple[bytes, str]:
    """SMBIOS serials of VMware VMs as the Agent inventory's `systemVendor.serialNumber`
    reports them: `VMware-42 32 97 c6 d7 2e 28 bb-b2 79 12 09 c2 9a b7 2b` (the 8/8 split),
    the same without separators, and the prefix or digits in either case."""
    raw = draw(_bytes16)
    pairs = [raw[i : i + 1].hex() for i in range(16)]
    form = draw(st.sampled_from(["smbios", "bare", "spaced"]))
    if form == "smbios":
        body = " ".join(pairs[:8]) + "-" + " ".join(pairs[8:])
    elif form == "bare":
        body = "".join(pairs)
    else:
        body = " ".join(pairs)
    prefix = draw(st.sampled_from(["VMware-", "vmware-", "VMWARE-"]))
    case = draw(st.lists(st.booleans(), min_size=len(body), max_size=len(body)))
    return raw, draw(_pad) + prefix + _cased(body, case) + draw(_pad)


@st.composite
def mac_spellings(draw: st.DrawFn) -> tuple[bytes, str]:
    """MACs from vCenter's `hardware.device` and the inventory's interfaces (colons) and
    the Go operator's status (hyphens), in any case mix."""
    raw = draw(_bytes6)
    sep = draw(st.sampled_from([":", "-"]))
    text = sep.join(raw[i : i + 1].hex() for i in range(6))
    case = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return raw, draw(_pad) + _cased(text, case) + draw(_pad)


@given(uuid_spellings())
def test_every_uuid_spelling_canonicalises_to_the_same_bytes(case: tuple[bytes, str]) -> None:
    raw, text = case
    assert identity.normalize_uuid(text) == _dashed(raw)
    assert identity.require_uuid(text) == _dashed(raw)


@given(serial_spellings())
def test_every_vmware_serial_yields_the_bios_uuid_of_config_uuid(case: tuple[bytes, str]) -> None:
    raw, serial = case
    uuid = identity.bios_uuid_from_serial(serial)
    assert uuid == _dashed(raw)
    assert identity.normalize_uuid(uuid) == uuid, "the serial's UUID equals vCenter's config.uuid"


@given(mac_spellings())
def test_every_mac_spelling_canonicalises_to_lower_colons(case: tuple[bytes, str]) -> None:
    raw, text = case
    canonical = ":".join(raw[i : i + 1].hex() for i in range(6))
    assert identity.normalize_mac(text) == canonical
    assert identity.require_mac(text) == canonical
    assert identity.hyphenated_mac(text) == canonical.replace(":", "-")
    assert identity.normalize_mac(identity.hyphenated_mac(text)) == canonical


@given(_bytes16, _bytes16)
def test_different_uuids_never_compare_equal(a: bytes, b: bytes) -> None:
    assert (identity.normalize_uuid(a.hex()) == identity.normalize_uuid(b.hex())) == (a == b)


_CANON_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CANON_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


@settings(max_examples=300)
@given(
    st.one_of(
        st.text(),
        uuid_spellings().map(lambda c: c[1]),
        serial_spellings().map(lambda c: c[1]),
        mac_spellings().map(lambda c: c[1]),
        st.text(alphabet="0123456789abcdefABCDEF:- .{}VMwarex", max_size=60),
    )
)
def test_any_text_is_canonical_or_rejected_never_guessed(text: str) -> None:
    """Whatever comes in, the result is None or a canonical form made of exactly the
    input's hex digits, in order (no digit invented, dropped or reordered)."""
    digits = "".join(c for c in text.lower() if c in HEX)
    uuid = identity.normalize_uuid(text)
    if uuid is not None:
        assert _CANON_UUID.fullmatch(uuid)
        assert uuid.replace("-", "") == digits
    from_serial = identity.bios_uuid_from_serial(text)
    if from_serial is not None:
        after_prefix = text.strip().lower()[len("vmware-") :]
        assert _CANON_UUID.fullmatch(from_serial)
        assert from_serial.replace("-", "") == "".join(c for c in after_prefix if c in HEX)
    mac = identity.normalize_mac(text)
    if mac is not None:
        assert _CANON_MAC.fullmatch(mac)
        assert mac.replace(":", "") == digits


@given(uuid_spellings())
def test_canonical_forms_are_fixed_points(case: tuple[bytes, str]) -> None:
    once = identity.normalize_uuid(case[1])
    assert once is not None
    assert identity.normalize_uuid(once) == once


@given(_bytes16, st.sampled_from(["{%s}", "urn:uuid:%s", "%s0", "0%s", "%s-"]))
def test_wrapped_or_padded_uuids_are_rejected(raw: bytes, wrap: str) -> None:
    """Braces (registry GUIDs) and URNs come from no producer we read: not accepted."""
    assert identity.normalize_uuid(wrap % _dashed(raw)) is None
    with pytest.raises(ValueError, match="UUID"):
        identity.require_uuid(wrap % _dashed(raw))


@given(_bytes16, st.integers(min_value=0, max_value=31))
def test_a_uuid_missing_or_gaining_a_digit_is_rejected(raw: bytes, at: int) -> None:
    text = raw.hex()
    assert identity.normalize_uuid(text[:at] + text[at + 1 :]) is None
    assert identity.normalize_uuid(text[:at] + "a" + text[at:]) is None
    assert identity.bios_uuid_from_serial("VMware-" + text[:at] + text[at + 1 :]) is None


@given(_bytes16, st.sampled_from(["Dell-", "HP-", "", "VMware", "VMware_", "QEMU-"]))
def test_serials_without_the_vmware_prefix_are_rejected(raw: bytes, prefix: str) -> None:
    """Another vendor's serial may be 32 hex digits too: it is not a VMware BIOS UUID."""
    assert identity.bios_uuid_from_serial(prefix + raw.hex()) is None


@given(_bytes6, st.sampled_from([".", " ", "", ":-"]))
def test_other_mac_spellings_are_rejected(raw: bytes, sep: str) -> None:
    """Dotted (Cisco), spaced, bare or mixed-separator MACs come from no producer we read."""
    octets = [raw[i : i + 1].hex() for i in range(6)]
    if sep == ":-":
        text = ":".join(octets[:3]) + "-" + "-".join(octets[3:])
    elif sep == ".":
        text = ".".join("".join(octets[i : i + 2]) for i in range(0, 6, 2))
    else:
        text = sep.join(octets)
    assert identity.normalize_mac(text) is None
    with pytest.raises(ValueError, match="MAC"):
        identity.require_mac(text)


@given(_bytes16)
def test_byte_swapped_product_uuid_is_a_different_identity(raw: bytes) -> None:
    """Linux's `product_uuid` swaps the first three fields (SMBIOS >= 2.6). It is not
    folded into the VM's UUID: a match must be exact, so the swap stays a mismatch
    (unless the swap changes nothing, i.e. the bytes are palindromic per field)."""
    swapped = raw[3::-1] + raw[5:3:-1] + raw[7:5:-1] + raw[8:]
    same = identity.normalize_uuid(swapped.hex()) == identity.normalize_uuid(raw.hex())
    assert same == (swapped == raw)
