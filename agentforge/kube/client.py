"""A thin async REST client for the Kubernetes API: raw JSON dicts in and out.

Why not kubernetes_asyncio's generated client: its model classes cost CPU and
memory per object (an operator caching 30,000 objects cannot afford them), and its
errors do not tell "not found" from "could not ask". This client keeps one shared
aiohttp session (TLS verified against the configured CA, bearer token or client
certificate), addresses resources by `agentforge.api.kinds.Kind`, and promises:

* Errors are typed (`errors.NotFound`, `errors.Conflict`, ... for server answers;
  `errors.TransportError` when no answer came); nothing is turned into "absent".
* Transient failures of non-watch requests are retried with tenacity: 429 (waiting
  `Retry-After` when given), 5xx, and connection failures. A request that may have
  reached the server (torn connection, 5xx) is retried only when repeating it is
  harmless; a create with `generateName` and a JSON patch without a `test` op are
  not. A create with a fixed name is retried, so after an ambiguous failure the
  retry may surface `errors.AlreadyExists` for an object the first attempt created.
* A 401 invalidates the cached credential and the request is tried once more (the
  projected service-account token may have rotated).
* Every attempt is counted in `agent_forge_kube_requests_total{verb,resource,code}`
  with Kubernetes verbs (get/list/watch/create/update/patch/delete) and `code` the
  HTTP status or `error` for transport failures.
* `update_status` is the optimistic-concurrency loop reconcilers use: GET fresh
  state, apply `mutate`, PUT `/status` with that resourceVersion, redo on 409 (with
  tenacity, as client-go's `RetryOnConflict` with `retry.DefaultRetry`: 5 attempts,
  10 ms apart plus up to 10% jitter). A `status_observer` sees each write made (the
  object before, as the fresh GET or the caller's `start` showed it, and as stored):
  the app logs conditions an admin must act on there (`condition_log`).

Watches are not retried here (see `agentforge.kube.watch`); the informer decides.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import aiohttp
import tenacity

from agentforge.api.kinds import Kind
from agentforge.kube import errors
from agentforge.kube.config import ClusterConfig
from agentforge.kube.transport import Decode, RetryPolicy, Transport
from agentforge.kube.watch import WatchStream

__all__ = [
    "JsonObj",
    "KubeClient",
    "ListPage",
    "ListResult",
    "Mutation",
    "RetryPolicy",
    "StatusObserver",
]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
Mutation = Callable[[JsonObj], JsonObj | None]
StatusObserver = Callable[[Kind, JsonObj, JsonObj], None]
"""Told of each status write `update_status` made: kind, object before, object stored."""

_MERGE_PATCH = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"

CONFLICT_WAIT: Final = tenacity.wait_fixed(0.01) + tenacity.wait_random(0, 0.001)
"""Between `update_status` attempts after a 409: client-go's `retry.DefaultRetry` of
`RetryOnConflict` (10 ms, factor 1.0, jitter 0.1: 10 to 11 ms), so writers racing for
one object do not retry in lockstep."""


@dataclass(frozen=True, slots=True)
class ListPage:
    items: list[JsonObj]
    resource_version: str
    continue_token: str | None


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JsonObj]
    resource_version: str


class KubeClient:
    """One connection pool to one apiserver; close it (or use `async with`) at exit."""

    def __init__(
        self,
        *,
        config: ClusterConfig,
        retry: RetryPolicy | None = None,
        request_timeout: float = 30.0,
        user_agent: str = "agent-forge",
        status_observer: StatusObserver | None = None,
    ) -> None:
        self.config = config
        self._status_observer = status_observer
        self._transport = Transport(
            config=config, retry=retry, request_timeout=request_timeout, user_agent=user_agent
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    # --- reads -----------------------------------------------------------------------

    async def get(self, kind: Kind, *, namespace: str | None = None, name: str) -> JsonObj:
        return await self._call("GET", kind, "get", namespace=namespace, name=name)

    async def list_pages(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        decode: Decode = json.loads,
    ) -> AsyncGenerator[ListPage, None]:
        """Yield a consistent LIST one page at a time (memory: one page in flight),
        each decoded by `decode` (the informer's: only the fields it keeps, `kube.pages`).

        Continue tokens pin the snapshot of the first page; an expired token surfaces
        as `errors.Gone` and the caller restarts the list.
        """
        params = _selectors(label_selector, field_selector)
        params["limit"] = str(limit)
        token: str | None = None
        while True:
            if token:
                params["continue"] = token
            body = await self._call(
                "GET", kind, "list", namespace=namespace, params=params, decode=decode
            )
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            yield ListPage(
                items=body.get("items") or [],
                resource_version=str(meta.get("resourceVersion", "")),
                continue_token=token,
            )
            if not token:
                return

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
    ) -> ListResult:
        """The whole collection (all pages) and the list's resourceVersion."""
        items: list[JsonObj] = []
        resource_version = ""
        async for page in self.list_pages(
            kind,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
        ):
            items.extend(page.items)
            resource_version = page.resource_version
        return ListResult(items=items, resource_version=resource_version)

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
    ) -> WatchStream:
        """An unopened watch; `async with` opens it (errors there: 410 `Gone` etc.)."""
        params = _selectors(label_selector, field_selector)
        params["watch"] = "true"
        params["timeoutSeconds"] = str(timeout_seconds)
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version:
            params["resourceVersion"] = resource_version
        path = kind.path(namespace=namespace)
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self._transport.request_timeout,
            sock_read=timeout_seconds + 30,
        )

        async def open_response() -> aiohttp.ClientResponse:
            return await self._transport.send(
                "GET",
                path,
                verb="watch",
                resource=_resource_label(kind),
                params=params,
                client_timeout=timeout,
            )

        return WatchStream(open_response=open_response, description=path)

    # --- writes ----------------------------------------------------------------------

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObj:
        meta = obj.get("metadata") or {}
        ns = namespace or meta.get("namespace")
        repeatable = bool(meta.get("name"))  # generateName: a retry could create twice
        return await self._call(
            "POST", kind, "create", namespace=ns, body=obj, repeatable=repeatable
        )

    async def replace(self, kind: Kind, obj: Mapping[str, Any]) -> JsonObj:
        """PUT the whole object; include `metadata.resourceVersion` for optimistic locking."""
        namespace, name = _address(obj)
        return await self._call("PUT", kind, "update", namespace=namespace, name=name, body=obj)

    async def replace_status(self, kind: Kind, obj: Mapping[str, Any]) -> JsonObj:
        namespace, name = _address(obj)
        return await self._call(
            "PUT", kind, "update", namespace=namespace, name=name, body=obj, subresource="status"
        )

    async def patch_merge(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> JsonObj:
        """RFC 7386 merge patch (`None` values delete keys; lists are replaced)."""
        return await self._call(
            "PATCH",
            kind,
            "patch",
            namespace=namespace,
            name=name,
            body=patch,
            subresource=subresource,
            content_type=_MERGE_PATCH,
        )

    async def patch_status(
        self, kind: Kind, *, namespace: str | None = None, name: str, patch: Mapping[str, Any]
    ) -> JsonObj:
        return await self.patch_merge(
            kind, namespace=namespace, name=name, patch=patch, subresource="status"
        )

    async def patch_json(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        operations: Sequence[Mapping[str, Any]],
        subresource: str | None = None,
    ) -> JsonObj:
        """RFC 6902 JSON patch; put a `test` op first to make it conditional."""
        guarded = any(op.get("op") == "test" for op in operations)
        return await self._call(
            "PATCH",
            kind,
            "patch",
            namespace=namespace,
            name=name,
            body=list(operations),
            subresource=subresource,
            content_type=_JSON_PATCH,
            repeatable=guarded,
        )

    async def delete(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> JsonObj:
        """DELETE with optional preconditions; returns the object (or a Status)."""
        options: JsonObj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        return await self._call(
            "DELETE", kind, "delete", namespace=namespace, name=name, body=options
        )

    async def update_status(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        mutate: Mutation,
        attempts: int = 5,
        start: Mapping[str, Any] | None = None,
    ) -> JsonObj:
        """GET, `mutate(copy)`, PUT `/status` with its resourceVersion; redo on 409.

        `mutate` receives a private copy of the fresh object and returns the object to
        write, or None when nothing needs writing (then the fresh object is returned
        and no write is made). After `attempts` conflicts the last `errors.Conflict`
        is raised. `errors.NotFound` from the GET propagates.

        `start`: the object as the caller last saw it stored (its cache, or its own last
        write): the first attempt mutates it instead of a GET. A stale `start` costs a
        409 and the usual GET; a `start` that needs no write is not trusted to say so
        (the GET decides).
        """
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=CONFLICT_WAIT,
            retry=tenacity.retry_if_exception_type(errors.Conflict),
            before_sleep=_log_conflict(kind, namespace, name, attempts),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                first = attempt.retry_state.attempt_number == 1
                return await self._write_status(
                    kind,
                    namespace=namespace,
                    name=name,
                    mutate=mutate,
                    start=start if first else None,
                )
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _write_status(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        name: str,
        mutate: Mutation,
        start: Mapping[str, Any] | None,
    ) -> JsonObj:
        """One attempt of `update_status`: from `start` when it needs a write, else a GET."""
        if start is not None:
            desired = mutate(copy.deepcopy(dict(start)))
            if desired is not None:
                stored = await self.replace_status(kind, desired)
                self._observe(kind, dict(start), stored)
                return stored
        current = await self.get(kind, namespace=namespace, name=name)
        desired = mutate(copy.deepcopy(current))
        if desired is None:
            return current
        desired.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
            "resourceVersion"
        ]
        stored = await self.replace_status(kind, desired)
        self._observe(kind, current, stored)
        return stored

    def _observe(self, kind: Kind, before: JsonObj, after: JsonObj) -> None:
        if self._status_observer is None:
            return
        try:
            self._status_observer(kind, before, after)
        except Exception:  # an observer never fails a write that succeeded
            log.exception("the status observer failed on %s", kind.kind)

    # --- plumbing --------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        repeatable: bool = True,
        decode: Decode = json.loads,
    ) -> JsonObj:
        """Any JSON call (for APIs without a `Kind`, e.g. TokenRequest, /version)."""
        return await self._transport.request(
            method,
            path,
            verb=verb,
            resource=resource,
            params=params,
            body=body,
            content_type=content_type,
            repeatable=repeatable,
            decode=decode,
        )

    async def _call(
        self,
        method: str,
        kind: Kind,
        verb: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        repeatable: bool = True,
        decode: Decode = json.loads,
    ) -> JsonObj:
        if kind.namespaced and name is not None and not namespace:
            raise ValueError(f"{kind.kind} {name!r} is namespaced: a namespace is required")
        path = kind.path(namespace=namespace, name=name)
        resource = _resource_label(kind)
        if subresource:
            path += f"/{subresource}"
            resource += f"/{subresource}"
        return await self.request(
            method,
            path,
            verb=verb,
            resource=resource,
            params=params,
            body=body,
            content_type=content_type,
            repeatable=repeatable,
            decode=decode,
        )


def _log_conflict(
    kind: Kind, namespace: str | None, name: str, attempts: int
) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        log.debug(
            "status of %s %s/%s changed under us (attempt %d/%d), retrying",
            kind.kind,
            namespace or "",
            name,
            state.attempt_number,
            attempts,
        )

    return before_sleep


def _resource_label(kind: Kind) -> str:
    """`plural[.group]`, as the apiserver's own metrics and RBAC name resources."""
    return f"{kind.plural}.{kind.group}" if kind.group else kind.plural


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _address(obj: Mapping[str, Any]) -> tuple[str | None, str]:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise ValueError("object has no metadata.name")
    return meta.get("namespace"), str(name)
