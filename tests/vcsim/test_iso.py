"""The ISO pipeline: streamed, hashed, content-addressed, revalidated without downloading."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from agentforge.reconcilers.infra import iso_cache
from agentforge.vsphere import (
    IsoDownloadFailed,
    IsoInvalid,
    IsoLimits,
    IsoSource,
    Location,
    SizeLimitExceeded,
    Validators,
    VsphereService,
)
from agentforge.vsphere.iso import datastore_files as datastore
from sim.actors.isoserver import discovery_iso
from sim.actors.waiting import eventually
from sim.vcsim import Vcsim, VcsimControl

pytestmark = pytest.mark.vcsim

ISO_DS = Location(datacenter="dc1", datastore="iso-ds")


@dataclass
class Source:
    """A tiny image service: one ISO, ETag validators, and ways to misbehave."""

    body: bytes
    etag: str = '"v1"'
    honour_conditionals: bool = True
    chunked: bool = False
    break_after: int | None = None
    served: int = 0
    requests: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.headers))
        if self.honour_conditionals and request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers={"ETag": self.etag})
        resp = web.StreamResponse(headers={"ETag": self.etag})
        if not self.chunked:
            resp.content_length = len(self.body)
        await resp.prepare(request)
        for start in range(0, len(self.body), 64 * 1024):
            if self.break_after is not None and start >= self.break_after:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            chunk = self.body[start : start + 64 * 1024]
            self.served += len(chunk)
            await resp.write(chunk)
        await resp.write_eof()
        return resp


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    src = Source(body=discovery_iso("test-iso/v1", 3 * 1024 * 1024 + 123))
    app = web.Application()
    app.router.add_get("/images/discovery.iso", src.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    src.url = f"http://127.0.0.1:{port}/images/discovery.iso?api_key=secret-token"
    yield src
    await runner.cleanup()


def over_the_cap(source: Source) -> None:
    """A 1 MiB volume followed by 2 MiB of padding: the head passes a 1 MiB cap, the
    stream goes over it (isohybrid images carry padding after their volume too)."""
    source.body = discovery_iso("test-iso/padded") + os.urandom(2 * 1024 * 1024)


def _prefix(request: pytest.FixtureRequest) -> str:
    return f"agent-forge/tests/{request.node.name[:50]}"


async def _leftovers(service: VsphereService, prefix: str) -> list[str]:
    files = await service.list_files(where=ISO_DS, prefix=prefix, pattern=".upload-*")
    return [f.path for f in files]


async def test_the_iso_lands_under_its_sha256_name(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    result = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    digest = hashlib.sha256(source.body).hexdigest()
    assert result.sha256 == digest
    assert result.path == f"{prefix}/{digest}.iso"
    assert result.backing == f"[iso-ds] {prefix}/{digest}.iso"
    assert result.size == len(source.body) == result.bytes_downloaded
    assert result.validators.etag == '"v1"'
    assert not result.reused
    files = await service.list_files(where=ISO_DS, prefix=prefix)
    assert [(f.path, f.size) for f in files] == [(result.path, len(source.body))]
    assert await _leftovers(service, prefix) == []


async def test_an_upload_of_content_already_present_is_discarded(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    second = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert second.reused
    assert second.path == first.path
    assert [f.path for f in await service.list_files(where=ISO_DS, prefix=prefix)] == [first.path]
    assert await _leftovers(service, prefix) == []


@pytest.mark.parametrize("honour_conditionals", [True, False])
async def test_revalidating_an_unchanged_iso_downloads_nothing(
    service: VsphereService,
    source: Source,
    request: pytest.FixtureRequest,
    honour_conditionals: bool,
) -> None:
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    source.honour_conditionals = honour_conditionals
    again = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert again.bytes_downloaded == 0
    assert again.reused
    assert again.sha256 == first.sha256
    assert source.requests[-1].get("If-None-Match") == '"v1"'


async def test_a_changed_iso_is_downloaded_and_stored_under_its_new_name(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    source.body, source.etag = discovery_iso("test-iso/v2"), '"v2"'
    second = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert second.sha256 == hashlib.sha256(source.body).hexdigest()
    assert second.bytes_downloaded == len(source.body)
    assert second.validators == Validators(etag='"v2"', content_length=len(source.body))
    paths = {f.path for f in await service.list_files(where=ISO_DS, prefix=prefix)}
    assert paths == {first.path, second.path}


async def test_a_revalidated_iso_missing_from_the_datastore_is_uploaded_again(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert await service.delete_file(where=ISO_DS, path=first.path)
    again = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert not again.reused
    assert again.bytes_downloaded == len(source.body)
    assert await service.file_exists(where=ISO_DS, path=first.path)


@pytest.mark.parametrize("chunked", [False, True])
async def test_the_size_limit_is_enforced_and_nothing_is_left_behind(
    service: VsphereService, source: Source, request: pytest.FixtureRequest, chunked: bool
) -> None:
    prefix = _prefix(request)
    source.chunked = chunked
    over_the_cap(source)
    with pytest.raises(SizeLimitExceeded) as info:
        await service.ensure_iso(
            source=IsoSource(url=source.url),
            where=ISO_DS,
            prefix=prefix,
            limits=IsoLimits(max_bytes=1024 * 1024),
        )
    shown = source.url.replace("secret-token", "[REDACTED]")
    assert f"the ISO at {shown} " in str(info.value), "named by its shown URL, without the key"
    assert info.value.subject == shown
    assert await service.list_files(where=ISO_DS, prefix=prefix, pattern="*") == []


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_that_is_no_iso_never_reaches_the_datastore(
    service: VsphereService,
    source: Source,
    vcsim_control: VcsimControl,
    request: pytest.FixtureRequest,
    chunked: bool,
) -> None:
    prefix = _prefix(request)
    source.chunked = chunked
    source.body = b"<html><body><h1>407 Proxy Authentication Required</h1></body></html>"
    mark = await vcsim_control.last_seq()
    with pytest.raises(IsoInvalid) as info:
        await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert "secret-token" not in str(info.value)
    assert '"<html><body><h1>407 Proxy Authentication Required</h1></body></html>"' in str(
        info.value
    )
    sent = await vcsim_control.request_log(since=mark)
    assert [e for e in sent if e["http_method"] == "PUT"] == []
    assert [e.get("method") for e in sent if e.get("method") == "MakeDirectory"] == []
    assert await service.list_files(where=ISO_DS, prefix=prefix, pattern="*") == []


async def test_a_source_failing_mid_stream_leaves_no_temporary_file(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    source.break_after = 1024 * 1024
    with pytest.raises(IsoDownloadFailed) as info:
        await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert "secret-token" not in str(info.value)
    assert len(source.requests) == 1, "not fetched again: the caller backs off per URL"
    await asyncio.sleep(0)
    assert await service.list_files(where=ISO_DS, prefix=prefix, pattern="*") == []


async def test_the_pipeline_logs_in_again_after_the_session_ended(
    private: tuple[Any, VsphereService], source: Source, request: pytest.FixtureRequest
) -> None:
    vcsim, service = private
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    await vcsim.control.end_sessions()
    before = await vcsim.control.counters()
    again = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert again.bytes_downloaded == 0
    await vcsim.control.end_sessions()
    source.body, source.etag = discovery_iso("test-iso/v3"), '"v3"'
    fresh = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert await service.file_exists(where=ISO_DS, path=fresh.path)
    after = await vcsim.control.counters()
    assert after["logins"] - before["logins"] == 2


# --- cleanup races: the server may create the file after the client gave up on the PUT ----
#
# vcsim (like a proxy in front of a file service) may start on a PUT late: with a delay on
# "PUT /folder" the request is held before the handler creates the file. A delete that
# runs as soon as the client aborted finds nothing, and the file appears afterwards (the
# flake of the size-limit test under load, made deterministic here).

PUT_DELAY_MS = 300


async def _puts_finished(control: VcsimControl, *, since: int, prefix: str) -> None:
    """Wait until vcsim has finished every PUT under `prefix` (it logs status 0 until then)."""

    async def puts() -> list[dict[str, Any]]:
        return [
            e
            for e in await control.request_log(kind="http", since=since)
            if e["http_method"] == "PUT" and e["path"].startswith(f"/folder/{prefix}/")
        ]

    await eventually(
        puts,
        lambda found: bool(found) and all(e["status"] for e in found),
        what=f"vcsim to finish the PUTs under {prefix}",
        interval=0.05,
    )


async def _fails_then_nothing_is_left(
    service: VsphereService,
    control: VcsimControl,
    prefix: str,
    ensure: Callable[[], Awaitable[object]],
    error: type[Exception],
) -> None:
    await control.set_delay("PUT /folder", PUT_DELAY_MS)
    mark = await control.last_seq()
    with pytest.raises(error):
        await ensure()
    await _puts_finished(control, since=mark, prefix=prefix)
    assert await service.list_files(where=ISO_DS, prefix=prefix, pattern="*") == []


async def test_the_size_limit_leaves_nothing_behind_when_the_server_starts_the_put_late(
    service: VsphereService,
    source: Source,
    vcsim_control: VcsimControl,
    request: pytest.FixtureRequest,
) -> None:
    prefix = _prefix(request)
    source.chunked = True
    over_the_cap(source)

    async def ensure() -> object:
        return await service.ensure_iso(
            source=IsoSource(url=source.url),
            where=ISO_DS,
            prefix=prefix,
            limits=IsoLimits(max_bytes=1024 * 1024),
        )

    await _fails_then_nothing_is_left(service, vcsim_control, prefix, ensure, SizeLimitExceeded)


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_broken_source_leaves_nothing_behind_when_the_server_starts_the_put_late(
    service: VsphereService,
    source: Source,
    vcsim_control: VcsimControl,
    request: pytest.FixtureRequest,
    chunked: bool,
) -> None:
    # Chunked: the body ends, the PUT is answered, then deleted. Content-Length: the PUT
    # is aborted, and the file vcsim creates after the first delete is found again.
    prefix = _prefix(request)
    source.chunked = chunked
    source.break_after = 1024 * 1024

    async def ensure() -> object:
        return await service.ensure_iso(
            source=IsoSource(url=source.url),
            where=ISO_DS,
            prefix=prefix,
        )

    await _fails_then_nothing_is_left(service, vcsim_control, prefix, ensure, IsoDownloadFailed)


# --- what a killed upload leaves: found by the listing the pruner uses, with its age -------


async def test_a_stale_temporary_upload_is_listed_with_its_age_and_planned_for_deletion(
    service: VsphereService, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    stale, fresh = (f"{prefix}/.upload-{os.urandom(16).hex()}.iso" for _ in range(2))
    outside = f"{prefix}/nested/.upload-{os.urandom(16).hex()}.iso"

    async def body() -> AsyncIterator[bytes]:
        yield b"partial"

    session = await service.session()
    for path in (stale, fresh, outside):
        await service.make_directory(where=ISO_DS, path=path.rsplit("/", 1)[0])
        await datastore.upload(session, where=ISO_DS, path=path, body=body())
    assert vcsim.workdir is not None
    two_hours_ago = time.time() - 2 * 3600
    for path in (stale, outside):
        on_disk = vcsim.workdir / "datastores" / ISO_DS.datacenter / ISO_DS.datastore / path
        os.utime(on_disk, (two_hours_ago, two_hours_ago))
    listed = await service.list_files(where=ISO_DS, prefix=prefix)  # the pruner's listing
    assert {f.path for f in listed} == {stale, fresh, outside}
    plan = iso_cache.plan_prune(
        history=[],
        retain=1,
        prefix=prefix,
        files=[iso_cache.StoredFile(path=f.path, size=f.size, modified=f.modified) for f in listed],
        in_use=(),
        kept_elsewhere=(),
        now=datetime.now(UTC),
        stale_upload_age=timedelta(hours=1),
    )
    assert plan.stale_uploads == (stale,)
    assert await service.delete_file(where=ISO_DS, path=stale) is True
    assert not await service.file_exists(where=ISO_DS, path=stale)
