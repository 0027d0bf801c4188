"""The ISO check: only a bootable ISO 9660 image of a plausible size becomes boot media.

Real images come from two independent writers: pycdlib (a maintained ISO library) and
the simulator's own builder (`sim.actors.iso9660`, which pycdlib must also read back).
What is refused are the shapes an image service or a proxy answers 200 with instead:
HTML and JSON error pages, archives, compressed images, empty, tiny and truncated
bodies, an ISO that cannot boot, one too small to be a discovery image.
"""

from __future__ import annotations

import gzip
import io
import json
import zipfile

import pycdlib
import pytest

from agentforge.vsphere import IsoInvalid, SizeLimitExceeded
from agentforge.vsphere.iso import upload
from agentforge.vsphere.iso.upload import HEAD_BYTES, MIN_ISO_BYTES, IsoCheck, Served
from sim.actors.iso9660 import build_iso
from sim.actors.isoserver import discovery_iso

URL = "https://images.example/images/3f9a?api_key=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl&arch=x86_64"
SHOWN = "https://images.example/images/3f9a?api_key=[REDACTED]&arch=x86_64"
MAX = 8 * 1024**3


def pycdlib_iso(*, bootable: bool, data_bytes: int = 2 * 1024 * 1024) -> bytes:
    """An image written by pycdlib: a data file, and with `bootable` an El Torito entry."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident="PYCDLIB_TEST")
    data = bytes(range(256)) * (data_bytes // 256)
    iso.add_fp(io.BytesIO(data), len(data), "/DATA.BIN;1")
    if bootable:
        boot = b"\xfa\xf4".ljust(2048, b"\x00")
        iso.add_fp(io.BytesIO(boot), len(boot), "/BOOT.IMG;1")
        iso.add_eltorito("/BOOT.IMG;1", "/BOOT.CAT;1")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def check(
    body: bytes,
    *,
    content_type: str | None = "application/octet-stream",
    declared: int | bool | None = True,
    encoding: str | None = None,
    min_bytes: int = MIN_ISO_BYTES,
    max_bytes: int = MAX,
    streamed: bool = False,
) -> upload.Volume:
    """Run the check as the upload does: the head, then (when it passed) the end."""
    length = len(body) if declared is True else (None if declared is False else declared)
    assert not isinstance(length, bool)
    served = Served(
        url=SHOWN, content_type=content_type, content_encoding=encoding, declared=length
    )
    checker = IsoCheck(served, min_bytes=min_bytes, max_bytes=max_bytes)
    head = body[:HEAD_BYTES]
    volume = checker.head(head, complete=not streamed and len(body) <= HEAD_BYTES)
    checker.end(len(body))
    return volume


def refusal(body: bytes, **kwargs: object) -> str:
    with pytest.raises(IsoInvalid) as caught:
        check(body, **kwargs)  # type: ignore[arg-type]
    message = str(caught.value)
    assert SHOWN in message
    assert "eyJ" not in message
    assert caught.value.subject == SHOWN
    return message


# --- real images pass ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [MIN_ISO_BYTES, MIN_ISO_BYTES + 17, 3 * MIN_ISO_BYTES + 2048])
def test_the_simulated_discovery_image_is_a_bootable_iso_pycdlib_reads(size: int) -> None:
    data = discovery_iso("ns/env/v1", size)
    assert len(data) == size
    assert data[32769:32774] == b"CD001"
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    try:
        assert iso.eltorito_boot_catalog is not None
        names = {c.file_identifier() for c in iso.list_children(iso_path="/")}
        assert {b"BOOT.CAT;1", b"BOOT.IMG;1", b"DISCOVERY.IMG;1"} <= names
    finally:
        iso.close()
    volume = check(data)
    assert volume.block_size == 2048
    assert volume.blocks == size // 2048


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_image_pycdlib_wrote_with_el_torito_passes(declared: bool) -> None:
    data = pycdlib_iso(bootable=True)
    volume = check(data, declared=declared, streamed=not declared)
    assert volume.size <= len(data)
    assert volume.volume_id == "PYCDLIB_TEST"


def test_the_content_type_does_not_matter_when_the_bytes_are_an_iso() -> None:
    check(discovery_iso("x"), content_type="text/html")
    check(discovery_iso("x"), content_type=None)


# --- what is not an ISO ---------------------------------------------------------------------


def test_an_html_login_page_is_refused_with_what_came_back() -> None:
    page = (
        b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body>Session "
        b"expired. <a href='https://sso.example/login?token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0"
        b".c2lnbmF0dXJl'>Sign in again</a></body></html>\n"
    )
    message = refusal(page, content_type="text/html; charset=utf-8")
    assert f"{len(page)} bytes" in message
    assert "Content-Type text/html; charset=utf-8" in message
    assert 'starting "<!DOCTYPE html> <html><head><title>Sign in</title>' in message
    assert "too short to hold the ISO 9660 volume descriptors" in message
    assert "nothing was uploaded" in message
    assert "isoDownloadURL" in message


def test_a_long_page_is_cut_short_in_the_message() -> None:
    page = b"<html>" + b"<p>Access denied by the corporate proxy.</p>\n" * 2000 + b"</html>"
    message = refusal(page, content_type="text/html")
    assert 'no ISO 9660 primary volume descriptor (type 1, "CD001") at byte 32,768' in message
    assert "<html><p>Access denied by the corporate proxy.</p>" in message
    assert '…"' in message
    assert len(message) < 1000


def test_a_json_error_is_refused_and_shown() -> None:
    body = json.dumps({"code": "401", "message": "image token expired"}).encode()
    message = refusal(body, content_type="application/json")
    assert 'starting "{"code": "401", "message": "image token expired"}"' in message
    assert "Content-Type application/json" in message


def test_an_empty_body_is_refused() -> None:
    message = refusal(b"", content_type=None)
    assert "an empty body" in message
    assert "no Content-Type" in message
    assert "0 bytes" in message


@pytest.mark.parametrize("cut", [1, 2048, 32768, 32773, HEAD_BYTES - 1])
def test_an_image_cut_before_its_volume_descriptors_is_refused(cut: int) -> None:
    message = refusal(discovery_iso("x")[:cut])
    assert "too short to hold the ISO 9660 volume descriptors" in message


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_an_image_cut_after_its_descriptors_is_refused_as_truncated(declared: bool) -> None:
    whole = discovery_iso("x", 2 * MIN_ISO_BYTES)
    message = refusal(whole[: MIN_ISO_BYTES + 4096], declared=declared, streamed=not declared)
    assert "the image is truncated" in message
    assert f"declares {len(whole)}" in message
    if not declared:
        assert "its upload was discarded" in message


def test_a_gzip_compressed_image_is_refused_and_named() -> None:
    packed = gzip.compress(discovery_iso("x"))
    message = refusal(packed, encoding="gzip")
    assert "(a gzip stream)" in message
    assert "Content-Encoding gzip" in message
    assert "starting with bytes 1f 8b" in message


def test_a_zip_archive_is_refused_and_named() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("discovery.iso", discovery_iso("x"))
    message = refusal(out.getvalue(), content_type="application/zip")
    assert "(a zip archive)" in message


def test_random_bytes_are_refused_and_shown_as_hex() -> None:
    body = bytes((i * 73 + 11) % 256 for i in range(MIN_ISO_BYTES))
    message = refusal(body)
    assert "starting with bytes 0b 54 9d" in message
    assert "no ISO 9660 primary volume descriptor" in message


def test_the_descriptor_must_be_exactly_at_32768() -> None:
    good = discovery_iso("x")
    shifted = good[:32767] + good[32768:] + b"\x00"  # every byte from 32,767 one earlier
    assert shifted[32768:32773] == b"CD001"
    refusal(shifted)
    wrong_type = bytearray(good)
    wrong_type[32768] = 2  # a supplementary descriptor where the primary must be
    refusal(bytes(wrong_type))


def test_an_iso_without_el_torito_is_refused_as_not_bootable() -> None:
    plain = build_iso(volume_id="PLAIN", size=MIN_ISO_BYTES, bootable=False)
    for image in (pycdlib_iso(bootable=False), plain):
        message = refusal(image)
        assert "has no El Torito boot record at sector 17: no firmware can boot it" in message
        assert "starting" not in message  # the bytes of a real ISO tell nothing more


def test_an_iso_below_the_floor_is_refused() -> None:
    small = build_iso(volume_id="SMALL", size=256 * 1024)
    message = refusal(small)
    assert f"is {256 * 1024} bytes, under the minimum of {MIN_ISO_BYTES}" in message
    message = refusal(small, declared=False, streamed=True)
    assert "the body is 262144 bytes, under the minimum" in message
    assert check(small, min_bytes=64 * 1024).size == 256 * 1024


def test_a_volume_over_the_size_cap_is_refused_before_the_download() -> None:
    with pytest.raises(SizeLimitExceeded) as caught:
        check(discovery_iso("x", 2 * MIN_ISO_BYTES), declared=False, max_bytes=MIN_ISO_BYTES)
    assert str(caught.value) == (
        f"the ISO at {SHOWN} declares a volume of {2 * MIN_ISO_BYTES} bytes, over the limit of "
        f"{MIN_ISO_BYTES}; raise the limit or check the InfraEnv"
    )


def test_a_descriptor_without_a_volume_size_is_refused() -> None:
    broken = bytearray(discovery_iso("x"))
    broken[32768 + 128 : 32768 + 132] = b"\x00\x00\x00\x00"  # logical block size 0
    assert "declares no valid volume size" in refusal(bytes(broken))


def test_the_start_is_text_only_when_printable() -> None:
    assert upload.describe_start(b"Forbidden\r\n") == 'starting "Forbidden"'
    assert upload.describe_start("Zugriff verweigert: ä".encode()) == (
        'starting "Zugriff verweigert: ä"'
    )
    # a multi-byte character cut by the head's end is dropped, not shown as garbage
    assert upload.describe_start("ok é".encode()[:-1]) == 'starting "ok"'
    assert upload.describe_start(b"\x00\x01abc").startswith("starting with bytes 00 01 61")
    assert upload.describe_start(b"   \n") == "starting with bytes 20 20 20 0a"
    assert "hunter2" not in upload.describe_start(b"password=hunter2 is wrong")


def test_a_word_cut_by_the_shown_window_is_dropped_not_half_shown() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlc2lnbmF0dXJl"
    page = ("x" * 450 + " " + jwt + " tail").encode()  # the window ends inside the JWT
    shown = upload.describe_start(page)
    assert "eyJ" not in shown
    assert shown.endswith('…"')
