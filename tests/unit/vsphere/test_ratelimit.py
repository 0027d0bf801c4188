"""The per-vCenter token bucket allows a burst, then paces calls at the rate."""

from __future__ import annotations

from agentforge.vsphere.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_a_burst_passes_without_waiting() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        await bucket.acquire()
    assert clock.slept == []


async def test_calls_beyond_the_burst_are_paced_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10, burst=2, clock=clock, sleep=clock.sleep)
    for _ in range(6):
        await bucket.acquire()
    assert clock.now == 0.4
    assert all(abs(s - 0.1) < 1e-9 for s in clock.slept)


async def test_idle_time_refills_up_to_the_burst_only() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1, burst=2, clock=clock, sleep=clock.sleep)
    await bucket.acquire()
    await bucket.acquire()
    clock.now += 100
    for _ in range(3):
        await bucket.acquire()
    assert clock.slept == [1.0]
