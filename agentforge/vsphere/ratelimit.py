"""A token bucket shared by every session that talks to one vCenter.

vCenter throttles and slows down under bursts of SOAP calls from one client; the
bucket caps our calls per second (`rate`) while allowing short bursts (`burst`).
Waiters are served in arrival order (an asyncio lock), so one busy caller cannot
starve the others. The clock and sleep are injected for tests on virtual time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """`await bucket.acquire()` returns once a token is available."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("token bucket needs rate > 0 and burst >= 1")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = asyncio.Lock()
        self.waited_seconds = 0.0

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        self._tokens = min(self._burst, self._tokens + elapsed * self._rate)

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            if self._tokens < 1.0:
                delay = (1.0 - self._tokens) / self._rate
                self.waited_seconds += delay
                await self._sleep(delay)
                self._refill()
            self._tokens -= 1.0
