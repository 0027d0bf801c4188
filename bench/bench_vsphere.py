"""vSphere layer figures, counted by the simulator's control API (never asserted).

- requests per VM lifecycle (create + facts + eject + delete) and logins per run, for
  100 VMs reconciled concurrently (a pool) and for VMs handled one at a time, with the
  Go operator's way (one `govc` process and one login per call) as the yardstick;
- ISO pipeline throughput for a generated 1 GiB ISO served over loopback into the
  simulator's datastore, as a ratio to a plain aiohttp copy of the same bytes from the
  same source to the same sink, and the bench process's peak memory growth meanwhile;
- bytes downloaded by a revalidation of the unchanged ISO.

Run: `python -m bench --only vsphere` (or `python -m bench.bench_vsphere` standalone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from aiohttp import web
from rich.console import Console

from agentforge.vsphere import (
    Credentials,
    Hardware,
    IsoSource,
    Location,
    OwnershipMarkers,
    Placement,
    SessionOptions,
    SessionRegistry,
    VmRequest,
    VsphereService,
)
from bench.harness import Context, Goal, Section, table
from sim.actors.iso9660 import build_iso
from sim.paths import binary
from sim.vcsim.launcher import Vcsim
from sim.vsphere_tasks import TaskDriver

POOL_VMS = 100
SEQUENTIAL_VMS = 10
GOVC_VMS = 3
ISO_BYTES = 1024**3
BLOCK = 1024 * 1024
REPO = str(Path(__file__).resolve().parent.parent)
ISO = "[iso-ds] agent-forge/bench/" + "ab" * 32 + ".iso"


def _credentials(sim: Vcsim) -> Credentials:
    return Credentials(
        server=sim.server,
        username=sim.username,
        password=sim.password,
        ca_bundle_pem=Path(sim.ca_file).read_text(),
    )


def _write_port(port_file: str, port: int) -> None:
    Path(port_file).write_text(str(port))


def _read_port(port_file: Path) -> str:
    return port_file.read_text() if port_file.exists() else ""


def _total(counters: dict[str, Any]) -> int:
    return int(sum(counters.get("paths", {}).values()))


async def _lifecycle(
    driver: TaskDriver, service: VsphereService, req: VmRequest, markers: OwnershipMarkers
) -> None:
    vm = await driver.create(service, req)
    facts = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert facts is not None
    (cd,) = facts.cdroms
    await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=ISO,
        markers=markers,
    )
    await driver.delete(service, datacenter="dc1", bios_uuid=vm.bios_uuid or "", markers=markers)


async def _pool_lifecycle(
    driver: TaskDriver,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
    n: int,
) -> None:
    """What a pool reconcile does: create all, read all at once, eject all, delete all."""
    hw = Hardware(cpus=2, memory_mib=2048, disk_gib=20)
    reqs = [
        VmRequest(name=f"pool-{i}", placement=placement, hardware=hw, iso_file=ISO, markers=markers)
        for i in range(n)
    ]
    made = await asyncio.gather(*(driver.create(service, r) for r in reqs))
    uuids = [vm.bios_uuid or "" for vm in made]
    facts = await service.vms_by_uuid(datacenter="dc1", bios_uuids=uuids)
    await asyncio.gather(
        *(
            driver.eject(
                service,
                datacenter="dc1",
                vm_uuid=u,
                device_key=facts[u].cdroms[0].key,
                expected_backing=ISO,
                markers=markers,
            )
            for u in uuids
        )
    )
    await asyncio.gather(
        *(driver.delete(service, datacenter="dc1", bios_uuid=u, markers=markers) for u in uuids)
    )


async def _measure(
    sim: Vcsim, body: Callable[[TaskDriver, VsphereService], Awaitable[None]]
) -> tuple[int, int, float]:
    """(requests, logins, seconds) of `body` run with a fresh registry (login included);
    its tasks run as the controllers run them (`TaskDriver`)."""
    await sim.control.reset_counters()
    creds = _credentials(sim)
    registry = SessionRegistry(options=SessionOptions())
    driver = TaskDriver(registry)
    started = time.monotonic()
    try:
        await body(driver, VsphereService(registry=registry, credentials=creds))
    finally:
        driver.close()
        await registry.close()
    seconds = time.monotonic() - started
    counters = await sim.control.counters()
    return _total(counters), int(counters.get("logins", 0)), seconds


def _govc_lifecycle(sim: Vcsim, name: str) -> int:
    """The Go operator's way: one govc process (and login) per call. Returns processes."""
    calls = [
        [
            "vm.create",
            "-on=false",
            "-folder=govc-bench",
            "-pool=cluster/Resources",
            "-datastore-cluster=dsc1",
            "-net=VM Network",
            "-net.adapter=vmxnet3",
            "-disk.controller=pvscsi",
            "-disk=20G",
            "-c=2",
            "-m=2048",
            "-g=rhel9_64Guest",
            "-firmware=efi",
            "-iso-datastore=iso-ds",
            "-iso=agent-forge/bench/x.iso",
            name,
        ],
        ["vm.change", "-vm", name, "-e", "disk.enableUUID=TRUE"],
        ["vm.power", "-on", name],
        ["vm.info", "-json", name],
        ["device.info", "-vm", name, "-json", "ethernet-*"],
        ["device.cdrom.eject", "-vm", name],
        ["device.disconnect", "-vm", name, "cdrom-3000"],
        ["vm.info", "-json", name],
        ["vm.destroy", name],
    ]
    # The Go operator logs in afresh for every call: no persisted govc session.
    env = {**os.environ, **sim.govc_env(), "GOVC_PERSIST_SESSION": "false"}
    govc = str(binary("govc"))
    for args in calls:
        subprocess.run([govc, *args], env=env, capture_output=True, timeout=120, check=False)
    return len(calls)


# --- ISO source in its own process --------------------------------------------------


def _serve(size: int, port_file: str) -> None:
    """Serve `size` generated bytes at /iso (ETag, Content-Length, 304 on If-None-Match):
    a bootable ISO 9660 head (what the ISO check asks of boot media), then random bytes."""
    head = build_iso(volume_id="BENCH", size=BLOCK, seed="bench")
    block = os.urandom(BLOCK)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-None-Match") == '"bench-1"':
            return web.Response(status=304, headers={"ETag": '"bench-1"'})
        resp = web.StreamResponse(headers={"ETag": '"bench-1"'})
        resp.content_length = size
        await resp.prepare(request)
        left = size
        while left > 0:
            chunk = (head if left == size else block) if left >= BLOCK else block[:left]
            await resp.write(chunk)
            left -= len(chunk)
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/iso", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        _write_port(port_file, port)
        await asyncio.Event().wait()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _source(workdir: Path, size: int) -> AsyncIterator[str]:
    port_file = workdir / f"iso-port-{uuid.uuid4().hex[:6]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.bench_vsphere",
        "--serve",
        str(size),
        str(port_file),
        cwd=REPO,
    )
    try:
        port = ""
        for _ in range(400):
            port = _read_port(port_file)
            if port:
                break
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/iso"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)


class _PeakRss:
    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.base: int = self._proc.memory_info().rss
        self.peak: int = self.base
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._proc.memory_info().rss)
            await asyncio.sleep(0.02)

    def __enter__(self) -> _PeakRss:
        self._task = asyncio.create_task(self._sample())
        return self

    def __exit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 1e6


async def _plain_copy(service: VsphereService, url: str, path: str) -> float:
    """Yardstick: GET the source and PUT the same stream to the same sink, nothing else."""
    session = await service.session()
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as client,
        client.get(url, headers={"Accept-Encoding": "identity"}) as resp,
        session.http().put(
            "/folder/" + path,
            params={"dcPath": "dc1", "dsName": "iso-ds"},
            data=resp.content.iter_chunked(BLOCK),
            headers={"Cookie": session.soap_cookie(), "Content-Length": str(ISO_BYTES)},
        ) as put,
    ):
        await put.read()
    return time.monotonic() - started


async def run(ctx: Context) -> Section:
    section = Section(title="vSphere layer: requests per VM, logins, ISO pipeline")
    markers = OwnershipMarkers(
        pool_namespace="bench", pool_name="pool", pool_uid=str(uuid.uuid4()), vsphere_agent="a"
    )
    placement = Placement("dc1", "cluster/Resources", "bench-pool", "VM Network", "dsc1", "iso-ds")
    async with Vcsim(workdir=ctx.workdir / "vcsim-vsphere") as sim:
        ctx.step(f"{POOL_VMS} VM lifecycles as one pool (concurrent)")
        requests, logins, seconds = await _measure(
            sim, lambda d, s: _pool_lifecycle(d, s, placement, markers, POOL_VMS)
        )
        section.add(
            "requests per VM lifecycle, pool of 100",
            requests / POOL_VMS,
            "requests",
            Goal.at_most(12),
        )
        section.add("logins per 100 VMs", logins, "logins", Goal.equal(1))
        section.add("pool of 100 VM lifecycles", seconds, "s")

        ctx.step(f"{SEQUENTIAL_VMS} VM lifecycles one at a time")

        async def one_by_one(driver: TaskDriver, service: VsphereService) -> None:
            for i in range(SEQUENTIAL_VMS):
                req = VmRequest(
                    name=f"seq-{i}",
                    placement=placement,
                    hardware=Hardware(cpus=2, memory_mib=2048, disk_gib=20),
                    iso_file=ISO,
                    markers=markers,
                )
                await _lifecycle(driver, service, req, markers)

        requests, logins, _ = await _measure(sim, one_by_one)
        section.add(
            "requests per VM lifecycle, one at a time", requests / SEQUENTIAL_VMS, "requests"
        )

        ctx.step("the govc yardstick")
        await sim.control.reset_counters()
        processes = 0
        for i in range(GOVC_VMS):
            processes += await asyncio.to_thread(_govc_lifecycle, sim, f"govc-{i}")
        counters = await sim.control.counters()
        section.add("govc: requests per VM lifecycle", _total(counters) / GOVC_VMS, "requests")
        section.add("govc: logins per VM lifecycle", counters.get("logins", 0) / GOVC_VMS, "logins")
        section.add("govc: processes per VM lifecycle", processes / GOVC_VMS, "processes")

        ctx.step("ISO pipeline, 1 GiB over loopback")
        creds = _credentials(sim)
        registry = SessionRegistry()
        try:
            service = VsphereService(registry=registry, credentials=creds)
            where = Location("dc1", "iso-ds")
            async with _source(ctx.workdir, ISO_BYTES) as url:
                await service.make_directory(where=where, path="bench")
                plain = await _plain_copy(service, url, "bench/plain.iso")
                await service.delete_file(where=where, path="bench/plain.iso")
                started = time.monotonic()
                with _PeakRss() as rss:
                    result = await service.ensure_iso(
                        source=IsoSource(url=url), where=where, prefix="bench/iso"
                    )
                piped = time.monotonic() - started
                again = await service.ensure_iso(
                    source=IsoSource(url=url),
                    where=where,
                    prefix="bench/iso",
                    previous=result.record,
                )
                await service.delete_file(where=where, path=result.path)
        finally:
            await registry.close()
        section.add("ISO pipeline throughput", ISO_BYTES / piped / 1e6, "MB/s")
        section.add("plain aiohttp copy throughput", ISO_BYTES / plain / 1e6, "MB/s")
        section.add("ISO pipeline throughput / plain copy throughput", plain / piped, "ratio")
        section.add(
            "ISO pipeline time / plain copy time (goal ratio >= 0.8)",
            piped / plain,
            "ratio",
            Goal.at_most(1.25),
        )
        section.add("peak memory growth during the transfer", rss.growth_mb, "MB", Goal.at_most(32))
        section.add(
            "revalidation of the unchanged ISO: bytes downloaded",
            again.bytes_downloaded,
            "bytes",
            Goal.equal(0),
        )
    section.notes += [
        "Requests are every HTTP request the simulator received (SOAP, /folder, vAPI), "
        "login and placement look-ups included, divided by the VMs; a lifecycle is create "
        "(Storage DRS recommendation, create, power on) + facts + CD-ROM eject + delete "
        "(power off, destroy).",
        "Every task runs as the controllers run it: a task slot, started, followed, its "
        "outcome read once its end is news (`sim.vsphere_tasks`). "
        "Pool: all VMs in flight together share one task waiter (one ListView filter, "
        "coalesced registrations, one long poll per batch of updates) and one facts read; "
        "one at a time: each task costs its start, its registration and a long poll.",
        f"govc yardstick: {GOVC_VMS} lifecycles the Go operator's way (create, change, "
        "power, info, device info, eject, disconnect, info, destroy), each call a process "
        "that logs in.",
        "ISO: a separate process serves generated bytes over loopback HTTP; both runs PUT "
        "into the simulator's iso-ds over verified TLS. Memory is the bench process's RSS.",
    ]
    return section


async def _standalone() -> None:
    console = Console()
    with tempfile.TemporaryDirectory(prefix="bench-vsphere-") as tmp:
        ctx = Context(workdir=Path(tmp), console=console)
        try:
            section = await run(ctx)
        finally:
            await ctx.close()
    console.print(table(section))
    for note in section.notes:
        console.print(f"- {note}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        _serve(int(sys.argv[2]), sys.argv[3])
    else:
        asyncio.run(_standalone())
