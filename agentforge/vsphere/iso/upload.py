"""Streaming one ISO to a datastore under its content address (`pipeline` decides when).

The first 36 KiB are read and checked (`IsoCheck` below: an ISO 9660 image with an El
Torito boot record, of a plausible size) before anything is created on the
datastore; a body that is not one is refused with nothing uploaded. Then the bytes,
those 36 KiB first, go to `<prefix>/.upload-<uuid>.iso` in one pass, counted and hashed on the
way, and are then moved to `<prefix>/<sha256>.iso`, or deleted when that file already
exists. The promises and the cleanup rules are in `pipeline`'s doc; this module
keeps them: the name is the hash of exactly the bytes counted and sent, and the
temporary file is deleted on every failure once the datastore can no longer write it.
Errors name the source by its shown form (`redaction.redact_url`: the image service's
API key, in the path or the query, is never part of a message).

Is what the image service sent a bootable ISO? Decided on the bytes as they pass.

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
descriptors). The upload (`upload` above) reads exactly those before it creates
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

import asyncio
import contextlib
import hashlib
import re
import struct
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

import aiohttp

from agentforge.redaction import redact, redact_url
from agentforge.vsphere import metrics
from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.iso import MIN_ISO_BYTES
from agentforge.vsphere.session.vcenter_session import Session

if TYPE_CHECKING:
    from agentforge.vsphere.model.iso import IsoLimits


TEMP_NAME = re.compile(r"\.upload-[0-9a-f]{32}\.iso")
"""The name (under the prefix) of an upload in progress: `.upload-<uuid4 hex>.iso`."""


def final_path(prefix: str, sha256: str) -> str:
    return f"{prefix.strip('/')}/{sha256}.iso"


def temp_path(prefix: str) -> str:
    return f"{prefix.strip('/')}/.upload-{uuid.uuid4().hex}.iso"


@dataclass(frozen=True, slots=True)
class Uploaded:
    sha256: str
    size: int
    path: str
    """Relative to the datastore root: `<prefix>/<sha256>.iso`."""
    reused: bool
    """The file was already there: the upload was discarded."""


async def transfer(
    session: Session,
    *,
    resp: aiohttp.ClientResponse,
    declared: int | None,
    where: datastore.Location,
    prefix: str,
    limits: IsoLimits,
) -> Uploaded:
    """Stream `resp` (its Content-Length `declared`, if any) to `<prefix>/<sha256>.iso`."""
    if declared is not None and declared > limits.max_bytes:
        raise errors.SizeLimitExceeded(
            f"the ISO at {redact_url(str(resp.url))} is {declared} bytes, over the limit of "
            f"{limits.max_bytes} bytes",
            subject=redact_url(str(resp.url)),
            limit=limits.max_bytes,
            size=declared,
        )
    # Nothing is created on the datastore before the head passed (`IsoCheck.head`).
    served = Served(
        url=redact_url(str(resp.url)),
        status=resp.status,
        content_type=resp.headers.get("Content-Type"),
        content_encoding=resp.headers.get("Content-Encoding"),
        declared=declared,
    )
    check = IsoCheck(served, min_bytes=limits.min_bytes, max_bytes=limits.max_bytes)
    head, complete = await _read_head(resp)
    check.head(head, complete=complete)
    hasher = ChunkHasher()
    counted = [0]
    source_failure: list[errors.VsphereError] = []

    async def chunks() -> AsyncIterator[bytes]:
        # Errors raised here reach us wrapped by the PUT; remember the real cause.
        # A chunk is counted and handed to the hasher right before it is yielded, so
        # what was counted, hashed and sent is always the same sequence of chunks.
        # The PUT may stop pulling (and cancel this generator) as soon as the datastore
        # has answered, which it does once it holds Content-Length bytes: the hash of
        # the last chunk may then still be pending; `hasher.hexdigest()` waits for it.
        # A chunked body ends at a failure instead of raising it: the PUT then
        # completes and is answered, which orders the delete after the server's last
        # write (see the module doc). A Content-Length body cannot end early.
        try:
            async for chunk in _after(head, resp.content.iter_chunked(limits.chunk_bytes)):
                if counted[0] + len(chunk) > limits.max_bytes:
                    raise errors.SizeLimitExceeded(
                        f"the ISO at {redact_url(str(resp.url))} exceeds the limit of "
                        f"{limits.max_bytes} bytes; upload abandoned",
                        subject=redact_url(str(resp.url)),
                        limit=limits.max_bytes,
                    )
                await hasher.add(chunk)
                counted[0] += len(chunk)
                yield chunk
            check.end(counted[0])  # the source ended the body: is it the whole volume?
        except errors.VsphereError as exc:
            source_failure.append(exc)
            if declared is None:
                return
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = errors.IsoDownloadFailed(
                f"download of the ISO from {redact_url(str(resp.url))} broke off after "
                f"{counted[0]} bytes: {type(exc).__name__}",
                subject=redact_url(str(resp.url)),
            )
            source_failure.append(failure)
            if declared is None:
                return
            raise failure from None

    prefix = prefix.strip("/")
    await _mkdir_once(session, where, prefix)
    temp = temp_path(prefix)
    answered = False  # the PUT is over on the server's side: one delete is final
    try:
        try:
            await datastore.upload(session, where=where, path=temp, body=chunks(), size=declared)
            answered = True
        except errors.VsphereError as exc:
            answered = not isinstance(exc, datastore.UploadAborted)
            if source_failure:
                raise source_failure[0] from None
            raise
        _check_complete(
            got=counted[0],
            declared=declared,
            url=str(resp.url),
            failure=source_failure[0] if source_failure else None,
        )
        sha = await hasher.hexdigest(expected_bytes=counted[0])
        final = final_path(prefix, sha)
        reused = await datastore.exists(session, where=where, path=final)
        if not reused:
            try:
                await datastore.move(session, where=where, source=temp, destination=final)
            except errors.AlreadyExists:
                reused = True
        if reused:  # the result stands whatever this delete says; the pruner is the backstop
            await discard(session, where, temp, recheck=())
    except BaseException:
        recheck = () if answered else limits.abort_recheck_seconds
        await asyncio.shield(discard(session, where, temp, recheck=recheck))
        raise
    metrics.iso_op("upload", "discarded_duplicate" if reused else "success")
    return Uploaded(sha256=sha, size=counted[0], path=final, reused=reused)


async def _read_head(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The first `HEAD_BYTES` of the body (fewer when it ends before), and
    whether it ended within them."""
    head = bytearray()
    try:
        while len(head) < HEAD_BYTES:
            chunk = await resp.content.read(HEAD_BYTES - len(head))
            if not chunk:
                return bytes(head), True
            metrics.ISO_BYTES_DOWNLOADED.inc(len(chunk))
            head += chunk
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise errors.IsoDownloadFailed(
            f"download of the ISO from {redact_url(str(resp.url))} broke off after "
            f"{len(head)} bytes: {type(exc).__name__}",
            subject=redact_url(str(resp.url)),
        ) from None
    return bytes(head), resp.content.at_eof()


async def _after(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`head`, then the rest of the body (each chunk counted as downloaded)."""
    if head:
        yield head
    async for chunk in rest:
        metrics.ISO_BYTES_DOWNLOADED.inc(len(chunk))
        yield chunk


class ChunkHasher:
    """sha256 of chunks in order, each hashed on a worker thread (hashlib releases the
    GIL) while the event loop sends it on; the next chunk waits for the previous hash.

    The pending hash is shielded: when the generator feeding the PUT is cancelled (the
    PUT ended before pulling again), the executor job is neither cancelled nor lost, and
    `hexdigest` waits for it. It refuses to name a digest over other bytes than those
    counted, so a file is never named after a hash of part of its content.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pending: asyncio.Future[None] | None = None
        self._hashed = 0

    def _update(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self._hashed += len(chunk)

    async def add(self, chunk: bytes) -> None:
        if self._pending is not None:
            await asyncio.shield(self._pending)
        loop = asyncio.get_running_loop()
        self._pending = loop.run_in_executor(None, self._update, chunk)

    async def hexdigest(self, *, expected_bytes: int) -> str:
        if self._pending is not None:
            await asyncio.shield(self._pending)
        if self._hashed != expected_bytes:
            raise errors.TransientError(
                f"the ISO digest covers {self._hashed} of {expected_bytes} bytes; not naming "
                "the upload after it",
                subject="iso digest",
            )
        return self._digest.hexdigest()


def _check_complete(
    *, got: int, declared: int | None, url: str, failure: errors.VsphereError | None
) -> None:
    """Raise the source's failure (a chunked body ended at it), or a short body's."""
    if failure is not None:
        raise failure
    if declared is not None and got != declared:
        raise errors.IsoDownloadFailed(
            f"the ISO download from {redact_url(url)} ended after {got} of {declared} bytes",
            subject=redact_url(url),
        )


async def discard(
    session: Session, where: datastore.Location, temp: str, *, recheck: Sequence[float]
) -> None:
    """Delete the temporary file. After an aborted PUT (`recheck` not empty) a delete that
    found nothing may have come before the server created the file: look again after
    each pause and delete what appeared. A file once seen cannot appear again (the
    server creates it once); whatever comes later still is left to the pruner."""
    with contextlib.suppress(Exception):
        if await datastore.delete(session, where=where, path=temp):
            return
    for pause in recheck:
        await asyncio.sleep(pause)
        with contextlib.suppress(Exception):
            if await datastore.exists(session, where=where, path=temp):
                await datastore.delete(session, where=where, path=temp)
                return


async def _mkdir_once(session: Session, where: datastore.Location, prefix: str) -> None:
    async def make() -> bool:
        await datastore.mkdir(session, where=where, path=prefix)
        return True

    await session.cache.directories.get_or_make((where, prefix), make)


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
