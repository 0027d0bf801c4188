"""A controller: informer events -> keys -> a work queue -> N reconcile workers.

Promises (controller-runtime's controller, in asyncio):

* Each `Watch` maps an informer's objects to the keys to reconcile (`own_key` by
  default; a mapper lets a change to an Agent enqueue its pool). On update both
  the old and the new object are mapped, so a key that stops matching is still
  reconciled once. An optional `predicate(old, new)` filters updates.
* Workers start only after every watched informer has synced, so a reconcile never
  sees a half-filled cache. Events arriving earlier are queued, not lost.
* At most `workers` reconciles run at once and never two for the same key (the
  queue's guarantee). With a `fairness(key)` function the queue hands keys out in
  turn between the groups it names (the vm controller: one group per pool), so one
  group's burst does not hold up another group's key.
* `reconcile(key)` returns `Result` (or None): `requeue_after` schedules the key
  again after that delay (and resets its backoff), `requeue` retries it with the
  rate limiter; an exception is logged with the key and retried rate-limited;
  plain success `forget`s the key's failure history.
* Metrics: `agent_forge_reconcile_total{controller,result}`,
  `agent_forge_reconcile_duration_seconds{controller}` (the reconcile coroutine,
  timed by the histogram's own `time()`, wall-clock), and
  `agent_forge_event_to_reconcile_seconds{controller}`: from the first informer
  event that enqueued a key to the start of the reconcile that handles it (what
  the benchmark reports as p50/p99 reaction time).
* Read your writes: a reconcile that writes the object of its key reports the
  resourceVersion the API server returned (`wrote(key, version)`). Until the cache
  (`cache`, by default the source of the first `own_key` watch) shows a version
  other than the ones those writes made stale (the version the pass started from and
  its intermediate writes), the key is not reconciled but looked at again after
  `stale_recheck` seconds (the watch event of the write normally comes first and
  enqueues it anyway): deciding from a version the controller itself wrote over would
  redo finished work. After `stale_timeout` seconds the key is reconciled regardless
  (logged), so a lost watch event cannot wedge it. No resourceVersion is ever compared
  by order: they are opaque.
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
from typing import Any, Protocol, runtime_checkable

from prometheus_client import Counter, Histogram

from agentforge.kube.informer import EventHandler
from agentforge.kube.queue import Fairness, ShutDown, WorkQueue
from agentforge.kube.store import ObjectKey, object_key
from agentforge.ratelimit import Clock, RateLimiter

__all__ = [
    "STALE_RECHECK_S",
    "STALE_TIMEOUT_S",
    "Cache",
    "Controller",
    "MapFunc",
    "Reconcile",
    "Result",
    "Source",
    "Watch",
    "own_key",
    "resource_version",
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


STALE_RECHECK_S = 2.0
"""A key skipped because the cache is behind the controller's own write is looked at
again this soon at the latest."""
STALE_TIMEOUT_S = 30.0
"""After this long, a key whose cache still shows a version the controller wrote over
is reconciled anyway (a lost watch event must not wedge it)."""


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


@runtime_checkable
class Cache(Protocol):
    """The cache of the reconciled kind (an `informer.Informer`)."""

    def get_by_key(self, key: ObjectKey) -> JsonObj | None: ...


@dataclass(slots=True)
class _Stale:
    """The versions of a key the controller's own writes made stale, until when."""

    versions: frozenset[str]
    until: float


def resource_version(obj: JsonObj | None) -> str | None:
    """The object's `metadata.resourceVersion` (None when absent or empty): what a
    reconcile reports to `Controller.wrote` after a write."""
    if obj is None:
        return None
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return version if isinstance(version, str) and version else None


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
        cache: Cache | None = None,
        stale_recheck: float = STALE_RECHECK_S,
        stale_timeout: float = STALE_TIMEOUT_S,
        fairness: Fairness[ObjectKey] | None = None,
    ) -> None:
        """`fairness`: the group a key takes turns in (`WorkQueue`); None: one FIFO."""
        if workers < 1:
            raise ValueError("a controller needs at least one worker")
        self.name = name
        self.queue: WorkQueue[ObjectKey] = WorkQueue(
            name=name, rate_limiter=rate_limiter, clock=clock, fairness=fairness
        )
        self._clock = self.queue.clock  # one clock for the queue and these metrics
        self._reconcile = reconcile
        self._watches = tuple(watches)
        self._workers = workers
        self._pending_since: dict[ObjectKey, float] = {}
        self._cache = cache if cache is not None else _own_cache(watches)
        self._stale_recheck = stale_recheck
        self._stale_timeout = stale_timeout
        self._stale: dict[ObjectKey, _Stale] = {}
        self._writes: dict[ObjectKey, list[str]] = {}
        """Per key in reconcile: the version it started from, then those it wrote."""
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

    def wrote(self, key: ObjectKey, version: str) -> None:
        """The reconcile of `key` wrote its object; the server stored `version`
        (read-your-writes, see the module doc). Outside that reconcile: ignored."""
        if version and key in self._writes:
            self._writes[key].append(version)

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
        if self._cache_behind(key):
            self.queue.forget(key)
            self.queue.add_after(key, self._stale_recheck)
            self._total[Outcome.REQUEUE_AFTER].inc()
            return
        cached = resource_version(self._cache.get_by_key(key)) if self._cache is not None else None
        self._writes[key] = [cached or ""]
        try:
            with self._duration.time():
                result = await self._reconcile(key)
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
        finally:
            self._remember_writes(key)

    def _cache_behind(self, key: ObjectKey) -> bool:
        """The cache still shows a version of `key` this controller wrote over."""
        stale = self._stale.get(key)
        if stale is None or self._cache is None:
            return False
        version = resource_version(self._cache.get_by_key(key))
        if version is None or version not in stale.versions:
            del self._stale[key]  # newer (or gone): reconcile from it
            return False
        if self._clock() >= stale.until:
            del self._stale[key]
            log.warning(
                "%s: the cache still shows %s at resourceVersion %s, which this controller "
                "wrote over %.0fs ago (a lost watch event?); reconciling from it",
                self.name,
                key,
                version,
                self._stale_timeout,
            )
            return False
        return True

    def _remember_writes(self, key: ObjectKey) -> None:
        started, *written = self._writes.pop(key, [""])
        if not written:
            return
        latest = written[-1]
        versions = frozenset(v for v in (started, *written[:-1]) if v and v != latest)
        if versions:
            self._stale[key] = _Stale(versions, until=self._clock() + self._stale_timeout)


def _own_cache(watches: Sequence[Watch]) -> Cache | None:
    """The cache of the reconciled kind: the source of the first `own_key` watch."""
    for watch in watches:
        if watch.map is own_key and isinstance(watch.source, Cache):
            return watch.source
    return None
