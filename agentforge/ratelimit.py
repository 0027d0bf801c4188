"""How long to wait before trying again: per-key backoff, token buckets, jitter.

Layer-neutral: the Kubernetes runtime (work queues, event spam filter, reflector)
and the vSphere sessions (one bucket per vCenter) both use it.

Semantics of client-go's `util/workqueue/default_rate_limiters.go`:

* `ItemExponentialLimiter`: the n-th consecutive failure of a key waits
  `base * 2**n` (5 ms, 10 ms, 20 ms, ... capped at 5 min); `forget(key)` resets it.
* `BucketLimiter`: one token bucket for all keys (10 qps, burst 100). `when`
  *reserves* a token, so a burst of failures is spread out instead of retried at
  once; the delay is how long until the reserved token exists.
* `MaxOfLimiter`: the effective delay is the largest of its limiters'.
* `default_controller_limiter()`: max(per-key exponential, bucket), as client-go's
  `DefaultControllerRateLimiter`.

`TokenBucket` is also used on its own: the event recorder's per-object spam
filter (`try_take`) and the per-vCenter call rate of the vSphere sessions
(`await acquire()`: callers are served in arrival order, each reserving the next
token and sleeping until it exists). `Backoff` is the reflector's jittered
exponential backoff.
Every clock is injected: a function returning monotonic seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

__all__ = [
    "Backoff",
    "BucketLimiter",
    "Clock",
    "ItemExponentialLimiter",
    "MaxOfLimiter",
    "RateLimiter",
    "TokenBucket",
    "default_controller_limiter",
]

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)
Clock = Callable[[], float]


class RateLimiter(Protocol[K_contra]):
    def when(self, key: K_contra) -> float:
        """Seconds to wait before retrying `key`; records one more failure."""

    def forget(self, key: K_contra) -> None:
        """`key` succeeded: drop its failure history."""

    def num_requeues(self, key: K_contra) -> int: ...


class TokenBucket:
    """`rate` tokens per second, at most `burst` banked; starts full."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        return self._tokens

    def try_take(self) -> bool:
        """Take a token if one is there now."""
        if self._refill() >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def reserve(self) -> float:
        """Take a token now or in the future; return the seconds until it exists."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self) -> None:
        """Return once a token is there (reserved now, so waiters go in arrival order)."""
        delay = self.reserve()
        if delay > 0:
            await self._sleep(delay)


class ItemExponentialLimiter(Generic[K]):
    """Per-key exponential backoff: `base * 2**failures`, capped at `cap`."""

    def __init__(self, *, base: float = 0.005, cap: float = 300.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        exp = self._failures.get(key, 0)
        self._failures[key] = exp + 1
        if exp >= 64:  # 2**64 * base overflows any sensible cap
            return self.cap
        return min(self.base * (2.0**exp), self.cap)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        return self._failures.get(key, 0)


class BucketLimiter(Generic[K]):
    """One token bucket shared by every key (overall retry rate)."""

    def __init__(self, *, qps: float = 10.0, burst: int = 100, clock: Clock = time.monotonic):
        self._bucket = TokenBucket(rate=qps, burst=burst, clock=clock)

    def when(self, key: K) -> float:
        return self._bucket.reserve()

    def forget(self, key: K) -> None:
        return None

    def num_requeues(self, key: K) -> int:
        return 0


class MaxOfLimiter(Generic[K]):
    """The largest delay of all `limiters` (every limiter records the failure)."""

    def __init__(self, *limiters: RateLimiter[K]) -> None:
        if not limiters:
            raise ValueError("MaxOfLimiter needs at least one limiter")
        self._limiters = limiters

    def when(self, key: K) -> float:
        return max([limiter.when(key) for limiter in self._limiters])

    def forget(self, key: K) -> None:
        for limiter in self._limiters:
            limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return max(limiter.num_requeues(key) for limiter in self._limiters)


def default_controller_limiter(*, clock: Clock = time.monotonic) -> MaxOfLimiter[K]:
    """client-go's DefaultControllerRateLimiter: 5 ms..5 min per key, 10 qps/100 burst."""
    return MaxOfLimiter(
        ItemExponentialLimiter[K](base=0.005, cap=300.0),
        BucketLimiter[K](qps=10.0, burst=100, clock=clock),
    )


class Backoff:
    """Jittered exponential backoff for a retry loop (the reflector's).

    `next()` returns `d * (1 + jitter * U[0,1))` with `d` doubling from `initial` up to
    `cap`; `reset()` starts over (call it after a stretch of success).
    """

    def __init__(
        self,
        *,
        initial: float = 0.8,
        cap: float = 30.0,
        factor: float = 2.0,
        jitter: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._current = initial

    def next(self) -> float:
        delay = self._current
        self._current = min(self._current * self.factor, self.cap)
        return delay * (1.0 + self.jitter * self._rng.random())

    def reset(self) -> None:
        self._current = self.initial
