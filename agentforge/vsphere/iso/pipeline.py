"""The ISO pipeline: InfraEnv image -> sha256 -> content-addressed file on a datastore.

Promises:
- one pass, no temporary local file, constant memory: the source response is read
  chunk by chunk by an async generator that hashes and counts each chunk and hands
  it to the datastore PUT only when the PUT asks for more (backpressure);
- the name `<prefix>/<sha256>.iso` is known only at the end, so bytes land under
  `<prefix>/.upload-<uuid>.iso` and are then moved to the final name, or deleted
  when the final file already exists; the temporary file is deleted on any failure,
  and only once the datastore can no longer write it (see "cleanup" below); what a
  killed process leaves behind is removed by the pruner once older than
  `IsoLimits.stale_upload_age`;
- the name is true: the digest covers exactly the bytes counted and sent, and is read
  only once the last chunk's hash has finished (the datastore answers the PUT as soon
  as it holds Content-Length bytes, which can be before the body generator is pulled
  again, and aiohttp then cancels it: the pending hash must not be lost with it);
- a cheap revalidation first: with the previous validators (ETag, Last-Modified,
  Content-Length) a conditional GET is sent; 304 (not naming another ETag), or a 200
  carrying the same strong validators (two different ETags are never the same
  version), plus the final file present on the datastore -> nothing is downloaded;
- only a bootable ISO 9660 image becomes a file (`iso_check`, on the bytes as they
  pass): anything else (an HTML login page, a JSON error, an archive, a tiny or
  truncated body) raises `IsoInvalid` and leaves nothing on the datastore; a
  record of a file below the size floor (cached before images were checked) is
  never reused;
- TLS to the source is verified (the system store plus an optional CA bundle), the
  environment's proxy settings are honoured and redirects are followed only to
  https (`iso_http`); size, redirects and timeouts are limits; bytes downloaded are
  counted (metric and result).
- errors name the source by its shown form (`redaction.redact_url`): the image
  service's API key, in the path (`/byapikey/<JWT>/`) or the query, is in no message.

Cleanup and the server's ordering: the file service creates the file when it starts
on the PUT, which can be after the client has given up on it (vcsim first resolves the
datastore; a proxy may queue the request). A delete issued after an *aborted* PUT can
therefore run before the file exists, and the file appears after it. So a failure of
the source (over the size limit, broken off) ends a chunked body instead of aborting
it: the PUT completes, and its answer comes after the server's last write, so the
delete that follows is final. A PUT that had to be aborted (a Content-Length body cut
short, a timeout, a cancellation) is deleted at once and, when that delete found
nothing, looked at again `IsoLimits.abort_recheck_seconds` later and deleted if it
appeared (once seen, it cannot appear again: the server creates it once).

This module decides whether the datastore's copy is current (revalidation) and
reports the result; the streaming upload itself is `iso_upload`; the value types
(`IsoLimits`, `Validators`, `IsoRecord`, `IsoResult`) are `model.iso`, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
import tenacity

from agentforge.redaction import redact_url
from agentforge.vsphere import metrics
from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.iso import image_http as iso_http
from agentforge.vsphere.iso.image_http import CaBundle, CaBundleFile, Proxies
from agentforge.vsphere.iso.upload import final_path, transfer
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.iso import (
    IsoLimits,
    IsoRecord,
    IsoResult,
    Validators,
)
from agentforge.vsphere.session.vcenter_session import Session


@dataclass(frozen=True, slots=True)
class IsoSource:
    """Where the ISO is and how to reach it (see `iso_http`)."""

    url: str
    ca_bundle: CaBundle | None = None
    """Trusted in addition to the system store."""
    proxies: Proxies = field(default_factory=Proxies)
    """The environment's proxy settings (`Proxies.from_environ`); none by default."""
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class IsoAccess:
    """How this process reaches image services (from its flags and environment)."""

    limits: IsoLimits = field(default_factory=IsoLimits)
    proxies: Proxies = field(default_factory=Proxies)
    ca_bundle: CaBundleFile | None = None
    """Extra trusted CAs, read again when the file changes."""

    def source(self, url: str) -> IsoSource:
        """The `IsoSource` of `url`; `IsoSourceError` when the CA bundle is unreadable."""
        bundle = self.ca_bundle.current() if self.ca_bundle is not None else None
        return IsoSource(url=url, ca_bundle=bundle, proxies=self.proxies)


async def ensure_iso(
    session: Session,
    *,
    source: IsoSource,
    where: datastore.Location,
    prefix: str,
    previous: IsoRecord | None = None,
    limits: IsoLimits | None = None,
) -> IsoResult:
    """Make sure the source's current ISO is on the datastore; return where it is.

    What the source refused is raised (`IsoSourceError`; `IsoDownloadFailed` when it
    may answer next time), never retried here: a retry fetches the image again, and
    the caller backs off per source URL. A transient fault of vSphere (a session that
    expired under the upload) is retried, up to `limits.attempts` passes in all."""
    limits = limits or IsoLimits()
    pause = session.options.retry_initial_seconds
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(max(1, limits.attempts)),
        wait=tenacity.wait_incrementing(start=pause, increment=pause),
        retry=tenacity.retry_if_exception(_vsphere_transient),
        reraise=True,
    )
    with metrics.counted("iso", "ensure") as outcome:
        async for attempt in retrying:
            with attempt:
                result = await _ensure(
                    session,
                    source=source,
                    where=where,
                    prefix=prefix,
                    previous=previous,
                    limits=limits,
                )
                outcome.result = "reused" if result.reused else "uploaded"
                return result
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def _vsphere_transient(exc: BaseException) -> bool:
    return isinstance(exc, errors.TransientError) and not isinstance(exc, errors.IsoSourceError)


async def _ensure(
    session: Session,
    *,
    source: IsoSource,
    where: datastore.Location,
    prefix: str,
    previous: IsoRecord | None,
    limits: IsoLimits,
) -> IsoResult:
    headers = {"Accept-Encoding": "identity"}
    if previous is not None and previous.validators.usable:
        if previous.validators.etag:
            headers["If-None-Match"] = previous.validators.etag
        if previous.validators.last_modified:
            headers["If-Modified-Since"] = previous.validators.last_modified
    async with iso_http.client(source, limits) as client:
        try:
            async with iso_http.get(client, source, headers=headers, limits=limits) as resp:
                validators = Validators.of(resp.headers)
                if resp.status == 304 and previous is not None:
                    # A 304 naming another ETag than the one asked about is no answer.
                    if not previous.validators.contradicts(validators):
                        kept = await _reuse(
                            session,
                            where=where,
                            prefix=prefix,
                            previous=previous,
                            validators=validators,
                            limits=limits,
                        )
                        if kept is not None:
                            metrics.iso_op("revalidate", "unchanged")
                            return kept
                elif resp.status == 200:
                    if previous is not None and previous.validators.same_as(validators):
                        kept = await _reuse(
                            session,
                            where=where,
                            prefix=prefix,
                            previous=previous,
                            validators=validators,
                            limits=limits,
                        )
                        if kept is not None:
                            metrics.iso_op("revalidate", "unchanged")
                            return kept
                    return await _upload(
                        session,
                        resp=resp,
                        validators=validators,
                        where=where,
                        prefix=prefix,
                        limits=limits,
                    )
                else:
                    raise _source_error(source, resp.status)
            # 304 but the file is gone from the datastore (or the 304 contradicted the
            # stored ETag): fetch it again, unconditionally.
            async with iso_http.get(
                client, source, headers={"Accept-Encoding": "identity"}, limits=limits
            ) as resp:
                if resp.status != 200:
                    raise _source_error(source, resp.status)
                validators = Validators.of(resp.headers)
                return await _upload(
                    session,
                    resp=resp,
                    validators=validators,
                    where=where,
                    prefix=prefix,
                    limits=limits,
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise errors.IsoDownloadFailed(
                f"download of the ISO from {redact_url(source.url)} failed: {type(exc).__name__}",
                subject=redact_url(source.url),
            ) from None


async def _reuse(
    session: Session,
    *,
    where: datastore.Location,
    prefix: str,
    previous: IsoRecord,
    validators: Validators,
    limits: IsoLimits,
) -> IsoResult | None:
    if previous.size < limits.min_bytes:
        return None  # cached before images were checked, and too small to be one: fetch again
    path = final_path(prefix, previous.sha256)
    if not await datastore.exists(session, where=where, path=path):
        return None
    merged = Validators(
        etag=validators.etag or previous.validators.etag,
        last_modified=validators.last_modified or previous.validators.last_modified,
        content_length=validators.content_length or previous.validators.content_length,
    )
    return IsoResult(
        sha256=previous.sha256,
        size=previous.size,
        path=path,
        backing=where.path(path),
        validators=merged,
        bytes_downloaded=0,
        reused=True,
    )


async def _upload(
    session: Session,
    *,
    resp: aiohttp.ClientResponse,
    validators: Validators,
    where: datastore.Location,
    prefix: str,
    limits: IsoLimits,
) -> IsoResult:
    done = await transfer(
        session,
        resp=resp,
        declared=validators.content_length,
        where=where,
        prefix=prefix,
        limits=limits,
    )
    return IsoResult(
        sha256=done.sha256,
        size=done.size,
        path=done.path,
        backing=where.path(done.path),
        validators=validators,
        bytes_downloaded=done.size,
        reused=done.reused,
    )


def _source_error(source: IsoSource, status: int) -> errors.VsphereError:
    where = redact_url(source.url)
    if status in (429, 500, 502, 503, 504):
        return errors.IsoDownloadFailed(
            f"the ISO source {where} answered HTTP {status}", subject=where
        )
    return errors.IsoSourceError(
        f"the ISO source {where} answered HTTP {status}; check the InfraEnv's isoDownloadURL",
        subject=where,
    )


__all__ = [
    "IsoAccess",
    "IsoLimits",
    "IsoRecord",
    "IsoResult",
    "IsoSource",
    "Validators",
    "ensure_iso",
    "final_path",
]
