"""The work queue between informer events and reconcile workers (client-go semantics).

Promises (client-go `util/workqueue` `queue.go`, `delaying_queue.go`,
`rate_limiting_queue.go`):

* **Dedupe**: a key waiting in the queue is there once (`dirty` set), however often
  it is added.
* **Exclusive**: a key handed out by `get()` is not handed out again until `done(key)`;
  two workers never reconcile the same key at once.
* **No lost re-adds**: a key added while it is processing is marked dirty and queued
  again when `done(key)` is called, so the change that caused the re-add is seen.
* `add_after(key, delay)`: added when the delay expires; of several pending delays
  for one key the earliest wins.
* `add_rate_limited(key)`: `add_after` with the rate limiter's delay (per-key
  exponential backoff, max'ed with an overall token bucket by default);
  `forget(key)` resets the key's failure count.
* `shutdown(drain=True)` stops handing out keys (`get()` raises `ShutDown`; queued
  and delayed keys are dropped: the next process relists and requeues them) and
  waits until every key being processed is `done`.
* **Fair between groups** (optional `fairness(key)`, e.g. a VsphereAgent's pool): keys
  wait in a FIFO per group and `get()` takes the groups in turn (round robin; a group
  with nothing queued leaves the turn order and rejoins at its back), so a group
  with one key queued behind another group's hundreds is handed out within one turn
  of the groups, not after them all. Without `fairness` every key is in one group:
  plain FIFO, as client-go's queue. (controller-runtime's priority queue and
  Kubernetes' API Priority and Fairness use the same idea: queues per flow, served
  in turn.)
* Metrics with client-go's names and a `name` label: depth, adds, queue and work
  duration, retries, unfinished work and longest running processor.

Single event loop, no locks. Time comes from `clock` (default: the running loop's
clock, so looptime drives it in tests); delays are scheduled on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from agentforge.ratelimit import Clock, RateLimiter, default_controller_limiter

__all__ = ["Fairness", "ShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)

Fairness = Callable[[K], Hashable]
"""The group a key takes turns in (read when the key is queued)."""

_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)

DEPTH = Gauge("workqueue_depth", "Current depth of the work queue.", ["name"])
ADDS = Counter("workqueue_adds_total", "Adds handled by the work queue.", ["name"])
QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long an item stays in the work queue before being requested.",
    ["name"],
    buckets=_BUCKETS,
)
WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long processing an item from the work queue takes.",
    ["name"],
    buckets=_BUCKETS,
)
RETRIES = Counter("workqueue_retries_total", "Retries handled by the work queue.", ["name"])
UNFINISHED = Gauge(
    "workqueue_unfinished_work_seconds",
    "Seconds of work in progress not yet observed by work_duration; large values "
    "indicate stuck workers.",
    ["name"],
)
LONGEST = Gauge(
    "workqueue_longest_running_processor_seconds",
    "Seconds the longest running processor of the work queue has been running.",
    ["name"],
)


class ShutDown(Exception):
    """The queue is shutting down: stop taking work."""


def _loop_clock() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class WorkQueue(Generic[K]):
    """A deduplicating, exclusive, rate-limited, delaying queue of keys, fair between
    the groups `fairness` puts them in."""

    def __init__(
        self,
        *,
        name: str,
        rate_limiter: RateLimiter[K] | None = None,
        clock: Clock | None = None,
        fairness: Fairness[K] | None = None,
    ) -> None:
        self.name = name
        self._clock = clock or _loop_clock
        self._limiter: RateLimiter[K] = rate_limiter or default_controller_limiter(
            clock=self._clock
        )
        self._fairness = fairness
        self._groups: collections.OrderedDict[Hashable, collections.deque[K]] = (
            collections.OrderedDict()
        )  # group -> its queued keys, in turn order (the next group first)
        self._queued = 0
        self._dirty: set[K] = set()
        self._processing: dict[K, float] = {}  # key -> when processing started
        self._added_at: dict[K, float] = {}  # dirty key -> when first added
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._idle: asyncio.Event | None = None
        self._shutting_down = False
        self._depth = DEPTH.labels(name)
        self._adds = ADDS.labels(name)
        self._queue_duration = QUEUE_DURATION.labels(name)
        self._work_duration = WORK_DURATION.labels(name)
        self._retries = RETRIES.labels(name)
        UNFINISHED.labels(name).set_function(self.unfinished_work_seconds)
        LONGEST.labels(name).set_function(self.longest_running_seconds)

    # --- producers --------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue `key` unless it is already waiting (or the queue is shutting down)."""
        if self._shutting_down or key in self._dirty:
            return
        self._adds.inc()
        self._dirty.add(key)
        self._added_at[key] = self._clock()
        if key in self._processing:
            return  # queued again by done()
        self._push(key)

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` after `delay` seconds; an earlier pending delay for it wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        ready_at = self._clock() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= ready_at:
                return
            pending[1].cancel()
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._delayed[key] = (ready_at, handle)

    def add_rate_limited(self, key: K) -> None:
        """Add `key` after its rate-limited delay (it failed; count a retry)."""
        if self._shutting_down:
            return
        self._retries.inc()
        self.add_after(key, self._limiter.when(key))

    def forget(self, key: K) -> None:
        """`key` succeeded: reset its failure count (not its place in the queue)."""
        self._limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self._limiter.num_requeues(key)

    # --- consumers --------------------------------------------------------------------

    async def get(self) -> K:
        """The next key, marked processing; raises `ShutDown` once shutting down."""
        while not self._queued:
            if self._shutting_down:
                raise ShutDown
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self._wake_one()  # we were woken for an item we will not take
                else:
                    getter.cancel()
                raise
        if self._shutting_down:
            raise ShutDown
        key = self._pop()
        self._depth.dec()
        now = self._clock()
        self._processing[key] = now
        self._dirty.discard(key)
        added = self._added_at.pop(key, None)
        if added is not None:
            self._queue_duration.observe(max(now - added, 0.0))
        return key

    def done(self, key: K) -> None:
        """Processing of `key` finished; requeue it if it was added meanwhile."""
        started = self._processing.pop(key, None)
        if started is not None:
            self._work_duration.observe(max(self._clock() - started, 0.0))
        if key in self._dirty and not self._shutting_down:
            self._push(key)
        if not self._processing and self._idle is not None:
            self._idle.set()

    # --- lifecycle --------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        return self._clock

    async def shutdown(self, *, drain: bool = False) -> None:
        """Stop handing out keys; with `drain`, wait for keys in processing to be done."""
        if not self._shutting_down:
            self._shutting_down = True
            for _, handle in self._delayed.values():
                handle.cancel()
            self._delayed.clear()
            self._depth.dec(self._queued)
            self._groups.clear()
            self._queued = 0
            self._dirty.clear()
            self._added_at.clear()
            while self._getters:
                getter = self._getters.popleft()
                if not getter.done():
                    getter.set_result(None)
        if drain and self._processing:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    # --- introspection ----------------------------------------------------------------

    def __len__(self) -> int:
        return self._queued

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    @property
    def delayed(self) -> frozenset[K]:
        """Keys added with a delay (`add_after`, `add_rate_limited`) not due yet."""
        return frozenset(self._delayed)

    def unfinished_work_seconds(self) -> float:
        now = self._clock()
        return sum(max(now - started, 0.0) for started in self._processing.values())

    def longest_running_seconds(self) -> float:
        if not self._processing:
            return 0.0
        return max(self._clock() - min(self._processing.values()), 0.0)

    # --- internals --------------------------------------------------------------------

    def _push(self, key: K) -> None:
        group = self._fairness(key) if self._fairness is not None else None
        queue = self._groups.get(group)
        if queue is None:
            queue = self._groups[group] = collections.deque()  # joins the turns at the back
        queue.append(key)
        self._queued += 1
        self._depth.inc()
        self._wake_one()

    def _pop(self) -> K:
        """The next group's oldest key; that group goes to the back of the turns."""
        group, queue = next(iter(self._groups.items()))
        key = queue.popleft()
        del self._groups[group]
        if queue:
            self._groups[group] = queue
        self._queued -= 1
        return key

    def _wake_one(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _fire(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)
