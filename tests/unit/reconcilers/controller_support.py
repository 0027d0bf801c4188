"""Stand-ins for unit tests of the `pool` and `scaleup` reconcilers.

`FakeApi` is the API server (objects by kind/namespace/name, every call recorded,
faults on demand); the informers are real `Informer`s that are never started: a test
fills their stores with `sync()`, which copies the server's state into the cache as
a watch would (records parsed, then handlers called). Neither controller touches
vSphere, so `Deps.vsphere` and `Deps.credentials` are None here.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.kube import errors
from agentforge.kube.informer import Informer
from agentforge.kube.store import Change, ChangeType, key_for, object_key
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.wiring import CACHED_KINDS
from tests.unit.reconcilers.planner_support import NOW, merge

JsonObj = dict[str, Any]
CACHED = CACHED_KINDS  # the kinds the app caches
_KINDS = {k.kind: k for k in CACHED}


@dataclass
class Call:
    verb: str
    kind: str
    namespace: str | None
    name: str
    body: Any = None
    uid: str | None = None


@dataclass
class FakeApi:
    objects: dict[tuple[str, str, str], JsonObj] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    faults: dict[tuple[str, str], errors.KubeError] = field(default_factory=dict)
    _rv: Any = field(default_factory=lambda: itertools.count(100))

    def put(self, *objs: JsonObj) -> None:
        for obj in objs:
            meta = obj["metadata"]
            meta.setdefault("resourceVersion", str(next(self._rv)))
            meta.setdefault("uid", f"uid-{meta['name']}")
            self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj

    def find(self, kind: kinds.Kind, namespace: str, name: str) -> JsonObj | None:
        return self.objects.get((kind.kind, namespace, name))

    def _fault(self, verb: str, kind: kinds.Kind) -> None:
        fault = self.faults.get((verb, kind.kind))
        if fault is not None:
            raise fault

    def _record(
        self, verb: str, kind: kinds.Kind, namespace: str | None, name: str, **kw: Any
    ) -> None:
        self.calls.append(Call(verb, kind.kind, namespace, name, **kw))

    def _existing(self, kind: kinds.Kind, namespace: str | None, name: str) -> JsonObj:
        obj = self.objects.get((kind.kind, namespace or "", name))
        if obj is None:
            raise errors.NotFound(status=404, reason="NotFound", message=f"{name} not found")
        return obj

    def _bump(self, obj: JsonObj) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def verbs(self) -> list[tuple[str, str, str]]:
        return [(c.verb, c.kind, c.name) for c in self.calls]

    # --- the KubeClient surface the reconcilers use ------------------------------------

    async def get(self, kind: kinds.Kind, *, namespace: str | None = None, name: str) -> JsonObj:
        self._record("get", kind, namespace, name)
        self._fault("get", kind)
        return copy.deepcopy(self._existing(kind, namespace, name))

    async def create(
        self, kind: kinds.Kind, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        name = obj["metadata"]["name"]
        self._record("create", kind, namespace, name, body=copy.deepcopy(obj))
        self._fault("create", kind)
        if (kind.kind, namespace or "", name) in self.objects:
            raise errors.AlreadyExists(status=409, reason="AlreadyExists", message=f"{name} exists")
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["namespace"] = namespace
        self.put(stored)
        return copy.deepcopy(stored)

    async def patch_merge(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str,
        patch: Mapping[str, Any], subresource: str | None = None,
    ) -> JsonObj:  # fmt: skip
        self._record("patch", kind, namespace, name, body=copy.deepcopy(patch))
        self._fault("patch", kind)
        obj = self._existing(kind, namespace, name)
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv and wanted_rv != obj["metadata"]["resourceVersion"]:
            raise errors.Conflict(status=409, reason="Conflict", message="object was modified")
        merge(obj, {k: v for k, v in patch.items()})
        self._bump(obj)
        if (
            kind.kind == "VsphereAgentPool"
            and obj["metadata"].get("deletionTimestamp")
            and not obj["metadata"].get("finalizers")
        ):
            del self.objects[(kind.kind, namespace or "", name)]
        return copy.deepcopy(obj)

    async def patch_json(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str,
        operations: list[JsonObj], **_: Any,
    ) -> JsonObj:  # fmt: skip
        """RFC 6902, the `test` and `remove` of one finalizer only (what `vm` sends)."""
        self._record("patch", kind, namespace, name, body=copy.deepcopy(operations))
        self._fault("patch", kind)
        obj = self._existing(kind, namespace, name)
        finalizers = obj["metadata"].setdefault("finalizers", [])
        for op in operations:
            index = int(op["path"].rsplit("/", 1)[1])
            if op["op"] == "test" and finalizers[index] != op["value"]:
                raise errors.Invalid(status=422, reason="Invalid", message="test failed")
            if op["op"] == "remove":
                del finalizers[index]
        self._bump(obj)
        if obj["metadata"].get("deletionTimestamp") and not finalizers:
            del self.objects[(kind.kind, namespace or "", name)]
        return copy.deepcopy(obj)

    async def delete(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str, uid: str | None = None,
        **_: Any,
    ) -> JsonObj:  # fmt: skip
        self._record("delete", kind, namespace, name, uid=uid)
        self._fault("delete", kind)
        obj = self._existing(kind, namespace, name)
        if uid and obj["metadata"].get("uid") != uid:
            raise errors.Conflict(status=409, reason="Conflict", message="Precondition failed: UID")
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
            self._bump(obj)
        else:
            del self.objects[(kind.kind, namespace or "", name)]
        return {}

    async def update_status(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str,
        mutate: Callable[[JsonObj], JsonObj | None], attempts: int = 5, start: Any = None,
    ) -> JsonObj:  # fmt: skip
        self._record("get", kind, namespace, name)
        obj = self._existing(kind, namespace, name)
        desired = mutate(copy.deepcopy(obj))
        if desired is None:
            return copy.deepcopy(obj)
        self._record("update-status", kind, namespace, name, body=copy.deepcopy(desired))
        self._fault("update-status", kind)
        obj["status"] = desired.get("status", {})
        self._bump(obj)
        return copy.deepcopy(obj)


@dataclass
class Recorded:
    kind: str
    name: str
    type: str
    reason: str
    message: str
    group: Mapping[str, Any] | None = None
    """The object the recorder may combine this event onto (`EventRecorder` groups)."""


@dataclass
class FakeRecorder:
    events: list[Recorded] = field(default_factory=list)

    async def record(
        self,
        obj: Mapping[str, Any],
        *,
        type: str,
        reason: str,
        message: str,
        group: Mapping[str, Any] | None = None,
    ) -> None:
        self.events.append(
            Recorded(
                obj.get("kind", ""), obj["metadata"]["name"], str(type), str(reason), message, group
            )
        )

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


@dataclass
class Harness:
    api: FakeApi
    informers: dict[kinds.Kind, Informer]
    events: FakeRecorder
    deps: Deps

    def sync(self) -> None:
        """Make every informer's cache equal to the server state (as a watch would)."""
        for kind, informer in self.informers.items():
            live = {
                (o["metadata"].get("namespace"), o["metadata"]["name"]): o
                for (k, _, _), o in self.api.objects.items()
                if k == kind.kind
            }
            for cached in informer.list():
                key = (cached["metadata"].get("namespace"), cached["metadata"]["name"])
                if key not in live:
                    store_key = key_for(namespace=key[0], name=key[1])
                    informer.store.pop(store_key)
                    informer._dispatch([Change(ChangeType.DELETED, store_key, cached, None)])
            for obj in live.values():
                fresh = copy.deepcopy(obj)
                old = informer.store.put(fresh)
                # records first, then handlers, as the informer's watch does
                store_key = object_key(fresh)
                if old is None:
                    informer._dispatch([Change(ChangeType.ADDED, store_key, None, fresh)])
                else:
                    informer._dispatch([Change(ChangeType.UPDATED, store_key, old, fresh)])


def harness(*objs: JsonObj) -> Harness:
    api = FakeApi()
    api.put(*(copy.deepcopy(o) for o in objs))
    informers = {
        kind: Informer(client=api, kind=kind, parse=records.parser(kind))  # type: ignore[arg-type]
        for kind in CACHED
    }
    indexes.install(informers)
    events = FakeRecorder()
    deps = Deps(
        client=api,  # type: ignore[arg-type]
        informers=informers,
        events=events,  # type: ignore[arg-type]
        vsphere=vsphere.SessionRegistry(),  # never logs in: these reconcilers stay offline
        credentials=None,  # type: ignore[arg-type]
        now=lambda: NOW,
    )
    h = Harness(api=api, informers=informers, events=events, deps=deps)
    h.sync()
    return h


def kind_of(name: str) -> kinds.Kind:
    return _KINDS[name]
