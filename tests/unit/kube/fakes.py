"""Scripted stand-ins for the API client, for informer and controller unit tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from agentforge.api.kinds import Kind
from agentforge.kube import informer
from agentforge.kube.watch import EventType, WatchEvent


def obj(name: str, rv: str, namespace: str = "ns", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": extra.pop("uid", f"uid-{name}"),
        "resourceVersion": rv,
    }
    meta.update(extra.pop("metadata", {}))
    return {"metadata": meta, **extra}


def event(kind: str, o: dict[str, Any]) -> WatchEvent:
    return WatchEvent(type=EventType(kind), object=o)


def bookmark(rv: str) -> WatchEvent:
    return WatchEvent(type=EventType.BOOKMARK, object={"metadata": {"resourceVersion": rv}})


@dataclass
class Page:
    items: list[dict[str, Any]]
    resource_version: str


Step = WatchEvent | BaseException


class Stream:
    """Plays `steps` (events, or exceptions to raise), then ends or hangs."""

    def __init__(
        self,
        steps: list[Step],
        *,
        open_error: BaseException | None,
        hang: bool,
        on_open: Callable[[], None] | None,
    ) -> None:
        self._steps = list(steps)
        self._open_error = open_error
        self._hang = hang
        self._on_open = on_open

    async def __aenter__(self) -> Stream:
        if self._on_open is not None:
            self._on_open()
        if self._open_error is not None:
            raise self._open_error
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> WatchEvent:
        await asyncio.sleep(0)
        if self._steps:
            step = self._steps.pop(0)
            if isinstance(step, BaseException):
                raise step
            return step
        if self._hang:
            await asyncio.Event().wait()
        raise StopAsyncIteration


@dataclass
class WatchScript:
    steps: list[Step] = field(default_factory=list)
    open_error: BaseException | None = None
    hang: bool = False
    on_open: Callable[[], None] | None = None  # e.g. change the world before a 410


@dataclass
class ListCall:
    namespace: str | None
    limit: int


@dataclass
class WatchCall:
    namespace: str | None
    resource_version: str | None


class FakeApi:
    """Lists `objects`; each watch plays the next script for its namespace (else hangs)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.list_rv = "1"
        self.list_errors: list[BaseException] = []
        self.scripts: dict[str | None, list[WatchScript]] = {}
        self.list_calls: list[ListCall] = []
        self.watch_calls: list[WatchCall] = []
        self.list_times: list[float] = []

    def put(self, *objs: dict[str, Any]) -> None:
        for o in objs:
            meta = o["metadata"]
            self.objects[f"{meta.get('namespace')}/{meta['name']}"] = o

    def remove(self, namespace: str, name: str) -> None:
        del self.objects[f"{namespace}/{name}"]

    def script(self, namespace: str | None, *scripts: WatchScript) -> None:
        self.scripts.setdefault(namespace, []).extend(scripts)

    async def list_pages(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        decode: Callable[[bytes], Any] = json.loads,
    ) -> AsyncGenerator[Page, None]:
        self.list_calls.append(ListCall(namespace, limit))
        self.list_times.append(asyncio.get_running_loop().time())
        if self.list_errors:
            raise self.list_errors.pop(0)
        items = [
            o
            for o in self.objects.values()
            if namespace is None or o["metadata"].get("namespace") == namespace
        ]
        for start in range(0, max(len(items), 1), limit):
            await asyncio.sleep(0)
            body = json.dumps({"items": items[start : start + limit]}).encode()
            yield Page(items=decode(body)["items"], resource_version=self.list_rv)

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
    ) -> Stream:
        self.watch_calls.append(WatchCall(namespace, resource_version))
        scripts = self.scripts.get(namespace) or []
        script = scripts.pop(0) if scripts else WatchScript(hang=True)
        return Stream(
            script.steps, open_error=script.open_error, hang=script.hang, on_open=script.on_open
        )


class Recorder:
    """An informer handler that records (event, key, resourceVersion) tuples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    @staticmethod
    def _id(o: dict[str, Any]) -> tuple[str, str]:
        meta = o["metadata"]
        return f"{meta.get('namespace')}/{meta['name']}", meta["resourceVersion"]

    def handler(self) -> informer.EventHandler:
        return informer.EventHandler(
            on_add=lambda o: self.events.append(("add", *self._id(o))),
            on_update=lambda old, new: self.events.append(("update", *self._id(new))),
            on_delete=lambda o: self.events.append(("delete", *self._id(o))),
        )


__all__ = ["FakeApi", "Recorder", "WatchScript", "bookmark", "event", "obj"]


class ReviewApi:
    """The API server's TokenReview and SubjectAccessReview, scripted.

    `users` maps a token to the user it belongs to; `grants` holds the (user, verb,
    path) triples RBAC allows. Every review posted is kept in `posted` (kind, spec);
    `failure`, when set, is raised instead of answering (an unreachable API server).
    """

    def __init__(
        self,
        users: dict[str, dict[str, Any]] | None = None,
        grants: set[tuple[str, str, str]] | None = None,
    ) -> None:
        self.users = users or {}
        self.grants = grants or set()
        self.posted: list[tuple[str, dict[str, Any]]] = []
        self.failure: BaseException | None = None

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.posted if k == kind)

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        assert method == "POST"
        assert kw["verb"] == "create"
        assert kw["repeatable"] is True
        body = kw["body"]
        self.posted.append((body["kind"], body["spec"]))
        if self.failure is not None:
            raise self.failure
        spec = body["spec"]
        if body["kind"] == "TokenReview":
            assert path == "/apis/authentication.k8s.io/v1/tokenreviews"
            user = self.users.get(spec["token"])
            status = {"authenticated": True, "user": user} if user else {"authenticated": False}
            return {**body, "status": status}
        assert body["kind"] == "SubjectAccessReview"
        assert path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        attributes = spec["nonResourceAttributes"]
        allowed = (spec["user"], attributes["verb"], attributes["path"]) in self.grants
        reason = "RBAC: allowed" if allowed else ""
        return {**body, "status": {"allowed": allowed, "reason": reason}}
