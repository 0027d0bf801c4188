"""Is what the image service sent a bootable ISO? Decided on the bytes as they pass.

A download becomes boot media only when it is an ISO 9660 image a VM can boot:

* the primary volume descriptor at sector 16 (byte 32,768): type 1, `CD001`,
  version 1 (ECMA-119 8.4), i.e. `CD001` at bytes 32,769..32,773;
* the El Torito boot record at sector 17 (byte 34,816): type 0, `CD001`, version 1,
  boot system `EL TORITO SPECIFICATION` (El Torito 1.0, section 2.0, which fixes
  its place at sector 17): without it no firmware boots the image;
* a plausible size: at least `MIN_ISO_BYTES` (1 MiB: no discovery image is smaller;
  a real one is 100 MB and more), never more than the size cap (a volume declared
  over it is `SizeLimitExceeded` before the download goes on), and at least the
  volume its primary volume descriptor declares (logical blocks x block size): a
  shorter body is truncated.

The check needs the first `HEAD_BYTES` (36,864: the 32 KiB system area and the two
descriptors). The caller (`iso_upload`) reads exactly those before it creates
anything on the datastore, asks `IsoCheck.head`, and hands the same bytes on to
the upload, followed by the rest of the stream: one pass, no temporary local file,
nothing but the head held in memory. An HTML error page, a JSON error, an archive,
a tiny or truncated body is therefore refused before anything is uploaded; only a
body that passes the head and then ends short of its volume (a truncated chunked
download) is refused at its end (`IsoCheck.end`), and its temporary upload is
deleted like any failed upload's.

The refusal (`errors.IsoInvalid`) names the source in its shown form
(`redaction.redact_url`) and says what came back: status, content type and
encoding, size, and the first bytes as text when they are printable (redacted and
cut short: an error page may carry a token), else as hex with the format their
magic number names (gzip, zip...).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NoReturn

from agentforge.redaction import redact
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.iso import MIN_ISO_BYTES

__all__ = [
    "HEAD_BYTES",
    "MIN_ISO_BYTES",
    "SECTOR",
    "IsoCheck",
    "Served",
    "Volume",
    "describe_start",
]

SECTOR: Final = 2048
PVD_OFFSET: Final = 16 * SECTOR
"""32,768: the primary volume descriptor (ECMA-119: after the 16-sector system area)."""
BOOT_RECORD_OFFSET: Final = 17 * SECTOR
"""34,816: the El Torito boot record volume descriptor."""
HEAD_BYTES: Final = 18 * SECTOR
"""36,864: what the check reads before anything is uploaded."""

_STANDARD_ID: Final = b"CD001"
_EL_TORITO: Final = b"EL TORITO SPECIFICATION".ljust(32, b"\x00")
_SHOWN_TEXT: Final = 120
"""At most this many characters of a printable start are shown."""
_SHOWN_HEX: Final = 16

# Magic numbers of what an image service or a proxy sends instead of an ISO.
_MAGIC: Final[tuple[tuple[bytes, str], ...]] = (
    (b"\x1f\x8b", "a gzip stream"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\xfd7zXZ\x00", "an xz stream"),
    (b"BZh", "a bzip2 stream"),
    (b"\x28\xb5\x2f\xfd", "a zstd stream"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-zip archive"),
    (b"QFI\xfb", "a qcow2 disk image"),
    (b"KDMV", "a VMDK disk image"),
    (b"%PDF", "a PDF document"),
    (b"\x7fELF", "an ELF executable"),
)


@dataclass(frozen=True, slots=True)
class Served:
    """What the source said about the body it sends."""

    url: str
    """The source in its shown form (`redaction.redact_url`)."""
    status: int = 200
    content_type: str | None = None
    content_encoding: str | None = None
    declared: int | None = None
    """Content-Length, when the response has one."""

    def describe(self, *, size: str) -> str:
        kind = f"Content-Type {self.content_type}" if self.content_type else "no Content-Type"
        if self.content_encoding and self.content_encoding.lower() != "identity":
            kind += f", Content-Encoding {self.content_encoding}"
        return f"HTTP {self.status} with {kind}, {size}"


@dataclass(frozen=True, slots=True)
class Volume:
    """What the primary volume descriptor declares."""

    blocks: int
    block_size: int
    volume_id: str

    @property
    def size(self) -> int:
        return self.blocks * self.block_size


def describe_start(data: bytes) -> str:
    """The first bytes, as people can read them: text when printable, else hex."""
    if not data:
        return "an empty body"
    window = data[: _SHOWN_TEXT * 4]
    text = _printable(window)
    if text is not None:
        if len(data) > len(window) and len(text.split()) > 1:
            text = text.rsplit(None, 1)[0]  # a word cut by the window could be half a secret
        shown = " ".join(redact(text).split())
        more = "…" if len(shown) > _SHOWN_TEXT or len(data) > len(window) else ""
        return f'starting "{shown[:_SHOWN_TEXT]}{more}"'
    hexed = data[:_SHOWN_HEX].hex(" ")
    more = " …" if len(data) > _SHOWN_HEX else ""
    kind = next((name for magic, name in _MAGIC if data.startswith(magic)), None)
    return f"starting with bytes {hexed}{more}" + (f" ({kind})" if kind else "")


def _printable(data: bytes) -> str | None:
    """`data` as text when it is UTF-8 of printable characters and whitespace, else None
    (a character cut at the end of `data` is dropped)."""
    for cut in range(4):
        try:
            text = data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        ok = all(c.isprintable() or c in "\t\r\n\f\v" for c in text)
        return text if ok and text.strip() else None
    return None


class IsoCheck:
    """The verdict on one download: `head` on its first `HEAD_BYTES`, `end` on its size.

    Both raise `errors.IsoInvalid` with the whole story; neither keeps more than the
    head it was given.
    """

    def __init__(self, served: Served, *, min_bytes: int, max_bytes: int) -> None:
        self.served = served
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.volume: Volume | None = None

    def head(self, data: bytes, *, complete: bool) -> Volume:
        """Check the first bytes (`complete`: the body ended within them)."""
        served = self.served
        if complete:
            size = f"{len(data)} bytes"
        elif served.declared is not None:
            size = f"{served.declared} bytes"
        else:
            size = "no Content-Length"
        got = served.describe(size=size)
        if len(data) < HEAD_BYTES:
            self._refuse(
                "the body is too short to hold the ISO 9660 volume descriptors (its first "
                f"{HEAD_BYTES:,} bytes)",
                got=got,
                start=data,
            )
        pvd = data[PVD_OFFSET : PVD_OFFSET + SECTOR]
        if pvd[0] != 1 or pvd[1:6] != _STANDARD_ID or pvd[6] != 1:
            self._refuse(
                'no ISO 9660 primary volume descriptor (type 1, "CD001") at byte 32,768',
                got=got,
                start=data,
            )
        volume = _volume(pvd)
        if volume is None:
            self._refuse(
                "its primary volume descriptor declares no valid volume size "
                "(logical block size not 512, 1024 or 2048, or no blocks)",
                got=got,
            )
        boot = data[BOOT_RECORD_OFFSET : BOOT_RECORD_OFFSET + SECTOR]
        if boot[0] != 0 or boot[1:6] != _STANDARD_ID or boot[7:39] != _EL_TORITO:
            self._refuse(
                f"ISO 9660 volume {volume.volume_id or '(unnamed)'} has no El Torito boot record "
                "at sector 17: no firmware can boot it",
                got=got,
            )
        if volume.size > self.max_bytes:
            raise errors.SizeLimitExceeded(
                f"the ISO at {served.url} declares a volume of {volume.size} bytes, over the "
                f"limit of {self.max_bytes}; raise the limit or check the InfraEnv",
                subject=served.url,
            )
        if served.declared is not None:
            self._sizes(served.declared, volume, what="its Content-Length", got=got)
        elif complete:
            self._sizes(len(data), volume, what="the body", got=got)
        self.volume = volume
        return volume

    def end(self, total: int) -> None:
        """Check the whole body's size, once the source has ended it."""
        assert self.volume is not None, "head() first"
        got = self.served.describe(size=f"{total} bytes")
        self._sizes(total, self.volume, what="the body", got=got, streamed=True)

    def _sizes(
        self, size: int, volume: Volume, *, what: str, got: str, streamed: bool = False
    ) -> None:
        if size < self.min_bytes:
            self._refuse(
                f"{what} is {size} bytes, under the minimum of {self.min_bytes} for a boot image",
                got=got,
                streamed=streamed,
            )
        if size < volume.size:
            self._refuse(
                f"{what} is {size} bytes but ISO 9660 volume {volume.volume_id or '(unnamed)'} "
                f"declares {volume.size} ({volume.blocks} blocks of {volume.block_size}): the "
                "image is truncated",
                got=got,
                streamed=streamed,
            )

    def _refuse(
        self, problem: str, *, got: str, start: bytes | None = None, streamed: bool = False
    ) -> NoReturn:
        shown = f", {describe_start(start)}" if start is not None else ""
        kept = "its upload was discarded" if streamed else "nothing was uploaded"
        message = (
            f"the ISO source {self.served.url} did not serve a bootable ISO image: {problem}. "
            f"It answered {got}{shown}; {kept}. Check the InfraEnv's isoDownloadURL: an "
            "expired link or a proxy's login or error page answers like this"
        )
        raise errors.IsoInvalid(message, subject=self.served.url)


def _volume(pvd: bytes) -> Volume | None:
    """Volume space size (ECMA-119 8.4.8, both-endian at 80) and logical block size
    (8.4.12, both-endian at 128) of a primary volume descriptor; None when implausible."""
    (blocks,) = struct.unpack_from("<I", pvd, 80)
    (block_size,) = struct.unpack_from("<H", pvd, 128)
    if blocks == 0 or block_size not in (512, 1024, 2048):
        return None
    volume_id = pvd[40:72].decode("ascii", errors="replace").strip(" \x00")
    return Volume(blocks=blocks, block_size=block_size, volume_id=volume_id)
