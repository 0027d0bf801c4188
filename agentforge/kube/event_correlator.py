"""client-go's event correlator (`tools/record/events_cache.go`), as the recorder's rules.

For each Event to record, `Correlator.correlate` decides, with no I/O:

* **Aggregation** (`EventAggregator`): events about one object that differ only in
  their message (same source, involved object, type and reason) are "similar". The
  first 9 distinct messages within 10 minutes of the previous similar event keep
  their own events; from the 10th on, new messages become one event whose message
  is `(combined from similar events): ` + the latest message, counted rather than
  created again.
* **Groups** (this operator's addition): events of a reason the caller marks as
  combinable onto a group object (a VsphereAgent's creation progress onto its
  pool) are similar across the group's objects, as long as they come less than
  `group_interval` (60 s) apart: the first `group_threshold` (1) objects of such a
  burst keep their events; the others become one event on the group,
  `(combined from similar events): <kind> <namespace>/<name>: <latest message>`,
  counted. The burst's first event is marked `held`: the recorder waits
  `GROUP_HOLD_S` before writing it, and folds it into the group's event when a
  second object's comes meanwhile. So a VM made alone keeps its events on its
  objects; a burst is one event on the pool.
* **Correlation key** (`eventLogger`): identical events (or the members of one
  combined event) share a key; the recorder writes the first as a new Event and
  later ones as a count on it.
* **Spam filter** (`EventSourceObjectSpamFilter`): a token bucket per source,
  involved object and type (burst 25, then one per 5 minutes). client-go takes a
  token for every occurrence; the recorder asks only before creating a new Event,
  because it writes repeats of an Event at most once per flush interval anyway.

The caches are LRUs of 4096 entries each, as in client-go. `clock` is monotonic
seconds (the event loop's, so tests run on virtual time).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from agentforge.ratelimit import TokenBucket

__all__ = [
    "COMBINED_PREFIX",
    "Correlated",
    "Correlator",
    "Involved",
    "Lru",
]

COMBINED_PREFIX: Final = "(combined from similar events): "
MAX_EVENTS: Final = 10
"""Distinct messages of similar events, within the interval, before they are combined."""
INTERVAL_S: Final = 600.0
"""How long after the previous similar event a new one still counts as similar."""
GROUP_THRESHOLD: Final = 1
"""Objects of a group whose similar events stay on their objects, per burst."""
GROUP_INTERVAL_S: Final = 60.0
"""Similar events of a group's objects less than this apart are one burst."""
GROUP_HOLD_S: Final = 5.0
"""How long the recorder holds a burst's first event, waiting for a second object's."""
SPAM_BURST: Final = 25
SPAM_REFILL_PER_S: Final = 1.0 / 300.0
CACHE_SIZE: Final = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A bounded mapping that forgets the least recently used key first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: collections.OrderedDict[K, V] = collections.OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Involved:
    """An Event's `involvedObject`."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str = ""

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Involved:
        """From a full object or at least its `apiVersion`, `kind` and `metadata`."""
        meta = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion") or ""),
            kind=str(obj.get("kind") or ""),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    @property
    def identity(self) -> tuple[str, ...]:
        """Who the object is (not which version of it)."""
        return (self.api_version, self.kind, self.namespace, self.name, self.uid)

    def ref(self) -> dict[str, str]:
        out = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "resourceVersion": self.resource_version,
        }
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True, slots=True)
class Correlated:
    """What to write for one occurrence."""

    involved: Involved
    message: str
    key: tuple[Hashable, ...]
    """Occurrences with one key are one Event: the first creates it, the rest count."""
    combined: bool
    group_key: tuple[Hashable, ...] | None = None
    """The key of the group's combined event this event is part of the burst of."""
    held: bool = False
    """The first event of a group's burst: its object keeps it unless a second object's
    follows soon (the recorder holds it and may fold it into the group's event)."""


@dataclass(slots=True)
class _Similar:
    members: set[Hashable] = field(default_factory=set)
    last: float = 0.0


class Correlator:
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        max_events: int = MAX_EVENTS,
        interval: float = INTERVAL_S,
        group_threshold: int = GROUP_THRESHOLD,
        group_interval: float = GROUP_INTERVAL_S,
        spam_burst: int = SPAM_BURST,
        spam_refill_per_second: float = SPAM_REFILL_PER_S,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._clock = clock
        self._max_events = max_events
        self._interval = interval
        self._group_threshold = group_threshold
        self._group_interval = group_interval
        self._spam_burst = spam_burst
        self._spam_refill = spam_refill_per_second
        self._similar: Lru[tuple[Hashable, ...], _Similar] = Lru(cache_size)
        self._buckets: Lru[tuple[Hashable, ...], TokenBucket] = Lru(cache_size)

    def correlate(
        self,
        involved: Involved,
        *,
        type: str,
        reason: str,
        message: str,
        group: Involved | None = None,
    ) -> Correlated:
        group_key: tuple[Hashable, ...] | None = None
        held = False
        if group is not None and group.identity != involved.identity:
            group_key = ("group", *group.identity, type, reason)
            started = self._started(group_key)
            if self._combine(
                group_key,
                involved.identity,
                keep=self._group_threshold,
                interval=self._group_interval,
            ):
                about = f"{involved.kind} {_name(involved)}"
                return self._combined(group, type, group_key, f"{about}: {message}")
            held = not started
        aggregate_key = ("object", *involved.identity, type, reason)
        if self._combine(
            aggregate_key, message, keep=self._max_events - 1, interval=self._interval
        ):
            return self._combined(involved, type, aggregate_key, message)
        key = ("event", *involved.identity, type, reason, message)
        return Correlated(involved, message, key, combined=False, group_key=group_key, held=held)

    def _started(self, key: tuple[Hashable, ...]) -> bool:
        """Whether a burst of `key` is under way (a similar event within its interval)."""
        similar = self._similar.get(key)
        return similar is not None and self._clock() - similar.last <= self._group_interval

    def _combine(
        self, key: tuple[Hashable, ...], member: Hashable, *, keep: int, interval: float
    ) -> bool:
        """True when `member` is past the first `keep` of the similar events of `key`.

        The first `keep` members seen keep their own events (a bounded set); any
        other member is combined until `interval` passes without a similar event.
        """
        now = self._clock()
        similar = self._similar.get(key)
        if similar is None or now - similar.last > interval:
            similar = _Similar()
            self._similar.put(key, similar)
        similar.last = now
        if member in similar.members:
            return False
        if len(similar.members) < keep:
            similar.members.add(member)
            return False
        return True

    def _combined(
        self, involved: Involved, type: str, key: tuple[Hashable, ...], message: str
    ) -> Correlated:
        return Correlated(involved, COMBINED_PREFIX + message, key, combined=True)

    def allow(self, involved: Involved, type: str) -> bool:
        """The spam filter: may a new Event about `involved` of `type` be created now?"""
        key = (*involved.identity, type)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(rate=self._spam_refill, burst=self._spam_burst, clock=self._clock)
            self._buckets.put(key, bucket)
        return bucket.try_take()


def _name(involved: Involved) -> str:
    return f"{involved.namespace}/{involved.name}" if involved.namespace else involved.name
