"""Streaming one ISO to a datastore under its content address (`iso` decides when).

The first 36 KiB are read and checked (`iso_check`: an ISO 9660 image with an El
Torito boot record, of a plausible size) before anything is created on the
datastore; a body that is not one is refused with nothing uploaded. Then the bytes,
those 36 KiB first, go to `<prefix>/.upload-<uuid>.iso` in one pass, counted and hashed on the
way, and are then moved to `<prefix>/<sha256>.iso`, or deleted when that file already
exists. The promises and the cleanup rules are in the `iso` module's doc; this module
keeps them: the name is the hash of exactly the bytes counted and sent, and the
temporary file is deleted on every failure once the datastore can no longer write it.
Errors name the source by its shown form (`redaction.redact_url`: the image service's
API key, in the path or the query, is never part of a message).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from agentforge.redaction import redact_url
from agentforge.vsphere import metrics
from agentforge.vsphere.iso import bootable as iso_check
from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.model import errors
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
    # Nothing is created on the datastore before the head passed (`iso_check`).
    served = iso_check.Served(
        url=redact_url(str(resp.url)),
        status=resp.status,
        content_type=resp.headers.get("Content-Type"),
        content_encoding=resp.headers.get("Content-Encoding"),
        declared=declared,
    )
    check = iso_check.IsoCheck(served, min_bytes=limits.min_bytes, max_bytes=limits.max_bytes)
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
    """The first `iso_check.HEAD_BYTES` of the body (fewer when it ends before), and
    whether it ended within them."""
    head = bytearray()
    try:
        while len(head) < iso_check.HEAD_BYTES:
            chunk = await resp.content.read(iso_check.HEAD_BYTES - len(head))
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
