"""Facts extracted once per object version, forgotten when the object changes or goes.

The pool controller plans thousands of Agents on every relevant event; parsing each
cached Agent again each time would cost more than the plan itself. A `FactsMemo`
keeps `extract(obj)` per object key together with the resourceVersion it was made
from, and subscribes to its informer so an updated or deleted object's entry is
dropped at once (memory stays bounded by the cache). An object whose extraction
fails is logged once per version and skipped, never allowed to stop a reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from agentforge.kube.informer import EventHandler, Informer
from agentforge.kube.store import ObjectKey, object_key

log = logging.getLogger(__name__)

T = TypeVar("T")
JsonObj = dict[str, Any]


class FactsMemo(Generic[T]):
    """`extract` memoised per (object key, resourceVersion) for one informer."""

    def __init__(self, *, informer: Informer, extract: Callable[[Mapping[str, Any]], T]) -> None:
        self._extract = extract
        self._kind = informer.kind.kind
        self._entries: dict[ObjectKey, tuple[str, T | None]] = {}
        informer.add_handler(EventHandler(on_update=self._on_update, on_delete=self._forget))

    def __len__(self) -> int:
        return len(self._entries)

    def facts(self, obj: JsonObj) -> T | None:
        """The facts of `obj` (None when they cannot be extracted)."""
        key = object_key(obj)
        version = str(obj["metadata"].get("resourceVersion", ""))
        entry = self._entries.get(key)
        if entry is not None and entry[0] == version:
            return entry[1]
        facts: T | None
        try:
            facts = self._extract(obj)
        except Exception as exc:  # noqa: BLE001 - one odd object must not stop planning
            log.warning("%s %s cannot be read and is ignored: %s", self._kind, key, exc)
            facts = None
        self._entries[key] = (version, facts)
        return facts

    def all(self, objs: Iterable[JsonObj]) -> list[T]:
        """The facts of each object that has some."""
        out: list[T] = []
        for obj in objs:
            facts = self.facts(obj)
            if facts is not None:
                out.append(facts)
        return out

    def _on_update(self, old: JsonObj, new: JsonObj) -> None:
        self._forget(old)

    def _forget(self, obj: JsonObj) -> None:
        self._entries.pop(object_key(obj), None)
