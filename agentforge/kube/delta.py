"""How an observation changes the cache, and which handler event it produces.

Pure decisions over a `store.Store`, kept apart from the reflector's I/O so the
rules are unit-tested on their own:

* An object whose resourceVersion (and uid) did not change produces **no** event:
  a resumed watch or a relist that replays a known state is silent.
* A name whose uid changed is a different object: DELETED(old) then ADDED(new).
* A relist (`Relist`) is streamed page by page: every listed object is applied as
  above, and when the list completes, every cached object in the relist's scope
  that the list did not contain is DELETED. Scope is a namespace (or everything),
  so several per-namespace reflectors can share one store.
* A watch DELETED for an object that is not cached produces no event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentforge.kube.store import ObjectKey, Store, object_key

__all__ = ["Change", "ChangeType", "Relist", "apply_delete", "apply_upsert"]


class ChangeType(StrEnum):
    ADDED = "ADDED"
    UPDATED = "UPDATED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Change:
    """One handler event.

    ADDED: `new`. UPDATED: `old` and `new`. DELETED: `old` (the cached state) and
    `new` only when the server reported the final state (a watch DELETED event).
    """

    type: ChangeType
    key: ObjectKey
    old: dict[str, Any] | None
    new: dict[str, Any] | None

    @property
    def object(self) -> dict[str, Any]:
        obj = self.new if self.new is not None else self.old
        assert obj is not None
        return obj


def _version(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))


def apply_upsert(store: Store, obj: dict[str, Any]) -> list[Change]:
    """Cache `obj` (ADDED/MODIFIED or a listed item); return the events it causes."""
    key = object_key(obj)
    old = store.get(key)
    if old is None:
        store.put(obj)
        return [Change(ChangeType.ADDED, key, None, obj)]
    old_uid, old_rv = _version(old)
    new_uid, new_rv = _version(obj)
    if old_uid != new_uid:
        store.put(obj)
        return [
            Change(ChangeType.DELETED, key, old, None),
            Change(ChangeType.ADDED, key, None, obj),
        ]
    if old_rv == new_rv:
        return []
    store.put(obj)
    return [Change(ChangeType.UPDATED, key, old, obj)]


def apply_delete(store: Store, obj: dict[str, Any]) -> list[Change]:
    """Drop the object a watch DELETED event names; its final state is `obj`."""
    key = object_key(obj)
    old = store.get(key)
    if old is None:
        return []
    old_uid, _ = _version(old)
    new_uid, _ = _version(obj)
    if new_uid and old_uid and new_uid != old_uid:
        return []  # a delete of an older incarnation we never cached; keep the newer one
    store.pop(key)
    return [Change(ChangeType.DELETED, key, old, obj)]


class Relist:
    """One streamed relist of `namespace` (None: every cached key) into `store`."""

    def __init__(self, store: Store, *, namespace: str | None) -> None:
        self._store = store
        self._namespace = namespace
        self._seen: set[ObjectKey] = set()

    def apply(self, items: Iterable[dict[str, Any]]) -> list[Change]:
        changes: list[Change] = []
        for obj in items:
            self._seen.add(object_key(obj))
            changes.extend(apply_upsert(self._store, obj))
        return changes

    def finish(self) -> list[Change]:
        """The list is complete: whatever it did not contain is gone."""
        changes: list[Change] = []
        for key in self._store.keys(namespace=self._namespace):
            if key not in self._seen:
                old = self._store.pop(key)
                if old is not None:
                    changes.append(Change(ChangeType.DELETED, key, old, None))
        self._seen.clear()
        return changes
