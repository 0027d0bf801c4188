"""A controller: informer events -> keys -> a work queue -> N reconcile workers.

Promises (controller-runtime's controller, in asyncio):

* Each `Watch` maps an informer's objects to the keys to reconcile (`own_key` by
  default; a mapper lets a change to an Agent enqueue its pool). On update both
  the old and the new object are mapped, so a key that stops matching is still
  reconciled once. An optional `predicate(old, new)` filters updates.
* Workers start only after every watched informer has synced, so a reconcile never
  sees a half-filled cache. Events arriving earlier are queued, not lost.
* At most `workers` reconciles run at once and never two for the same key (the
  queue's guarantee).
* `reconcile(key)` returns `Result` (or None): `requeue_after` schedules the key
  again after that delay (and resets its backoff), `requeue` retries it with the
  rate limiter; an exception is logged with the key and retried rate-limited;
  plain success `forget`s the key's failure history.
* Metrics: `agent_forge_reconcile_total{controller,result}`,
  `agent_forge_reconcile_duration_seconds{controller}` (the reconcile coroutine,
  timed by prometheus_async's `aio.time`, wall-clock), and
  `agent_forge_event_to_reconcile_seconds{controller}`: from the first informer
  event that enqueued a key to the start of the reconcile that handles it (what
  the benchmark reports as p50/p99 reaction time).
* `stop()` drains: no new keys are handed out, reconciles in flight finish, then
  `run()` returns. Cancelling `run()` instead cancels reconciles in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from prometheus_async import aio
from prometheus_client import Counter, Histogram

from agentforge.kube.informer import EventHandler
from agentforge.kube.queue import ShutDown, WorkQueue
from agentforge.kube.ratelimit import Clock, RateLimiter
from agentforge.kube.store import ObjectKey, object_key

__all__ = [
    "Controller",
    "MapFunc",
    "Reconcile",
    "Result",
    "Source",
    "Watch",
    "own_key",
]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
MapFunc = Callable[[JsonObj], Iterable[ObjectKey]]

RECONCILE_TOTAL = Counter(
    "agent_forge_reconcile_total",
    "Reconciles by controller and result (success, error, requeue, requeue_after).",
    ["controller", "result"],
)
RECONCILE_DURATION = Histogram(
    "agent_forge_reconcile_duration_seconds",
    "Time spent in one reconcile.",
    ["controller"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
EVENT_TO_RECONCILE = Histogram(
    "agent_forge_event_to_reconcile_seconds",
    "From the informer event that enqueued a key to the start of its reconcile.",
    ["controller"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class Outcome(StrEnum):
    SUCCESS = "success"
    ERROR = "error"
    REQUEUE = "requeue"
    REQUEUE_AFTER = "requeue_after"


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks for next; the default (nothing) means "done"."""

    requeue_after: float | None = None
    requeue: bool = False


Reconcile = Callable[[ObjectKey], Awaitable[Result | None]]


class Source(Protocol):
    """An event source (an `informer.Informer`)."""

    def add_handler(self, handler: EventHandler) -> None: ...

    async def synced(self) -> None: ...


def own_key(obj: JsonObj) -> Iterable[ObjectKey]:
    """The object's own key: for the kind the controller reconciles."""
    return (object_key(obj),)


@dataclass(frozen=True, slots=True)
class Watch:
    """Reconcile `map(obj)` whenever `source` reports a change of `obj`."""

    source: Source
    map: MapFunc = own_key
    predicate: Callable[[JsonObj, JsonObj], bool] | None = field(default=None)


class Controller:
    """One reconciler, its work queue and its workers."""

    def __init__(
        self,
        *,
        name: str,
        reconcile: Reconcile,
        watches: Sequence[Watch],
        workers: int = 1,
        rate_limiter: RateLimiter[ObjectKey] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a controller needs at least one worker")
        self.name = name
        self.queue: WorkQueue[ObjectKey] = WorkQueue(
            name=name, rate_limiter=rate_limiter, clock=clock
        )
        self._clock = self.queue.clock  # one clock for the queue and these metrics
        self._reconcile = reconcile
        self._watches = tuple(watches)
        self._workers = workers
        self._pending_since: dict[ObjectKey, float] = {}
        self._stopping = asyncio.Event()
        self._started = asyncio.Event()
        self._total = {o: RECONCILE_TOTAL.labels(name, o.value) for o in Outcome}
        self._duration = RECONCILE_DURATION.labels(name)
        self._latency = EVENT_TO_RECONCILE.labels(name)
        for watch in self._watches:
            watch.source.add_handler(self._handler_for(watch))

    # --- enqueueing -------------------------------------------------------------------

    def enqueue(self, key: ObjectKey) -> None:
        """Reconcile `key` soon (for triggers that are not informer events)."""
        self.queue.add(key)

    def _enqueue_from_event(self, keys: Iterable[ObjectKey]) -> None:
        now = self._clock()
        for key in keys:
            self._pending_since.setdefault(key, now)
            self.queue.add(key)

    def _handler_for(self, watch: Watch) -> EventHandler:
        def mapped(obj: JsonObj) -> Iterable[ObjectKey]:
            return watch.map(obj)

        def on_add(obj: JsonObj) -> None:
            self._enqueue_from_event(mapped(obj))

        def on_update(old: JsonObj, new: JsonObj) -> None:
            if watch.predicate is not None and not watch.predicate(old, new):
                return
            self._enqueue_from_event(dict.fromkeys([*mapped(old), *mapped(new)]))

        def on_delete(obj: JsonObj) -> None:
            self._enqueue_from_event(mapped(obj))

        return EventHandler(on_add=on_add, on_update=on_update, on_delete=on_delete)

    # --- lifecycle --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True once the informers synced and workers run."""
        return self._started.is_set()

    async def run(self) -> None:
        """Wait for the informers to sync, then reconcile until `stop()` (or cancel)."""
        if not await self._wait_synced():
            return
        self._started.set()
        log.info("%s: caches synced, starting %d workers", self.name, self._workers)
        try:
            async with asyncio.TaskGroup() as group:
                for index in range(self._workers):
                    group.create_task(self._work(), name=f"{self.name}-worker-{index}")
        finally:
            self._started.clear()

    async def stop(self) -> None:
        """Drain: finish reconciles in flight, drop queued keys, let `run()` return."""
        self._stopping.set()
        await self.queue.shutdown(drain=True)

    async def _wait_synced(self) -> bool:
        synced: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(watch.source.synced() for watch in self._watches))
        )
        stopping: asyncio.Future[Any] = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({synced, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (synced, stopping):
                if not future.done():
                    future.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await future
        return synced.done() and not synced.cancelled() and not self._stopping.is_set()

    # --- workers ----------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self._process(key)
            finally:
                self.queue.done(key)

    async def _process(self, key: ObjectKey) -> None:
        started = self._clock()
        since = self._pending_since.pop(key, None)
        if since is not None:
            self._latency.observe(max(started - since, 0.0))
        try:
            result = await aio.time(self._duration, self._reconcile(key))
        except Exception as exc:
            self.queue.add_rate_limited(key)
            self._total[Outcome.ERROR].inc()
            log.error(  # noqa: TRY400 - the traceback is in exc_info
                "%s: reconcile of %s failed (attempt %d): %s",
                self.name,
                key,
                self.queue.num_requeues(key),
                exc,
                exc_info=exc,
            )
        else:
            if result is not None and result.requeue_after is not None:
                self.queue.forget(key)
                self.queue.add_after(key, result.requeue_after)
                self._total[Outcome.REQUEUE_AFTER].inc()
            elif result is not None and result.requeue:
                self.queue.add_rate_limited(key)
                self._total[Outcome.REQUEUE].inc()
            else:
                self.queue.forget(key)
                self._total[Outcome.SUCCESS].inc()
