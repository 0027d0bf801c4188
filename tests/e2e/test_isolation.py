"""A dead vCenter costs only its own pools, and SIGTERM ends the operator whatever it does.

The "dead vCenter" is a `sim.blackhole.BlackHole`: it accepts TCP connections and never
answers (a dropped firewall, a dead load balancer). The operator is the real process
under its ServiceAccount, started here with long vSphere timeouts so that the login to
the black hole is still hanging while the healthy pool is measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentforge import shutdown
from agentforge.api import kinds
from agentforge.api.conditions import PoolConditionType, PoolReason
from sim.blackhole import BlackHole
from sim.operator import OperatorProcess
from sim.world import Snapshot, World, samples
from sim.world.snapshot import condition_of
from tests.e2e.support import eventually

HANGING_LOGIN_S = 25.0  # connect and login timeout of the operator under test (outlasts
# the healthy pool's time to a VM, a few seconds, several times over)
WITHIN = 120.0


@pytest.fixture
async def black_hole() -> AsyncIterator[BlackHole]:
    async with BlackHole() as hole:
        yield hole


def start_operator(
    kubeconfig: Path, world: World, log_path: Path, *, timeout_s: float
) -> OperatorProcess:
    args = ["--max-concurrent-reconciles", "2"]
    for ns in (world.namespace, world.control_plane_namespace):
        args += ["--namespace", ns]
    args += [
        "--vsphere-connect-timeout",
        f"{timeout_s:g}s",
        "--vsphere-login-timeout",
        f"{timeout_s:g}s",
    ]
    return OperatorProcess(kubeconfig, *args, log_path=log_path, name="operator").start()


async def dead_pool(world: World, hole: BlackHole, name: str = "dead") -> None:
    secret = samples.credentials_secret(
        name=f"{name}-credentials",
        namespace=world.namespace,
        server=hole.server,
        username=world.vcsim.username,
        password=world.vcsim.password,
        ca_file=Path(world.vcsim.ca_file),
    )
    await world.client.create(kinds.SECRET, secret)
    await world.create_pool(name, secret=f"{name}-credentials", folder=f"e2e/{world.namespace}/d")


async def time_to_vm(world: World, pool: str) -> float:
    """Scale the pool's NodePool to 1; seconds until a VM of the pool exists."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await world.nodepool(pool).scale(1)
    await eventually(
        world.snapshot,
        lambda s: bool(s.vms_of_pool(pool)),
        within=WITHIN,
        what=f"a VM of pool {pool}",
        interval=0.1,
    )
    return loop.time() - started


def unreachable_reported(snap: Snapshot, pool: str) -> bool:
    cond = condition_of(snap.pool(pool), PoolConditionType.VSPHERE_READY)
    warned = [
        e
        for e in snap.events_about("VsphereAgentPool", pool)
        if e.get("type") == "Warning" and e.get("reason") == PoolReason.VCENTER_UNREACHABLE
    ]
    return (
        cond is not None
        and cond.get("status") == "False"
        and cond.get("reason") == PoolReason.VCENTER_UNREACHABLE
        and bool(warned)
    )


async def test_a_black_holed_vcenter_does_not_slow_a_healthy_pool_and_is_reported(
    world: World, operator_kubeconfig: Path, black_hole: BlackHole, tmp_path: Path
) -> None:
    process = start_operator(
        operator_kubeconfig, world, tmp_path / "operator.log", timeout_s=HANGING_LOGIN_S
    )
    try:
        await process.wait_ready()
        await world.create_infraenv()
        await world.create_credentials()
        await world.create_pool("first", folder=f"e2e/{world.namespace}/a")
        await world.create_pool("second", folder=f"e2e/{world.namespace}/b")
        await eventually(  # both measured from the same start: ISO cached, no VM yet
            world.snapshot,
            lambda s: all(
                (c := condition_of(s.pool(p), PoolConditionType.ISO_READY)) is not None
                and c["status"] == "True"
                for p in ("first", "second")
            ),
            within=WITHIN,
            what="both healthy pools ISOReady",
        )
        baseline = await time_to_vm(world, "first")

        await dead_pool(world, black_hole)
        await world.nodepool("dead").scale(1)
        await black_hole.wait_connected(1, within=WITHIN)  # its login has started
        with_dead = await time_to_vm(world, "second")
        hanging = black_hole.open
        reported_early = unreachable_reported(await world.snapshot(), "dead")

        # within the documented time: the login timeout, plus a reconcile
        await eventually(
            world.snapshot,
            lambda s: unreachable_reported(s, "dead"),
            within=HANGING_LOGIN_S + 30,
            what="VsphereReady=False VcenterUnreachable and its event on pool dead",
        )
        snap = await world.snapshot()
    finally:
        await process.stop(grace=shutdown.SHUTDOWN_TIMEOUT_S)
    print(f"time to a VM: {baseline:.2f}s alone, {with_dead:.2f}s beside a dead vCenter")
    assert hanging >= 1, "the healthy pool's VM was created while the dead login still hung"
    assert not reported_early
    assert with_dead <= 5 * baseline, (
        f"the healthy pool took {with_dead:.1f}s to its VM beside a dead vCenter, "
        f"{baseline:.1f}s alone"
    )
    assert snap.vms_of_pool("dead") == []
    healthy = condition_of(snap.pool("first"), PoolConditionType.VSPHERE_READY)
    assert healthy is not None
    assert healthy["status"] == "True"
    assert world.vcsim.password not in process.log_text()


async def test_sigterm_ends_the_operator_within_its_deadline_while_a_login_hangs(
    world: World, operator_kubeconfig: Path, black_hole: BlackHole, tmp_path: Path
) -> None:
    process = start_operator(operator_kubeconfig, world, tmp_path / "operator.log", timeout_s=300)
    try:
        await process.wait_ready()
        await dead_pool(world, black_hole)
        await black_hole.wait_connected(1, within=WITHIN)
        assert black_hole.open >= 1, "a login to the dead vCenter hangs"
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        process.terminate()
        code = await process.wait_exit(within=shutdown.SHUTDOWN_TIMEOUT_S + 5)
        took = loop.time() - signalled
    finally:
        if process.running():
            process.kill()
            await process.wait_exit(within=10)
    print(f"exited {took:.2f}s after SIGTERM")
    assert code == 0
    assert took <= shutdown.SHUTDOWN_TIMEOUT_S, f"exited {took:.1f}s after SIGTERM"
    messages = [e.get("msg") for e in process.log_entries()]
    assert "shut down" in messages
