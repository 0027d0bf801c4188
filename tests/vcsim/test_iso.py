"""The ISO pipeline: streamed, hashed, content-addressed, revalidated without downloading."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from agentforge.vsphere import (
    IsoLimits,
    IsoSource,
    Location,
    SizeLimitExceeded,
    TransientError,
    Validators,
    VsphereService,
)

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
    src = Source(body=os.urandom(3 * 1024 * 1024 + 123))
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
    source.body, source.etag = os.urandom(1024 * 1024), '"v2"'
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
    with pytest.raises(SizeLimitExceeded):
        await service.ensure_iso(
            source=IsoSource(url=source.url),
            where=ISO_DS,
            prefix=prefix,
            limits=IsoLimits(max_bytes=1024 * 1024),
        )
    assert await service.list_files(where=ISO_DS, prefix=prefix, pattern="*") == []


async def test_a_source_failing_mid_stream_leaves_no_temporary_file(
    service: VsphereService, source: Source, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    source.break_after = 1024 * 1024
    with pytest.raises(TransientError) as info:
        await service.ensure_iso(
            source=IsoSource(url=source.url),
            where=ISO_DS,
            prefix=prefix,
            limits=IsoLimits(attempts=1),
        )
    assert "secret-token" not in str(info.value)
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
    source.body, source.etag = os.urandom(512 * 1024), '"v3"'
    fresh = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert await service.file_exists(where=ISO_DS, path=fresh.path)
    after = await vcsim.control.counters()
    assert after["logins"] - before["logins"] == 2
