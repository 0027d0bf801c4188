"""What a request means to Kubernetes: verb, resource, namespace, name.

A pure re-statement of the apiserver's RequestInfoFactory, so the proxy counts
requests with the same words RBAC and the apiserver's own metrics use:

- verb: get / list / watch / create / update / patch / delete / deletecollection,
  from the HTTP method, whether a name is present, and the `watch` query parameter
  (or the legacy `/watch/` path segment); non-resource URLs use the lower-case
  HTTP method.
- resource: `plural` for the core group, `plural.group` otherwise, with
  `/subresource` appended (`vsphereagents.agent-forge.containeroo.ch/status`);
  for non-resource URLs (`/version`, `/healthz`, discovery) the path itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
# `namespaces/<name>/<x>` is a subresource of the namespace itself for these x.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})

_VERB_BY_METHOD = {
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
}


@dataclass(frozen=True, slots=True)
class RequestInfo:
    verb: str
    resource: str  # `plural[.group][/subresource]`, or the path of a non-resource URL
    namespace: str  # "" for cluster-scoped and non-resource requests
    name: str  # "" for collections
    is_resource_request: bool

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


def classify(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """Classify one request by its method, URL path (no query) and query parameters."""
    method = method.upper()
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        rest = []
        group = ""
    if not rest:
        return _non_resource(method, path)

    legacy_watch = False
    if rest[0] == "watch":
        legacy_watch = True
        rest = rest[1:]
        if not rest:
            return _non_resource(method, path)

    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
        else:
            namespace = ""  # the Namespace object itself is cluster-scoped

    plural = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""

    if legacy_watch or (method in ("GET", "HEAD") and query.get("watch", "") in _TRUE):
        verb = "watch"
    elif method in ("GET", "HEAD"):
        verb = "get" if name else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERB_BY_METHOD.get(method, method.lower())

    resource = f"{plural}.{group}" if group else plural
    if subresource:
        resource += f"/{subresource}"
    return RequestInfo(
        verb=verb, resource=resource, namespace=namespace, name=name, is_resource_request=True
    )


def _non_resource(method: str, path: str) -> RequestInfo:
    return RequestInfo(
        verb=method.lower(), resource=path, namespace="", name="", is_resource_request=False
    )
