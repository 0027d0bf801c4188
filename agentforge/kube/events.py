"""Kubernetes Events (core/v1) about our objects: correlated as client-go does, repeats batched.

Promises:

* **client-go's correlator** (`event_correlator`): similar events (one object, type
  and reason, different messages) are combined after 9 distinct messages within
  10 minutes; identical events are one Event whose `count` and `lastTimestamp`
  grow; a spam filter per object and type (burst 25, then one per 5 minutes) on
  the creation of new Events.
* **Groups**: the caller (or the `group_of` policy given at construction) may name
  a group object for an event, e.g. the pool of a VsphereAgent. In a burst (events
  of one reason less than a minute apart) the objects' events are counted onto one
  `(combined from similar events)` event on the group. The burst's first event is
  held `group_hold` (5 s): when no other object's follows by then it is created on
  its own object (a VM made alone keeps its events, 5 s late); when one does, it
  is folded into the group's event. Only reasons whose facts the objects also
  show (a condition, a label) are grouped.
* **A new Event is created at once; repeats are batched.** A repeat of an Event
  written less than `flush_interval` (30 s) ago is counted in memory and written
  as one merge patch (`count`, `lastTimestamp`, the latest message) when that
  interval has passed; an isolated repeat is written at once. So a hot loop or a
  burst of similar events costs one write per Event per 30 s, not one per
  occurrence. A combined event (above) is created with the count it has reached
  `flush_interval` after its own first occurrence (the burst's second object): one
  create for a burst of up to 30 s, not a create and a patch soon after. A later
  burst onto the same combined Event (its first event folded in as above) is one
  patch, `flush_interval` after that burst's second object, however long the
  group's Event was quiet before. The
  writes are made by one flusher task: for the recorder's life after `start()`
  (the app's), else only while something is
  pending. `flush()` writes everything pending now (a clean shutdown does),
  `close()` drops it (a lost Lease must not write). A patch that finds the Event
  gone (the apiserver's TTL) creates a new one with the count.
* **Never raises** into the caller: recording is best effort; failures are logged.
  (`asyncio.CancelledError` still propagates: cancellation is not a failure.)
* **Plain text**: messages are cut to 1 KiB and pass the same redaction as log lines
  (`agentforge.redaction.redact`: URL user info and API keys, bearer tokens,
  `password=`/`token:` values, JWTs; docs/security.md#what-is-redacted).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol

from agentforge import redaction
from agentforge.api.kinds import EVENT, Kind
from agentforge.kube import errors
from agentforge.kube.event_correlator import (
    GROUP_HOLD_S,
    Correlated,
    Correlator,
    Involved,
    Lru,
)
from agentforge.ratelimit import Clock

__all__ = ["FLUSH_INTERVAL_S", "EventRecorder", "EventType", "GroupOf", "scrub"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]

MAX_MESSAGE = 1024
FLUSH_INTERVAL_S: Final = 30.0
"""At most one write per Event per this many seconds while it repeats."""

GroupOf = Callable[[Mapping[str, Any], str, str], Mapping[str, Any] | None]
"""(object, type, reason) -> the group object its event may be combined onto, or None."""


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventWriter(Protocol):
    """What the recorder needs from `client.KubeClient`."""

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj: ...

    async def patch_merge(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> JsonObj: ...


def scrub(message: str) -> str:
    """Credentials redacted, then cut to `MAX_MESSAGE` (redacted first: a cut must not
    leave a credential's head that no rule recognises any more)."""
    message = redaction.redact(message)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return message


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@dataclass(slots=True)
class _Logged:
    """One Event as written, and the occurrences since (client-go's `eventLog`)."""

    correlated: Correlated
    type: str
    reason: str
    name: str
    count: int
    """Occurrences so far, written or not."""
    written: int
    """The count the API server holds."""
    written_message: str
    last_timestamp: str
    written_at: float
    first_timestamp: str = ""
    """Set while the Event is not created yet (a combined event waits for its first
    flush, a burst's first event for the end of its hold); `name` is empty until then."""


class EventRecorder:
    """Writes Events for one component (e.g. "agent-forge") from one host."""

    def __init__(
        self,
        *,
        client: EventWriter,
        component: str,
        host: str = "",
        flush_interval: float = FLUSH_INTERVAL_S,
        group_of: GroupOf | None = None,
        burst: int = 25,
        refill_per_second: float = 1.0 / 300.0,
        group_threshold: int = 1,
        group_interval: float = 60.0,
        group_hold: float = GROUP_HOLD_S,
        cache_size: int = 4096,
        clock: Clock = _loop_time,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._flush_interval = flush_interval
        self._group_hold = group_hold
        self._group_of = group_of
        self._clock = clock
        self._wall_clock = wall_clock
        self._correlator = Correlator(
            clock=clock,
            spam_burst=burst,
            spam_refill_per_second=refill_per_second,
            group_threshold=group_threshold,
            group_interval=group_interval,
            cache_size=cache_size,
        )
        self._logged: Lru[tuple[Hashable, ...], _Logged] = Lru(cache_size)
        self._due: dict[tuple[Hashable, ...], float] = {}
        self._held: dict[tuple[Hashable, ...], tuple[Hashable, ...]] = {}
        """A group's combined-event key -> the key of its burst's first event, held."""
        self._locks: weakref.WeakValueDictionary[tuple[Hashable, ...], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._flusher: asyncio.Task[None] | None = None
        self._persistent = False
        self._wake = asyncio.Event()
        self._sequence = itertools.count()

    @property
    def pending(self) -> int:
        """Events with occurrences counted but not written yet."""
        return len(self._due)

    async def record(
        self,
        obj: Mapping[str, Any],
        *,
        type: EventType,
        reason: str,
        message: str,
        group: Mapping[str, Any] | None = None,
    ) -> None:
        """Record an Event about `obj` (a full object or at least its identity fields);
        `group`: the object it may be combined onto (else the `group_of` policy's)."""
        try:
            if group is None and self._group_of is not None:
                group = self._group_of(obj, str(type), reason)
            correlated = self._correlator.correlate(
                Involved.of(obj),
                type=str(type),
                reason=reason,
                message=scrub(message),
                group=Involved.of(group) if group is not None else None,
            )
            await self._observe(correlated, type=str(type), reason=reason)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - best effort: never fail a reconcile
            log.warning(
                "could not record event %s/%s about %s: %s", type, reason, _describe(obj), exc
            )

    def start(self) -> None:
        """Run the flusher for the recorder's life, from now (without this, one is
        started when something is pending, and ends when nothing is)."""
        if self._flusher is None or self._flusher.done():
            self._persistent = True
            self._flusher = asyncio.create_task(self._flush_loop(), name="event flusher")

    async def flush(self) -> None:
        """Write every counted occurrence now (a clean shutdown does this)."""
        if not self._persistent:
            await self._stop_flusher()
        for key in list(self._due):
            await self._write_pending(key)

    async def close(self) -> None:
        """Stop the flusher; what is pending is dropped."""
        self._persistent = False
        await self._stop_flusher()
        if self._due:
            log.debug("dropping the counts of %d pending event(s)", len(self._due))
        self._due.clear()
        self._held.clear()

    async def _stop_flusher(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None

    # --- one occurrence ------------------------------------------------------------------

    def _lock(self, key: tuple[Hashable, ...]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _observe(self, correlated: Correlated, *, type: str, reason: str) -> None:
        key = correlated.key
        async with self._lock(key):
            stamp = _rfc3339(self._wall_clock())
            logged = self._logged.get(key)
            if logged is None:
                if not self._correlator.allow(correlated.involved, type):
                    log.debug(
                        "event %s about %s %s/%s dropped by the spam filter",
                        reason,
                        correlated.involved.kind,
                        correlated.involved.namespace,
                        correlated.involved.name,
                    )
                    return
                # a repeat of its burst, or a burst's held first: created with its count
                later = correlated.combined or (correlated.held and self._group_hold > 0)
                name = "" if later else await self._create(
                    correlated, type=type, reason=reason, count=1, at=stamp
                )  # fmt: skip
                entry = _Logged(
                    correlated=correlated,
                    type=type,
                    reason=reason,
                    name=name,
                    count=1,
                    written=0 if later else 1,
                    written_message="" if later else correlated.message,
                    last_timestamp=stamp,
                    written_at=self._clock(),
                    first_timestamp=stamp if later else "",
                )
                self._logged.put(key, entry)
                if correlated.combined:
                    self._fold_held(key, entry)
                    self._schedule(key, self._clock() + self._flush_interval)
                elif later and correlated.group_key is not None:
                    self._held[correlated.group_key] = key
                    self._schedule(key, self._clock() + self._group_hold)
                return
            logged.count += 1
            logged.correlated = correlated
            logged.last_timestamp = stamp
            if correlated.combined:  # a burst again, onto the group's Event of an earlier one
                self._fold_held(key, logged)
                if key not in self._due:  # its count written once the burst is 30 s old
                    self._schedule(key, self._clock() + self._flush_interval)
                return
            due = logged.written_at + self._flush_interval
            if self._clock() >= due and key not in self._due:
                await self._write(key, logged)
            else:
                self._schedule(key, due)

    def _fold_held(self, key: tuple[Hashable, ...], combined: _Logged) -> None:
        """The held first event of this combined event's burst, not written yet, is
        counted into it instead (its first timestamp too)."""
        first_key = self._held.pop(key, None)
        if first_key is None:
            return
        first = self._logged.get(first_key)
        if first is None or first.name or first.written or self._lock(first_key).locked():
            return  # written (or being written) on its object: it keeps it
        self._logged.pop(first_key)
        self._due.pop(first_key, None)
        combined.count += first.count
        if not combined.name:  # (an Event created already keeps its firstTimestamp)
            combined.first_timestamp = first.first_timestamp

    async def _create(
        self,
        correlated: Correlated,
        *,
        type: str,
        reason: str,
        count: int,
        at: str,
        first: str = "",
    ) -> str:
        involved = correlated.involved
        namespace = involved.namespace or "default"
        name = f"{involved.name or 'event'}.{time.time_ns():x}{next(self._sequence):x}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved.ref(),
            "type": type,
            "reason": reason,
            "message": correlated.message,
            "count": count,
            "firstTimestamp": first or at,
            "lastTimestamp": at,
            "source": {
                "component": self._component,
                **({"host": self._host} if self._host else {}),
            },
            "reportingComponent": self._component,
            "reportingInstance": self._host or self._component,
        }
        await self._client.create(EVENT, event, namespace=namespace)
        return name

    async def _write(self, key: tuple[Hashable, ...], logged: _Logged) -> None:
        """The counted occurrences as one patch (a create when the Event is gone, or when
        it is a combined event not created yet)."""
        patch: JsonObj = {"count": logged.count, "lastTimestamp": logged.last_timestamp}
        message = logged.correlated.message
        if message != logged.written_message:
            patch["message"] = message
        namespace = logged.correlated.involved.namespace or "default"
        first = ""
        if not logged.name:  # a combined or held event's first write: created with its count
            first = logged.first_timestamp
        else:
            try:
                await self._client.patch_merge(
                    EVENT, namespace=namespace, name=logged.name, patch=patch
                )
            except errors.NotFound:  # expired by the apiserver's TTL: a fresh one, counted
                pass
            else:
                self._wrote(key, logged, message)
                return
        logged.name = await self._create(
            logged.correlated,
            type=logged.type,
            reason=logged.reason,
            count=logged.count,
            at=logged.last_timestamp,
            first=first,
        )
        self._wrote(key, logged, message)

    def _wrote(self, key: tuple[Hashable, ...], logged: _Logged, message: str) -> None:
        logged.written = logged.count
        logged.written_message = message
        logged.written_at = self._clock()
        logged.first_timestamp = ""
        self._due.pop(key, None)
        group_key = logged.correlated.group_key
        if group_key is not None and self._held.get(group_key) == key:
            del self._held[group_key]

    async def _write_pending(self, key: tuple[Hashable, ...]) -> None:
        """Write what is counted for `key` (it leaves the pending set, written or not)."""
        async with self._lock(key):
            logged = self._logged.get(key)
            if logged is None or logged.written >= logged.count:
                self._due.pop(key, None)
                return
            try:
                await self._write(key, logged)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - best effort, as `record`
                self._due.pop(key, None)  # the next occurrence writes the count again
                involved = logged.correlated.involved
                log.warning(
                    "could not record event %s/%s about %s %s/%s: %s",
                    logged.type,
                    logged.reason,
                    involved.kind,
                    involved.namespace,
                    involved.name,
                    exc,
                )

    # --- the flusher -----------------------------------------------------------------

    def _schedule(self, key: tuple[Hashable, ...], due: float) -> None:
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        self._wake.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="event flusher")

    async def _flush_loop(self) -> None:
        while self._due or self._persistent:
            if not self._due:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self._clock()
            ready = [key for key, due in self._due.items() if due <= now]
            if not ready:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # (no helper task, unlike wait_for)
                    async with asyncio.timeout(min(self._due.values()) - now):
                        await self._wake.wait()
                continue
            for key in ready:
                await self._write_pending(key)


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = (
        f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else meta.get("name")
    )
    return f"{obj.get('kind', 'object')} {name}"
