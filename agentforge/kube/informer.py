"""A shared, indexed cache of one kind kept current by LIST + WATCH (a reflector).

The contract (client-go `tools/cache/reflector.go`, DESIGN.md "Informer"):

* LIST in pages (`limit`/`continue`; only one page of raw JSON in memory), then
  WATCH from the list's resourceVersion with bookmarks.
* A watch that ends or breaks is resumed from the last resourceVersion seen
  (events and bookmarks), so nothing is missed and nothing replayed.
* 410 Gone (at open, as an ERROR event, or on an expired continue token) means the
  version is compacted away: relist, and reconcile the cache with the fresh list
  (`store.Relist`): synthetic ADDED/UPDATED/DELETED for what changed, nothing for
  objects whose resourceVersion did not change.
* Any other failure backs off with jitter (0.8 s doubling to 30 s) and retries
  forever, and so does a watch that ends empty within a second (a server or proxy
  closing streams at once must not be hammered); the backoff resets once a watch
  has been healthy for a while.
* Each object passes through `transform` (default `api.trim.trim_any`) before it
  is cached, so only trimmed dicts are kept. A kind's `api.trim.Trimmer` also
  decodes its LIST pages to the fields it keeps (`kube.pages`): the rest of an
  object is skipped while parsing, never built.
* An optional `parse` hook turns a cached object into the record its readers use
  (`record(key)`), once per object version, on the first read: the sync path parses
  nothing (start-up pays for the list alone), and an object no reader asks for is
  never parsed. A change drops the record before handlers run, so a handler reads
  the new version's. The informer knows nothing of the kinds: the composition root
  supplies each kind's parser. An object the parser rejects is logged once per
  version and has no record (it stays cached).
* Handlers run synchronously on the informer's task, in event order, after the
  cache is updated; they should only enqueue. A handler that raises is logged and
  does not stop the informer. A handler added late first receives ADDED for every
  cached object.
* `await synced()` returns once every namespace's first LIST is in the cache.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

from agentforge.api.kinds import Kind
from agentforge.api.trim import Trim, Trimmer, trim_any
from agentforge.kube import errors, pages
from agentforge.kube.store import (
    Change,
    ChangeType,
    IndexFunc,
    ObjectKey,
    Relist,
    Store,
    apply_delete,
    apply_upsert,
    key_for,
)
from agentforge.kube.transport import Decode
from agentforge.kube.watch import EventType, WatchEvent
from agentforge.ratelimit import Backoff

__all__ = ["EventHandler", "Informer", "ListWatcher"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]

_SHORT_WATCH = 1.0  # seconds: an empty watch ending sooner counts as a failure
_UNREAD: Any = object()  # no record parsed yet for this version


@dataclass(frozen=True, slots=True)
class _Rejected:
    """The parser rejected this version (logged once)."""

    error: Exception


class _Page(Protocol):
    @property
    def items(self) -> list[JsonObj]: ...

    @property
    def resource_version(self) -> str: ...


class _Stream(Protocol):
    async def __aenter__(self) -> AsyncIterator[WatchEvent]: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...


class ListWatcher(Protocol):
    """What the informer needs from `client.KubeClient` (fakes implement it in tests)."""

    def list_pages(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        decode: Decode = json.loads,
    ) -> AsyncGenerator[_Page, None]: ...

    def watch(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        allow_bookmarks: bool = True,
    ) -> _Stream: ...


@dataclass(frozen=True, slots=True)
class EventHandler:
    """Callbacks for cache changes; any may be None."""

    on_add: Callable[[JsonObj], None] | None = None
    on_update: Callable[[JsonObj, JsonObj], None] | None = None
    on_delete: Callable[[JsonObj], None] | None = None


class Informer:
    """LIST+WATCH cache of `kind`, optionally limited to namespaces and selectors."""

    def __init__(
        self,
        *,
        client: ListWatcher,
        kind: Kind,
        namespaces: Sequence[str] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Trim = trim_any,
        parse: Callable[[JsonObj], object] | None = None,
        page_size: int = 500,
        watch_timeout: tuple[int, int] = (300, 600),
        healthy_after: float = 60.0,
        backoff_initial: float = 0.8,
        backoff_cap: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.kind = kind
        self.store = Store()
        self._client = client
        self._namespaces: tuple[str | None, ...] = tuple(namespaces) if namespaces else (None,)
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._transform = transform
        self._decode: Decode = json.loads
        if isinstance(transform, Trimmer):  # a kind's own trim: decode pages to it
            self._decode = pages.decoder(transform.keep)
        self._parse = parse
        self._records: dict[ObjectKey, object] = {}
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._healthy_after = healthy_after
        self._backoff_bounds = (backoff_initial, backoff_cap)
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._handlers: list[EventHandler] = []
        self._synced_namespaces: set[str | None] = set()
        self._synced = asyncio.Event()
        self._last_rv: dict[str | None, str] = {}
        self._progressed: dict[str | None, bool] = {}  # events applied since the last list
        self._task: asyncio.Task[None] | None = None

    # --- cache reads ------------------------------------------------------------------

    def get(self, *, namespace: str | None = None, name: str) -> JsonObj | None:
        return self.store.get(key_for(namespace=namespace, name=name))

    def get_by_key(self, key: ObjectKey) -> JsonObj | None:
        return self.store.get(key)

    def list(self, *, namespace: str | None = None) -> builtins.list[JsonObj]:
        return self.store.list(namespace=namespace)

    def keys(self, *, namespace: str | None = None) -> builtins.list[ObjectKey]:
        return self.store.keys(namespace=namespace)

    @property
    def revision(self) -> int:
        """Changes whenever the cache does (`Store.revision`); records are replaced
        in the same step, so what a reader derived from them is current until then."""
        return self.store.revision

    @property
    def parses(self) -> bool:
        """Whether this informer keeps a parsed record per cached object."""
        return self._parse is not None

    def record(self, key: ObjectKey) -> object | None:
        """The parsed record of the cached object `key` (None without a parser, for an
        unknown key, or when the parser rejected the object); parsed on the first read
        of each version."""
        found = self._records.get(key, _UNREAD)
        if found is _UNREAD:
            obj = self.store.get(key)
            if obj is None or self._parse is None:
                return None
            found = self._records[key] = self._parsed(key, obj)
        return None if isinstance(found, _Rejected) else found

    def rejection(self, key: ObjectKey) -> Exception | None:
        """Why the parser rejected the cached object `key` (None when it did not)."""
        self.record(key)
        found = self._records.get(key)
        return found.error if isinstance(found, _Rejected) else None

    def add_index(self, name: str, fn: IndexFunc) -> None:
        self.store.add_index(name, fn)

    def by_index(self, name: str, value: str) -> builtins.list[JsonObj]:
        return self.store.by_index(name, value)

    def keys_by_index(self, name: str, value: str) -> builtins.list[ObjectKey]:
        """The keys `by_index` would return the objects of, in the same order."""
        return builtins.list(self.store.index_keys(name, value))

    # --- events -----------------------------------------------------------------------

    def add_handler(self, handler: EventHandler) -> None:
        """Subscribe; objects already cached are delivered as ADDED first."""
        self._handlers.append(handler)
        if handler.on_add is not None:
            for obj in self.store.list():
                self._call(handler.on_add, obj)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def synced(self) -> None:
        await self._synced.wait()

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Run in a task this informer owns; `stop()` cancels and awaits it."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"informer:{self.kind.plural}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Keep the cache current until cancelled (never returns otherwise)."""
        async with asyncio.TaskGroup() as group:
            for namespace in self._namespaces:
                group.create_task(self._reflect(namespace))

    # --- the reflector ----------------------------------------------------------------

    async def _reflect(self, namespace: str | None) -> None:
        initial, cap = self._backoff_bounds
        backoff = Backoff(initial=initial, cap=cap, rng=self._rng)
        loop = asyncio.get_running_loop()
        where = f"{self.kind.plural}" + (f" in {namespace}" if namespace else "")
        gone_in_a_row = 0
        while True:
            try:
                if namespace not in self._last_rv:
                    if gone_in_a_row > 1:  # a fresh list went stale at once: slow down
                        await asyncio.sleep(backoff.next())
                    await self._relist(namespace)
                started = loop.time()
                events = await self._watch(namespace)
                lasted = loop.time() - started
                if lasted >= self._healthy_after:
                    backoff.reset()
                elif events == 0 and lasted < _SHORT_WATCH:
                    # A stream that ends at once, empty, is a failure in disguise
                    # (client-go's "very short watch"): do not hammer the server.
                    delay = backoff.next()
                    log.warning("%s: watch ended at once; retrying in %.1fs", where, delay)
                    await asyncio.sleep(delay)
            except errors.Gone as exc:
                # a stream that delivered events before its 410 is ordinary expiry
                gone_in_a_row = 1 if self._progressed.get(namespace) else gone_in_a_row + 1
                log.info("%s: resourceVersion expired (%s), relisting", where, exc.message)
                self._last_rv.pop(namespace, None)
            except (errors.KubeError, ValueError) as exc:
                delay = backoff.next()
                log.warning("%s: %s; retrying in %.1fs", where, exc, delay)
                await asyncio.sleep(delay)
            except Exception:
                delay = backoff.next()
                log.exception("%s: unexpected failure; retrying in %.1fs", where, delay)
                await asyncio.sleep(delay)

    async def _relist(self, namespace: str | None) -> None:
        relist = Relist(self.store, namespace=namespace)
        resource_version = ""
        listed = self._client.list_pages(
            self.kind,
            namespace=namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            limit=self._page_size,
            decode=self._decode,
        )
        async with contextlib.aclosing(listed):
            async for page in listed:
                items = [self._transform(obj) for obj in page.items]
                self._dispatch(relist.apply(items))
                resource_version = page.resource_version
                del items
        self._dispatch(relist.finish())
        self._last_rv[namespace] = resource_version
        self._progressed[namespace] = False
        if namespace not in self._synced_namespaces:
            self._synced_namespaces.add(namespace)
            if len(self._synced_namespaces) == len(self._namespaces):
                self._synced.set()

    async def _watch(self, namespace: str | None) -> int:
        """Apply one watch stream until it ends; return how many events it carried."""
        low, high = self._watch_timeout
        events = 0
        async with self._client.watch(
            self.kind,
            namespace=namespace,
            resource_version=self._last_rv[namespace],
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=self._rng.randint(low, high),
            allow_bookmarks=True,
        ) as stream:
            async for event in stream:
                events += 1
                self._apply(namespace, event)
        return events

    def _apply(self, namespace: str | None, event: WatchEvent) -> None:
        resource_version = event.resource_version
        if event.type is not EventType.BOOKMARK:
            obj = self._transform(event.object)
            if event.type is EventType.DELETED:
                self._dispatch(apply_delete(self.store, obj))
            else:
                self._dispatch(apply_upsert(self.store, obj))
        if resource_version:
            self._last_rv[namespace] = resource_version
            self._progressed[namespace] = True

    def _dispatch(self, changes: builtins.list[Change]) -> None:
        for change in changes:
            self._records.pop(change.key, None)
            for handler in self._handlers:
                if change.type is ChangeType.ADDED and handler.on_add is not None:
                    self._call(handler.on_add, change.object)
                elif change.type is ChangeType.UPDATED and handler.on_update is not None:
                    assert change.old is not None
                    assert change.new is not None
                    self._call(handler.on_update, change.old, change.new)
                elif change.type is ChangeType.DELETED and handler.on_delete is not None:
                    self._call(handler.on_delete, change.object)

    def _parsed(self, key: ObjectKey, obj: JsonObj) -> object:
        assert self._parse is not None
        try:
            return self._parse(obj)
        except Exception as exc:  # noqa: BLE001 - one odd object must not stop the cache
            log.warning(
                "%s %s (resourceVersion %s) cannot be read and is ignored: %s",
                self.kind.kind,
                key,
                obj["metadata"].get("resourceVersion", ""),
                exc,
            )
            return _Rejected(exc)

    def _call(self, fn: Callable[..., None], *args: JsonObj) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: event handler %r failed", self.kind.plural, fn)
