"""Leader election rules (client-go semantics) against an in-memory Lease, on virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import random
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from agentforge.kube import errors, leader

pytestmark = pytest.mark.looptime

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15.0, 10.0, 2.0


def _conflict() -> errors.Conflict:
    return errors.Conflict(status=409, reason="Conflict", message="the object has been modified")


@dataclass
class FakeLeaseStore:
    """One Lease with resourceVersions; faults: fail or hang every call while set."""

    stored: leader.StoredLease | None = None
    version: int = 0
    failing: bool = False
    hanging: bool = False
    writes: list[leader.LeaseRecord] = field(default_factory=list)

    def describe(self) -> str:
        return "ns/lease"

    async def _fault(self) -> None:
        await asyncio.sleep(0.01)  # a request takes a little time
        if self.hanging:
            await asyncio.Event().wait()
        if self.failing:
            raise errors.TransportError("connection refused")

    async def get(self) -> leader.StoredLease | None:
        await self._fault()
        return self.stored

    async def create(self, record: leader.LeaseRecord) -> leader.StoredLease:
        await self._fault()
        if self.stored is not None:
            raise errors.AlreadyExists(status=409, reason="AlreadyExists", message="exists")
        return self.write(record)

    async def update(
        self, record: leader.LeaseRecord, *, resource_version: str
    ) -> leader.StoredLease:
        await self._fault()
        if self.stored is None or self.stored.resource_version != resource_version:
            raise _conflict()
        return self.write(record)

    def write(self, record: leader.LeaseRecord) -> leader.StoredLease:
        self.version += 1
        self.writes.append(record)
        self.stored = leader.StoredLease(record=record, resource_version=str(self.version))
        return self.stored


def _wall_clock() -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=asyncio.get_running_loop().time())


def _elector(store: FakeLeaseStore, identity: str, *, name: str = "lease") -> leader.LeaderElector:
    return leader.LeaderElector(
        store=store,
        name=name,
        identity=identity,
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
        wall_clock=_wall_clock,
        rng=random.Random(7),
    )


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _lead(elector: leader.LeaderElector) -> asyncio.Task[None]:
    """Acquire, then keep renewing in a background task (cancelled by the test)."""
    await elector.acquire()
    return asyncio.create_task(elector.renew_until_lost())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_first_candidate_creates_the_lease_and_holds_it() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    await a.acquire()
    assert a.is_leader
    assert store.stored is not None
    record = store.stored.record
    assert record.holder_identity == "a"
    assert record.lease_duration_seconds == 15
    assert record.acquire_time == record.renew_time
    assert record.lease_transitions == 0


async def test_standby_waits_while_the_leader_keeps_renewing() -> None:
    store = FakeLeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")
    renewing = await _lead(a)
    standby = asyncio.create_task(b.acquire())
    await asyncio.sleep(120)
    assert not standby.done()
    assert not b.is_leader
    assert b.holder == "a"
    await _stop(standby)
    await _stop(renewing)


async def test_renewal_moves_renew_time_and_keeps_acquire_time_and_transitions() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    renewing = await _lead(a)
    first = store.writes[0]
    await asyncio.sleep(RETRY_PERIOD * 3 + 1)
    await _stop(renewing)
    assert len(store.writes) >= 3
    last = store.writes[-1]
    assert last.acquire_time == first.acquire_time
    assert last.lease_transitions == first.lease_transitions
    assert last.renew_time is not None
    assert first.renew_time is not None
    assert last.renew_time > first.renew_time


async def test_standby_takes_over_only_after_lease_duration_on_its_own_clock() -> None:
    store = FakeLeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")
    await a.acquire()  # a never renews: it is as good as dead from here
    died_at = _now()
    assert store.stored is not None
    first_acquired = store.stored.record.acquire_time
    assert first_acquired is not None
    await b.acquire()
    waited = _now() - died_at
    assert LEASE_DURATION <= waited <= LEASE_DURATION + RETRY_PERIOD * (1 + leader.JITTER_FACTOR)
    assert store.stored is not None
    assert store.stored.record.holder_identity == "b"
    assert store.stored.record.lease_transitions == 1
    taken_at = store.stored.record.acquire_time
    assert taken_at is not None
    assert taken_at - first_acquired >= dt.timedelta(seconds=LEASE_DURATION)
    assert b.is_leader


async def test_a_skewed_renew_time_does_not_expire_a_lease_that_keeps_changing() -> None:
    # The holder's clock is an hour behind: renewTime looks ancient, but the record
    # keeps changing, so by the standby's own clock the lease is alive.
    store = FakeLeaseStore()
    a = leader.LeaderElector(
        store=store,
        name="lease",
        identity="a",
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
        wall_clock=lambda: _wall_clock() - dt.timedelta(hours=1),
    )
    renewing = await _lead(a)
    b = _elector(store, "b")
    standby = asyncio.create_task(b.acquire())
    await asyncio.sleep(LEASE_DURATION * 4)
    assert not standby.done()
    await _stop(standby)
    await _stop(renewing)


async def test_leader_that_cannot_renew_within_the_deadline_loses() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    renewing = await _lead(a)
    await asyncio.sleep(5)
    store.failing = True
    failing_since = _now()
    with pytest.raises(leader.LeadershipLostError):
        await renewing
    lost_after = _now() - failing_since
    assert not a.is_leader
    # Gave up before a standby could take over (lease duration after the last renewal).
    assert RENEW_DEADLINE <= lost_after < LEASE_DURATION


async def test_a_hung_renewal_counts_against_the_renew_deadline() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    renewing = await _lead(a)
    store.hanging = True
    hung_since = _now()
    with pytest.raises(leader.LeadershipLostError):
        await renewing
    assert _now() - hung_since < LEASE_DURATION


async def test_leader_keeps_the_lease_through_failures_shorter_than_the_deadline() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    renewing = await _lead(a)
    store.failing = True
    await asyncio.sleep(RENEW_DEADLINE - RETRY_PERIOD * 2)
    store.failing = False
    await asyncio.sleep(LEASE_DURATION * 2)
    assert not renewing.done()
    assert a.is_leader
    await _stop(renewing)


async def test_release_clears_the_holder_and_a_standby_takes_over_at_its_next_retry() -> None:
    store = FakeLeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")
    renewing = await _lead(a)
    standby = asyncio.create_task(b.acquire())
    await asyncio.sleep(30)
    await _stop(renewing)
    assert await a.release()
    released_at = _now()
    assert store.stored is not None
    assert store.stored.record.holder_identity == ""
    assert store.stored.record.lease_duration_seconds == 1
    await standby
    assert _now() - released_at <= RETRY_PERIOD * (1 + leader.JITTER_FACTOR) + 0.1
    assert store.stored.record.holder_identity == "b"
    assert store.stored.record.lease_transitions == 1


async def test_release_after_a_renewal_landed_unseen_uses_the_current_version() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    await a.acquire()
    assert store.stored is not None
    # A renewal that was cancelled after the server applied it: our version is stale.
    store.write(dataclasses.replace(store.stored.record, renew_time=_wall_clock()))
    assert await a.release()
    assert store.stored.record.holder_identity == ""


async def test_release_does_not_clear_a_lease_someone_else_took_meanwhile() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a")
    await a.acquire()
    assert store.stored is not None
    store.write(dataclasses.replace(store.stored.record, holder_identity="b"))
    assert not await a.release()
    assert store.stored.record.holder_identity == "b"


async def test_release_by_a_non_leader_writes_nothing() -> None:
    store = FakeLeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")
    await a.acquire()
    writes = len(store.writes)
    assert not await b.release()
    assert len(store.writes) == writes
    assert store.stored is not None
    assert store.stored.record.holder_identity == "a"


async def test_racing_candidates_on_an_expired_lease_produce_exactly_one_leader() -> None:
    store = FakeLeaseStore()
    dead = _elector(store, "dead")
    await dead.acquire()
    candidates = [_elector(store, f"c{i}") for i in range(5)]
    tasks = [asyncio.create_task(c.acquire()) for c in candidates]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    await asyncio.sleep(LEASE_DURATION)  # losers keep trying; none may succeed
    assert sum(c.is_leader for c in candidates) == 1
    assert all(not t.done() for t in pending)
    for task in pending:
        await _stop(task)


async def test_master_status_metric_follows_leadership() -> None:
    store = FakeLeaseStore()
    a = _elector(store, "a", name="metric-lease")

    def value() -> float | None:
        return REGISTRY.get_sample_value("leader_election_master_status", {"name": "metric-lease"})

    assert value() == 0
    renewing = await _lead(a)
    assert value() == 1
    await _stop(renewing)
    await a.release()
    assert value() == 0


def test_timings_that_break_client_go_rules_are_refused() -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline"):
        leader.LeaderElector(
            store=FakeLeaseStore(),
            name="x",
            identity="a",
            lease_duration=10,
            renew_deadline=10,
            retry_period=2,
        )


def test_default_identity_is_hostname_and_a_unique_suffix() -> None:
    first, second = leader.default_identity(), leader.default_identity()
    assert first != second
    assert first.rsplit("_", 1)[0] == second.rsplit("_", 1)[0]
