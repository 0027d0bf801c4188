"""Leader election between real operator processes on a real Lease.

Each test uses its own Lease name in the operator's namespace, where the RBAC
generated from the code (installed by `sim.operator.install_operator`) grants the
operator's ServiceAccount the Lease verbs it declared.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentforge.api import names
from agentforge.api.kinds import LEASE
from agentforge.kube import client, leader
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl
from sim.controlplane.controlplane import ControlPlane
from sim.operator import (
    MetricsReader,
    OperatorProcess,
    install_operator,
    metrics_reader,
    operator_identity,
)

NAMESPACE = names.DEPLOYMENT_NAMESPACE
LEASES = "leases.coordination.k8s.io"  # how the proxy names the resource
# Short timings keep expiry tests quick; the ratios are client-go's defaults'.
FAST = {"lease": 6.0, "renew": 4.0, "retry": 1.0}


@pytest.fixture(scope="module")
def operator_kubeconfig(controlplane: ControlPlane) -> Path:
    return install_operator(controlplane)


@pytest.fixture(scope="module")
def reader(controlplane: ControlPlane, operator_kubeconfig: Path) -> MetricsReader:
    return metrics_reader(controlplane)


@pytest.fixture
def lease_name() -> str:
    return f"t-{secrets.token_hex(4)}"


def _args(lease_name: str, *, fast: bool) -> list[str]:
    args = ["--leader-elect", "--leader-election-namespace", NAMESPACE]
    args += ["--credential-namespace", NAMESPACE]  # required when watching all; no pool here
    args += ["--leader-election-id", lease_name]
    if fast:
        args += ["--lease-duration", f"{FAST['lease']}s", "--renew-deadline", f"{FAST['renew']}s"]
        args += ["--retry-period", f"{FAST['retry']}s"]
    return args


@contextlib.asynccontextmanager
async def _two_operators(
    kubeconfig: Path, reader: MetricsReader, lease_name: str, logs: Path, *, fast: bool
) -> AsyncIterator[tuple[OperatorProcess, OperatorProcess]]:
    args = _args(lease_name, fast=fast)
    a = OperatorProcess(kubeconfig, *args, log_path=logs / "a.log", name="a", metrics=reader)
    b = OperatorProcess(kubeconfig, *args, log_path=logs / "b.log", name="b", metrics=reader)
    async with a, b:
        await asyncio.gather(a.wait_ready(within=60), b.wait_ready(within=60))
        yield a, b


@pytest.fixture
async def pair(
    operator_kubeconfig: Path, reader: MetricsReader, lease_name: str, tmp_path: Path
) -> AsyncIterator[tuple[OperatorProcess, OperatorProcess]]:
    """Two operators with the default timings (lease 15 s, renew 10 s, retry 2 s)."""
    async with _two_operators(operator_kubeconfig, reader, lease_name, tmp_path, fast=False) as ops:
        yield ops


@pytest.fixture
async def fast_pair(
    operator_kubeconfig: Path, reader: MetricsReader, lease_name: str, tmp_path: Path
) -> AsyncIterator[tuple[OperatorProcess, OperatorProcess]]:
    """Two operators with `FAST` timings, for tests that wait for an expiry."""
    async with _two_operators(operator_kubeconfig, reader, lease_name, tmp_path, fast=True) as ops:
        yield ops


async def _lease(kube: client.KubeClient, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = (await kube.get(LEASE, namespace=NAMESPACE, name=name))["spec"]
    return spec


async def _leading(op: OperatorProcess, lease_name: str) -> bool:
    return await op.metric("leader_election_master_status", name=lease_name) == 1


async def _lease_reads(op: OperatorProcess) -> float:
    """The GETs of Leases `op` sent (its attempts to acquire or renew)."""
    return sum(
        value
        for name, labels, value in await op.metrics()
        if name == "agent_forge_kube_requests_total"
        and labels.get("verb") == "get"
        and labels.get("resource", "").startswith("leases")
    )


async def _lease_reads_beyond(op: OperatorProcess, count: float) -> bool:
    return await _lease_reads(op) >= count


async def _leader_of(
    pair: tuple[OperatorProcess, OperatorProcess], lease_name: str, *, within: float = 20
) -> tuple[OperatorProcess, OperatorProcess]:
    a, b = pair

    async def leading() -> list[bool]:
        return [await _leading(a, lease_name), await _leading(b, lease_name)]

    status = await eventually(
        leading, any, what=f"one of two operators leading {lease_name}", within=within
    )
    return (a, b) if status[0] else (b, a)


async def test_of_two_operators_exactly_one_leads_and_the_lease_names_it(
    pair: tuple[OperatorProcess, OperatorProcess], lease_name: str, kube: client.KubeClient
) -> None:
    leader_op, standby = await _leader_of(pair, lease_name)
    # The standby must stay a standby: wait until it has read the Lease twice more
    # (two retry periods, each an attempt that found the Lease held).
    seen = await _lease_reads(standby)
    await eventually(
        lambda: _lease_reads_beyond(standby, seen + 2),
        what="the standby reading the Lease twice more",
        within=20,
    )
    assert await _leading(leader_op, lease_name)
    assert not await _leading(standby, lease_name)
    assert await standby.readyz() == 200  # warm: caches synced while not leading
    spec = await _lease(kube, lease_name)
    became = await leader_op.wait_log("became leader", within=1)
    assert spec["holderIdentity"] == became["identity"]
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert spec["renewTime"] > spec["acquireTime"]  # renewed since acquired
    assert not [e for e in standby.log_entries() if e.get("msg") == "became leader"]


async def test_after_kill_9_of_the_leader_the_standby_takes_over_once_the_lease_expires(
    fast_pair: tuple[OperatorProcess, OperatorProcess], lease_name: str, kube: client.KubeClient
) -> None:
    leader_op, standby = await _leader_of(fast_pair, lease_name)
    before = await _lease(kube, lease_name)
    leader_op.kill()
    killed_at = time.monotonic()
    assert await leader_op.wait_exit(within=5) == -9
    await standby.wait_log("became leader", within=FAST["lease"] * 3)
    waited = time.monotonic() - killed_at
    # Not before the lease expired (the last renewal was at most one retry period
    # before the kill), and soon after it (one jittered retry period).
    assert waited >= FAST["lease"] - FAST["retry"] - 0.5
    assert waited <= FAST["lease"] + FAST["retry"] * (1 + leader.JITTER_FACTOR) + 2
    after = await _lease(kube, lease_name)
    assert after["holderIdentity"] != before["holderIdentity"]
    assert after["leaseTransitions"] == before["leaseTransitions"] + 1
    assert await _leading(standby, lease_name)


async def test_sigterm_hands_the_lease_over_well_before_it_expires_and_exits_0(
    pair: tuple[OperatorProcess, OperatorProcess], lease_name: str, kube: client.KubeClient
) -> None:
    leader_op, standby = await _leader_of(pair, lease_name)
    leader_op.terminate()
    stopped_at = time.monotonic()
    assert await leader_op.wait_exit(within=10) == 0
    exited_after = time.monotonic() - stopped_at
    await standby.wait_log("became leader", within=15)
    handed_over_after = time.monotonic() - stopped_at
    assert exited_after < 3
    assert handed_over_after < 15 / 2  # the lease is 15 s: a release, not an expiry
    assert [e for e in leader_op.log_entries() if e.get("msg") == "released leader lease"]
    spec = await _lease(kube, lease_name)
    assert spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 15  # the new holder wrote its own record


async def test_a_leader_that_cannot_renew_stops_and_exits_1_before_the_lease_expires(
    fast_pair: tuple[OperatorProcess, OperatorProcess],
    lease_name: str,
    proxy: ProxyControl,
) -> None:
    leader_op, standby = await _leader_of(fast_pair, lease_name)
    standby.kill()  # keep the Lease alone with a leader that cannot reach it
    await standby.wait_exit(within=5)
    await proxy.fail_next(
        1000, status=503, verb="get", resource=LEASES, identity=operator_identity()
    )
    failing_since = time.monotonic()
    assert await leader_op.wait_exit(within=FAST["lease"] * 3) == 1
    lost_after = time.monotonic() - failing_since
    assert FAST["renew"] - 0.5 <= lost_after < FAST["lease"] + FAST["retry"]
    lost = await leader_op.wait_log("lost the leader lease: stopped all work, exiting", within=1)
    assert lost["level"] == "error"
    assert not [e for e in leader_op.log_entries() if e.get("msg") == "released leader lease"]


class _CountingStore(leader.KubeLeaseStore):
    """The real Lease store, counting each candidate's reads of the Lease."""

    def __init__(self, reads: dict[str, int], who: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reads, self._who = reads, who

    async def get(self) -> leader.StoredLease | None:
        self._reads[self._who] = self._reads.get(self._who, 0) + 1
        return await super().get()


async def _all_read_twice(reads: dict[str, int], electors: list[leader.LeaderElector]) -> bool:
    return all(reads.get(e.identity, 0) >= 2 for e in electors)


async def test_racing_electors_on_the_real_lease_produce_one_holder(
    kube: client.KubeClient, lease_name: str
) -> None:
    store = leader.KubeLeaseStore(client=kube, namespace=NAMESPACE, name=lease_name)
    reads: dict[str, int] = {}
    electors = [
        leader.LeaderElector(
            store=_CountingStore(
                reads, f"candidate-{i}", client=kube, namespace=NAMESPACE, name=lease_name
            ),
            name=lease_name,
            identity=f"candidate-{i}",
            lease_duration=15,
            renew_deadline=10,
            retry_period=2,
        )
        for i in range(4)
    ]
    tasks = [asyncio.create_task(e.acquire()) for e in electors]
    done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    # Every loser retried at least once (a second read of the Lease) and still lost.
    await eventually(
        lambda: _all_read_twice(reads, [electors[tasks.index(t)] for t in pending]),
        what="every losing candidate reading the Lease twice",
        within=10,
    )
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert len(done) == 1
    winners = [e for e in electors if e.is_leader]
    assert len(winners) == 1
    stored = await store.get()
    assert stored is not None
    assert stored.record.holder_identity == winners[0].identity
    assert stored.record.renew_time is not None
    assert abs(stored.record.renew_time - dt.datetime.now(dt.UTC)) < dt.timedelta(seconds=30)
    assert await winners[0].release()
    released = await store.get()
    assert released is not None
    assert released.record.holder_identity == ""
    assert released.record.lease_duration_seconds == 1
