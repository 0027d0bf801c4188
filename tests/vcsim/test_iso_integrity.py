"""Content-addressed names are true: every `<sha256>.iso` the pipeline leaves holds bytes
that hash to its name, and every digest it reports is one the source served.

The simulator's datastores are real directories, so the files are hashed on disk. The
cases are the ways a cached ISO could come out wrong: the hash of the last chunk still
queued when the datastore answers the PUT (the cause of the e2e flakes where a pool
cached an ISO the image service never served), two checks of one pool at once, a
content change between or during checks, validators that look unchanged, and a
process killed mid-upload or mid-move. `AF_ISO_STRESS_ITERATIONS` scales the stress.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentforge.vsphere import IsoRecord, IsoSource, Location, VsphereService
from sim.actors.isoserver import IsoServer, discovery_iso
from sim.actors.waiting import eventually
from sim.paths import REPO_ROOT
from sim.vcsim import Vcsim, VcsimControl

pytestmark = pytest.mark.vcsim

ISO_DS = Location(datacenter="dc1", datastore="iso-ds")
STRESS_ITERATIONS = int(os.environ.get("AF_ISO_STRESS_ITERATIONS", "24"))


def _prefix(request: pytest.FixtureRequest) -> str:
    return f"agent-forge/integrity/{request.node.name[:40]}-{os.urandom(3).hex()}"


def on_disk(vcsim: Vcsim, prefix: str) -> Path:
    assert vcsim.workdir is not None
    return vcsim.workdir / "datastores" / ISO_DS.datacenter / ISO_DS.datastore / prefix


def untrue_names(folder: Path) -> list[str]:
    """Content-addressed files whose bytes hash to something else than their name."""
    bad = []
    for path in sorted(folder.glob("*.iso")) if folder.exists() else []:
        if path.name.startswith(".upload-"):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if path.name != f"{digest}.iso":
            bad.append(f"{path.name} holds {digest}")
    return bad


def final_files(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.iso")} if folder.exists() else set()


class LateStart(ThreadPoolExecutor):
    """Jobs start 50 ms late: a loaded machine not scheduling the worker, made reliable."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def late() -> Any:
            time.sleep(0.05)
            return fn(*args, **kwargs)

        return super().submit(late)


@dataclass
class Source:
    """An image service whose validators can lie, and that can trickle its body."""

    body: bytes
    etag: str | None = '"v1"'
    last_modified: str | None = None
    honour_conditionals: bool = True
    etag_on_304: str | None = None
    trickle: float = 0.0
    url: str = ""
    requests: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.headers))
        headers = {}
        if self.etag:
            headers["ETag"] = self.etag
        if self.last_modified:
            headers["Last-Modified"] = self.last_modified
        asked = request.headers.get("If-None-Match")
        if self.honour_conditionals and asked and (asked == self.etag or self.etag_on_304):
            return web.Response(status=304, headers={"ETag": self.etag_on_304 or self.etag or ""})
        resp = web.StreamResponse(headers=headers)
        resp.content_length = len(self.body)
        await resp.prepare(request)
        for start in range(0, len(self.body), 64 * 1024):
            await resp.write(self.body[start : start + 64 * 1024])
            if self.trickle:
                await asyncio.sleep(self.trickle)
        await resp.write_eof()
        return resp


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    src = Source(body=discovery_iso("integrity/v1", 1024 * 1024 + 123))
    app = web.Application()
    app.router.add_get("/images/discovery.iso", src.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    src.url = f"http://127.0.0.1:{port}/images/discovery.iso"
    yield src
    await runner.cleanup()


# --- the root cause --------------------------------------------------------------------


async def test_the_name_is_true_when_the_last_hash_starts_after_the_put_was_answered(
    service: VsphereService, source: Source, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    # vcsim answers the PUT once it holds Content-Length bytes; aiohttp then cancels the
    # body generator while the last chunk's hash waits for a worker. The digest used to be
    # read right away: the file was named after all bytes but the last chunk.
    executor = LateStart(max_workers=2)
    asyncio.get_running_loop().set_default_executor(executor)
    prefix = _prefix(request)
    try:
        result = await service.ensure_iso(
            source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix
        )
    finally:
        executor.shutdown(wait=True)
    digest = hashlib.sha256(source.body).hexdigest()
    assert result.sha256 == digest
    assert final_files(on_disk(vcsim, prefix)) == {f"{digest}.iso"}
    assert untrue_names(on_disk(vcsim, prefix)) == []


# --- concurrency, content changes, validators ------------------------------------------


async def test_two_checks_of_one_pool_at_once_leave_one_true_file(
    service: VsphereService, source: Source, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    results = await asyncio.gather(
        *(
            service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
            for _ in range(3)
        )
    )
    digest = hashlib.sha256(source.body).hexdigest()
    assert {r.sha256 for r in results} == {digest}
    assert sum(not r.reused for r in results) >= 1
    assert final_files(on_disk(vcsim, prefix)) == {f"{digest}.iso"}  # temporaries gone too
    assert untrue_names(on_disk(vcsim, prefix)) == []


async def test_new_content_with_another_weak_etag_and_the_same_date_is_downloaded(
    service: VsphereService, source: Source, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    # Same size, same Last-Modified second, a server that ignores conditionals: only the
    # (weak) ETag tells the versions apart, and it must be believed.
    prefix = _prefix(request)
    source.etag, source.last_modified = 'W/"v1"', "Mon, 01 Jan 2024 00:00:00 GMT"
    source.honour_conditionals = False
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    source.body, source.etag = discovery_iso("integrity/v2", len(source.body)), 'W/"v2"'
    second = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert second.sha256 == hashlib.sha256(source.body).hexdigest() != first.sha256
    assert not second.reused
    assert untrue_names(on_disk(vcsim, prefix)) == []


async def test_a_304_naming_another_etag_is_not_trusted(
    service: VsphereService, source: Source, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    first = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    source.body, source.etag, source.etag_on_304 = discovery_iso("integrity/v3"), '"v2"', '"v2"'
    second = await service.ensure_iso(
        source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix, previous=first.record
    )
    assert second.sha256 == hashlib.sha256(source.body).hexdigest()
    assert "If-None-Match" not in source.requests[-1]  # fetched again, unconditionally
    assert untrue_names(on_disk(vcsim, prefix)) == []


# --- kill -9 mid-upload and mid-move ---------------------------------------------------

CHILD = """
import asyncio, json, sys
from agentforge.vsphere import Credentials, IsoSource, Location, SessionRegistry, VsphereService

async def main() -> None:
    a = json.loads(sys.stdin.readline())
    registry = SessionRegistry()
    service = VsphereService(registry=registry, credentials=Credentials(
        server=a["server"], username=a["username"], password=a["password"],
        ca_bundle_pem=a["ca"]))
    result = await service.ensure_iso(
        source=IsoSource(url=a["url"]), where=Location("dc1", "iso-ds"), prefix=a["prefix"])
    print(json.dumps({"sha256": result.sha256}), flush=True)
    await registry.close()

asyncio.run(main())
"""


async def _start_child(vcsim: Vcsim, *, url: str, prefix: str) -> asyncio.subprocess.Process:
    ca = await asyncio.to_thread(Path(vcsim.ca_file).read_text)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    args = {
        "server": vcsim.server,
        "username": vcsim.username,
        "password": vcsim.password,
        "ca": ca,
        "url": url,
        "prefix": prefix,
    }
    proc.stdin.write((json.dumps(args) + "\n").encode())
    await proc.stdin.drain()
    return proc


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    await proc.wait()


async def test_a_kill_mid_upload_leaves_no_content_addressed_file(
    service: VsphereService, source: Source, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    prefix = _prefix(request)
    folder = on_disk(vcsim, prefix)
    source.trickle = 0.05  # about one second for the whole body

    async def uploading() -> bool:
        return (
            any(p.stat().st_size > 0 for p in folder.glob(".upload-*"))
            if folder.exists()
            else False
        )

    proc = await _start_child(vcsim, url=source.url, prefix=prefix)
    try:
        await eventually(uploading, what="the upload to start", interval=0.02)
    finally:
        await _kill(proc)
    await asyncio.sleep(0.2)  # let vcsim finish the broken PUT
    assert {p for p in final_files(folder) if not p.startswith(".upload-")} == set()
    source.trickle = 0.0
    result = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert result.sha256 == hashlib.sha256(source.body).hexdigest()
    assert untrue_names(folder) == []


async def test_a_kill_mid_move_leaves_only_true_names(
    service: VsphereService,
    source: Source,
    vcsim: Vcsim,
    vcsim_control: VcsimControl,
    request: pytest.FixtureRequest,
) -> None:
    prefix = _prefix(request)
    folder = on_disk(vcsim, prefix)
    await vcsim_control.set_delay("MoveDatastoreFile_Task", 1500, stage="task")
    mark = await vcsim_control.last_seq()

    async def moving() -> bool:
        return bool(await vcsim_control.request_log("MoveDatastoreFile_Task", since=mark))

    proc = await _start_child(vcsim, url=source.url, prefix=prefix)
    try:
        await eventually(moving, what="the move task to start", interval=0.02)
    finally:
        await _kill(proc)
    digest = hashlib.sha256(source.body).hexdigest()

    async def moved() -> bool:
        return f"{digest}.iso" in final_files(folder)

    # the task ends by itself after the kill, as on vCenter
    await eventually(moved, what="the moved ISO", interval=0.02)
    await vcsim_control.set_delay("MoveDatastoreFile_Task", 0, stage="task")
    assert untrue_names(folder) == []
    result = await service.ensure_iso(source=IsoSource(url=source.url), where=ISO_DS, prefix=prefix)
    assert (result.sha256, result.reused) == (digest, True)


# --- stress ----------------------------------------------------------------------------


async def test_stress_cancels_changes_and_concurrent_checks_keep_every_name_true(
    service: VsphereService, vcsim: Vcsim, request: pytest.FixtureRequest
) -> None:
    """Many checks of one pool: some cancelled at a random point, some two at once, the
    image changed at random points (also mid-download). After each round every file must
    be true and every reported digest one the image service served."""
    rnd = random.Random(os.environ.get("AF_ISO_STRESS_SEED", "1"))
    prefix = _prefix(request)
    folder = on_disk(vcsim, prefix)
    async with IsoServer(size=1024 * 1024) as server:
        server.publish("ns", "env")
        url = server.url("ns", "env")
        previous: IsoRecord | None = None
        problems: list[str] = []

        async def check(record: IsoRecord | None) -> IsoRecord | None:
            result = await service.ensure_iso(
                source=IsoSource(url=url), where=ISO_DS, prefix=prefix, previous=record
            )
            if server.by_sha256(result.sha256) is None:
                problems.append(f"reported {result.sha256}, never served")
            return result.record

        for round_ in range(STRESS_ITERATIONS):
            if rnd.random() < 0.3:
                server.change("ns", "env")
            tasks = [
                asyncio.create_task(check(previous if rnd.random() < 0.7 else None))
                for _ in range(rnd.choice((1, 1, 2)))
            ]
            await asyncio.sleep(rnd.uniform(0, 0.08))
            if rnd.random() < 0.3:
                server.change("ns", "env")
            if rnd.random() < 0.3:
                tasks[0].cancel()
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, IsoRecord):
                    previous = outcome
                elif not isinstance(outcome, asyncio.CancelledError):
                    problems.append(f"round {round_}: {outcome!r}")
            problems.extend(f"round {round_}: {bad}" for bad in untrue_names(folder))
        assert problems == []
        assert previous is None or server.by_sha256(previous.sha256) is not None
