"""Kubernetes Events (core/v1) about our objects, aggregated and rate-limited.

Promises (client-go `tools/record`, simplified):

* **Aggregation**: the same (involved object, type, reason, message) recorded again
  within `window` seconds bumps `count` and `lastTimestamp` of the Event already
  written (a merge patch) instead of creating another. If that Event is gone
  (expired by the apiserver's TTL) a new one is created.
* **Spam filter**: a token bucket per involved object (default burst 25, then one
  per 5 minutes, as client-go) so a hot reconcile loop cannot flood the API.
  Dropped events are logged at debug level.
* **Never raises** into the caller: recording is best effort; failures are logged.
  (`asyncio.CancelledError` still propagates: cancellation is not a failure.)
* **Plain text**: messages are cut to 1 KiB and pass the same redaction as log lines
  (`agentforge.redaction.redact`: URL passwords and API keys, bearer tokens,
  `password=`/`token:` values, JWTs), which leaves ordinary words alone.

`record` awaits the API write rather than spawning a task, so no background work
outlives its caller.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from agentforge import redaction
from agentforge.api.kinds import EVENT, Kind
from agentforge.kube import errors
from agentforge.kube.ratelimit import Clock, TokenBucket

__all__ = ["EventRecorder", "EventType", "scrub"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]

MAX_MESSAGE = 1024


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


@dataclass(slots=True)
class _Written:
    name: str
    namespace: str
    count: int
    seen_at: float


_AggregationKey = tuple[str, str, str, str, str, str]


class EventRecorder:
    """Writes Events for one component (e.g. "agent-forge") from one host."""

    def __init__(
        self,
        *,
        client: EventWriter,
        component: str,
        host: str = "",
        window: float = 600.0,
        burst: int = 25,
        refill_per_second: float = 1.0 / 300.0,
        cache_size: int = 4096,
        clock: Clock = time.monotonic,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._window = window
        self._burst = burst
        self._refill = refill_per_second
        self._cache_size = cache_size
        self._clock = clock
        self._wall_clock = wall_clock
        self._written: collections.OrderedDict[_AggregationKey, _Written] = (
            collections.OrderedDict()
        )
        self._buckets: collections.OrderedDict[str, TokenBucket] = collections.OrderedDict()
        self._locks: weakref.WeakValueDictionary[_AggregationKey, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._sequence = itertools.count()

    async def record(
        self,
        obj: Mapping[str, Any],
        *,
        type: EventType,
        reason: str,
        message: str,
    ) -> None:
        """Record an Event about `obj` (a full object or at least its identity fields)."""
        try:
            await self._record(obj, type=type, reason=reason, message=scrub(message))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - best effort: never fail a reconcile
            log.warning(
                "could not record event %s/%s about %s: %s",
                type,
                reason,
                _describe(obj),
                exc,
            )

    async def _record(
        self, obj: Mapping[str, Any], *, type: EventType, reason: str, message: str
    ) -> None:
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": obj.get("apiVersion", ""),
            "kind": obj.get("kind", ""),
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
        }
        if meta.get("resourceVersion"):
            involved["resourceVersion"] = meta["resourceVersion"]
        identity = involved["uid"] or "/".join(
            (involved["kind"], involved["namespace"], involved["name"])
        )
        if not self._allow(identity):
            log.debug("event %s about %s dropped by the spam filter", reason, _describe(obj))
            return
        key: _AggregationKey = (identity, involved["kind"], involved["name"], type, reason, message)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            now_mono = self._clock()
            now = _rfc3339(self._wall_clock())
            written = self._written.get(key)
            if written is not None and now_mono - written.seen_at <= self._window:
                try:
                    await self._client.patch_merge(
                        EVENT,
                        namespace=written.namespace,
                        name=written.name,
                        patch={"count": written.count + 1, "lastTimestamp": now},
                    )
                except errors.NotFound:
                    pass  # expired by the apiserver's TTL: write a fresh one below
                else:
                    written.count += 1
                    written.seen_at = now_mono
                    self._written.move_to_end(key)
                    return
            namespace = involved["namespace"] or "default"
            name = f"{involved['name'] or 'event'}.{time.time_ns():x}{next(self._sequence):x}"
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {k: v for k, v in involved.items() if v},
                "type": str(type),
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {
                    "component": self._component,
                    **({"host": self._host} if self._host else {}),
                },
                "reportingComponent": self._component,
                "reportingInstance": self._host or self._component,
            }
            await self._client.create(EVENT, event, namespace=namespace)
            self._written[key] = _Written(name=name, namespace=namespace, count=1, seen_at=now_mono)
            self._written.move_to_end(key)
            while len(self._written) > self._cache_size:
                self._written.popitem(last=False)

    def _allow(self, identity: str) -> bool:
        bucket = self._buckets.get(identity)
        if bucket is None:
            bucket = TokenBucket(rate=self._refill, burst=self._burst, clock=self._clock)
            self._buckets[identity] = bucket
            while len(self._buckets) > self._cache_size:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(identity)
        return bucket.try_take()


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = (
        f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else meta.get("name")
    )
    return f"{obj.get('kind', 'object')} {name}"
