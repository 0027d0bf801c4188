"""Rate limiter rules: per-key exponential backoff, token bucket, max-of, jitter."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentforge import ratelimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_item_backoff_doubles_from_5ms_and_caps_at_5_minutes() -> None:
    limiter = ratelimit.ItemExponentialLimiter[str]()
    delays = [limiter.when("k") for _ in range(20)]
    assert delays[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert max(delays) == 300.0
    assert delays[-1] == 300.0
    assert limiter.num_requeues("k") == 20


def test_item_backoff_is_per_key_and_forget_resets_it() -> None:
    limiter = ratelimit.ItemExponentialLimiter[str]()
    limiter.when("a")
    limiter.when("a")
    assert limiter.when("b") == pytest.approx(0.005)
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == pytest.approx(0.005)


def test_item_backoff_survives_huge_failure_counts() -> None:
    limiter = ratelimit.ItemExponentialLimiter[str](cap=7.0)
    for _ in range(2000):
        delay = limiter.when("k")
    assert delay == 7.0


def test_token_bucket_allows_a_burst_then_spaces_reservations_by_rate() -> None:
    clock = FakeClock()
    limiter = ratelimit.BucketLimiter[str](qps=10.0, burst=100, clock=clock)
    burst = [limiter.when(f"k{i}") for i in range(100)]
    assert burst == [0.0] * 100
    assert [limiter.when("x") for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    clock.now += 10.0  # refills, but only up to the burst
    assert limiter.when("y") == 0.0


def test_token_bucket_try_take_refuses_when_empty_and_refills_with_time() -> None:
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(rate=0.5, burst=2, clock=clock)
    assert bucket.try_take()
    assert bucket.try_take()
    assert not bucket.try_take()
    clock.now += 2.0
    assert bucket.try_take()
    assert not bucket.try_take()


def test_default_controller_limiter_uses_the_larger_of_backoff_and_bucket() -> None:
    clock = FakeClock()
    limiter: ratelimit.MaxOfLimiter[str] = ratelimit.default_controller_limiter(clock=clock)
    assert limiter.when("a") == pytest.approx(0.005)  # bucket is full, backoff wins
    for i in range(200):
        limiter.when(f"other-{i}")  # drain the bucket
    assert limiter.when("b") > 0.005  # now the bucket's delay wins
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0


def test_backoff_grows_with_jitter_up_to_cap_and_resets() -> None:
    backoff = ratelimit.Backoff(initial=1.0, cap=8.0, jitter=1.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(6)]
    bases = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base <= delay < 2 * base
    backoff.reset()
    assert 1.0 <= backoff.next() < 2.0


def test_token_bucket_rejects_nonsense_parameters() -> None:
    with pytest.raises(ValueError, match="rate"):
        ratelimit.TokenBucket(rate=0, burst=1)


async def test_token_bucket_acquire_lets_a_burst_pass_without_waiting() -> None:
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(rate=10, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        await bucket.acquire()
    assert clock.slept == []


async def test_token_bucket_acquire_paces_calls_beyond_the_burst_at_the_rate() -> None:
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(rate=10, burst=2, clock=clock, sleep=clock.sleep)
    for _ in range(6):
        await bucket.acquire()
    assert clock.now == pytest.approx(0.4)
    assert clock.slept == pytest.approx([0.1] * 4)


async def test_token_bucket_acquire_gives_concurrent_waiters_successive_tokens() -> None:
    clock = FakeClock()  # stands still while they wait: all arrive at once
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    bucket = ratelimit.TokenBucket(rate=1, burst=1, clock=clock, sleep=record)
    await asyncio.gather(*(bucket.acquire() for _ in range(4)))
    assert delays == pytest.approx([1.0, 2.0, 3.0])


async def test_token_bucket_idle_time_refills_up_to_the_burst_only() -> None:
    clock = FakeClock()
    bucket = ratelimit.TokenBucket(rate=1, burst=2, clock=clock, sleep=clock.sleep)
    await bucket.acquire()
    await bucket.acquire()
    clock.now += 100
    for _ in range(3):
        await bucket.acquire()
    assert clock.slept == [1.0]
