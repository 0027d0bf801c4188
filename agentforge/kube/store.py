"""The informer's cache: trimmed objects by key, with secondary indexes.

Promises (client-go `tools/cache` `ThreadSafeStore` + `Indexer`, minus threads: the
store lives on one event loop and is only written by its informer):

* Objects are addressed by `ObjectKey` ("<namespace>/<name>", or "<name>" for
  cluster-scoped kinds), the same string the work queue carries.
* An index is a function from an object to the index values it files under;
  `by_index(name, value)` answers from a map kept up to date on every write, so a
  reconciler's "all Agents of this InfraEnv" is a dict lookup, not a scan.
  The `namespace` index always exists.
* `revision` changes on every write, so a reader may keep what it derived from the
  cache until the cache changes (e.g. the pool snapshot's claims).
* Callers get the cached dict itself (no copy, to keep memory and CPU flat): treat
  it as read-only, copy before mutating.
* How an observation changes the store, and which handler event it produces
  (`apply_upsert`, `apply_delete`, `Relist`), are pure decisions kept apart from the
  reflector's I/O (below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NewType

__all__ = [
    "NAMESPACE_INDEX",
    "Change",
    "ChangeType",
    "IndexFunc",
    "ObjectKey",
    "Relist",
    "Store",
    "apply_delete",
    "apply_upsert",
    "key_for",
    "object_key",
    "split_key",
]

ObjectKey = NewType("ObjectKey", str)
IndexFunc = Callable[[dict[str, Any]], Iterable[str]]

NAMESPACE_INDEX = "namespace"


def key_for(*, namespace: str | None, name: str) -> ObjectKey:
    return ObjectKey(f"{namespace}/{name}" if namespace else name)


def object_key(obj: dict[str, Any]) -> ObjectKey:
    meta = obj["metadata"]
    return key_for(namespace=meta.get("namespace"), name=meta["name"])


def split_key(key: ObjectKey) -> tuple[str | None, str]:
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else (None, namespace)


def _namespace_of(obj: dict[str, Any]) -> Iterable[str]:
    namespace = obj["metadata"].get("namespace")
    return (namespace,) if namespace else ()


class Store:
    """Objects by key plus maintained indexes; single event loop, no locking."""

    def __init__(self) -> None:
        self._items: dict[ObjectKey, dict[str, Any]] = {}
        self._indexers: dict[str, IndexFunc] = {}
        # index name -> index value -> keys; and the values each key is filed under.
        # One key (one value) is stored bare, not in a set (a 1-tuple): identity
        # indexes file 10,000 Agents under 10,000 values, and a set costs 216 bytes.
        self._indices: dict[str, dict[str, ObjectKey | set[ObjectKey]]] = {}
        self._filed: dict[str, dict[ObjectKey, str | tuple[str, ...]]] = {}
        self._revision = 0
        self.add_index(NAMESPACE_INDEX, _namespace_of)

    @property
    def revision(self) -> int:
        """A counter that changes whenever an object is stored or removed."""
        return self._revision

    # --- indexes ---------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Register an index; existing objects are filed at once."""
        if name in self._indexers:
            raise ValueError(f"index {name!r} already exists")
        self._indexers[name] = fn
        self._indices[name] = {}
        self._filed[name] = {}
        for key, obj in self._items.items():
            self._file(name, key, obj)

    def by_index(self, name: str, value: str) -> list[dict[str, Any]]:
        return [self._items[key] for key in self.index_keys(name, value)]

    def index_keys(self, name: str, value: str) -> set[ObjectKey]:
        try:
            index = self._indices[name]
        except KeyError:
            raise KeyError(f"no index named {name!r}") from None
        keys = index.get(value)
        if keys is None:
            return set()
        return {keys} if isinstance(keys, str) else set(keys)

    # --- reads -----------------------------------------------------------------------

    def get(self, key: ObjectKey) -> dict[str, Any] | None:
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(list(self._items))

    def keys(self, *, namespace: str | None = None) -> list[ObjectKey]:
        if namespace is None:
            return list(self._items)
        return list(self.index_keys(NAMESPACE_INDEX, namespace))

    def list(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return list(self._items.values())
        return self.by_index(NAMESPACE_INDEX, namespace)

    # --- writes (the informer's) ----------------------------------------------------

    def put(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Store `obj` under its key; return the object it replaced, if any."""
        key = object_key(obj)
        self._revision += 1
        old = self._items.get(key)
        if old is not None:
            self._unfile_all(key)
        self._items[key] = obj
        for name in self._indexers:
            self._file(name, key, obj)
        return old

    def pop(self, key: ObjectKey) -> dict[str, Any] | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._revision += 1
            self._unfile_all(key)
        return old

    def _file(self, name: str, key: ObjectKey, obj: dict[str, Any]) -> None:
        values = tuple(dict.fromkeys(self._indexers[name](obj)))
        if not values:
            return
        self._filed[name][key] = values[0] if len(values) == 1 else values
        index = self._indices[name]
        for value in values:
            keys = index.get(value)
            if keys is None:
                index[value] = key
            elif isinstance(keys, str):
                if keys != key:
                    index[value] = {keys, key}
            else:
                keys.add(key)

    def _unfile_all(self, key: ObjectKey) -> None:
        for name, filed in self._filed.items():
            filed_as = filed.pop(key, ())
            values = (filed_as,) if isinstance(filed_as, str) else filed_as
            index = self._indices[name]
            for value in values:
                keys = index.get(value)
                if keys is None:
                    continue
                if isinstance(keys, str):
                    if keys == key:
                        del index[value]
                    continue
                keys.discard(key)
                if len(keys) == 1:
                    index[value] = next(iter(keys))
                elif not keys:
                    del index[value]


# How an observation changes the cache, and which handler event it produces.
#
# Pure decisions over a `store.Store`, kept apart from the reflector's I/O so the
# rules are unit-tested on their own:
#
# * An object whose resourceVersion (and uid) did not change produces **no** event:
#   a resumed watch or a relist that replays a known state is silent.
# * A name whose uid changed is a different object: DELETED(old) then ADDED(new).
# * A relist (`Relist`) is streamed page by page: every listed object is applied as
#   above, and when the list completes, every cached object in the relist's scope
#   that the list did not contain is DELETED. Scope is a namespace (or everything),
#   so several per-namespace reflectors can share one store.
# * A watch DELETED for an object that is not cached produces no event.


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
