"""What an ISO transfer is asked for and what it yields (pure: no aiohttp, no I/O).

`IsoLimits` bounds a transfer (size, redirects, timeouts, chunking); `Validators`
are the source's HTTP validators used to revalidate without downloading;
`IsoRecord`/`IsoResult` are what a run learned. The pipeline is `vsphere.iso`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

MIN_ISO_BYTES: Final = 1024 * 1024
"""A smaller body is no discovery image (`vsphere/iso/upload.py`)."""


@dataclass(frozen=True, slots=True)
class Validators:
    etag: str | None = None
    last_modified: str | None = None
    content_length: int | None = None

    @property
    def usable(self) -> bool:
        return bool(self.etag or self.last_modified)

    @classmethod
    def of(cls, headers: Any) -> Validators:
        length = headers.get("Content-Length")
        return cls(
            etag=headers.get("ETag"),
            last_modified=headers.get("Last-Modified"),
            content_length=int(length) if length and length.isdigit() else None,
        )

    def same_as(self, other: Validators) -> bool:
        """Same resource version: equal strong ETag, else equal Last-Modified and length.

        Two different ETags (weak or strong) are two versions, whatever Last-Modified
        says: it has a resolution of one second, and a new image of the same size made
        within that second would otherwise pass for the old one.
        """
        if self.etag and other.etag:
            if self.etag != other.etag:
                return False
            if not self.etag.startswith("W/"):
                return True
        return bool(
            self.last_modified
            and self.last_modified == other.last_modified
            and self.content_length is not None
            and self.content_length == other.content_length
        )

    def contradicts(self, other: Validators) -> bool:
        """Both carry an ETag and they differ, even weakly compared (RFC 9110 8.8.3.2)."""
        return bool(
            self.etag
            and other.etag
            and self.etag.removeprefix("W/") != other.etag.removeprefix("W/")
        )


STALE_UPLOAD_FLOOR = timedelta(hours=1)
STALE_UPLOAD_MARGIN = 10


@dataclass(frozen=True, slots=True)
class IsoLimits:
    max_bytes: int = 8 * 1024**3
    max_redirects: int = 5
    """Redirects followed per request, each only to https (`iso_http.get`)."""
    min_bytes: int = MIN_ISO_BYTES
    """A smaller body is no boot image (`iso/upload.py`); neither is a cached record as small."""
    connect_timeout_seconds: float = 30.0
    read_timeout_seconds: float = 120.0
    chunk_bytes: int = 1024 * 1024
    attempts: int = 2
    """Passes of `iso.ensure_iso` when vSphere fails transiently (never for the source)."""
    abort_recheck_seconds: tuple[float, ...] = (0.25, 0.5, 1.0)
    """Pauses before looking again for the temporary file of an aborted PUT."""

    @property
    def stale_upload_age(self) -> timedelta:
        """How long a `.upload-*.iso` file must have gone unwritten before it cannot be
        the file of a running upload (of this or another replica) under these limits.

        A running upload writes its temporary file at least every read timeout: it
        forwards each chunk as the PUT pulls it, and a source silent for longer fails
        the download, after which the pipeline deletes the file itself. After the last
        write only a digest, one HEAD and one move follow. The age is counted from the
        modification time the datastore reports (the last write), against the
        operator's clock: the margin (x10, at least an hour) covers those calls and
        clock skew between the hosts and the operator. Should it still hit a running
        upload (a datastore stamping the time at creation only or that stopped reading
        the PUT, a replica with much longer timeouts), that upload's move fails and is
        retried: only temporary names are deleted by age, never a content-addressed one.
        """
        idle = self.connect_timeout_seconds + self.read_timeout_seconds
        return max(STALE_UPLOAD_FLOOR, timedelta(seconds=idle * STALE_UPLOAD_MARGIN))


@dataclass(frozen=True, slots=True)
class IsoRecord:
    """What a previous run learned: enough to revalidate without downloading."""

    sha256: str
    size: int
    validators: Validators


@dataclass(frozen=True, slots=True)
class IsoResult:
    sha256: str
    size: int
    path: str  # relative to the datastore root: <prefix>/<sha256>.iso
    backing: str  # [datastore] <prefix>/<sha256>.iso, the CD-ROM backing file name
    validators: Validators
    bytes_downloaded: int
    reused: bool

    @property
    def record(self) -> IsoRecord:
        return IsoRecord(sha256=self.sha256, size=self.size, validators=self.validators)
