"""Transforms that shrink objects before the informer caches them.

The memory budget (10,000 each of Agents, AgentMachines and Machines in <= 150 MB
RSS) cannot hold whole objects: `managedFields` alone is often half an object, and
every dict key parsed from JSON is a fresh string. These helpers are the generic
part; the kind-specific trims ("keep only the fields the reconcilers read") are
`api.trim`'s.

A transform must keep `metadata.name`, `metadata.namespace`, `metadata.uid` and
`metadata.resourceVersion`: the cache is keyed and versioned by them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "Transform",
    "compact",
    "default_transform",
    "drop_managed_fields",
]

Transform = Callable[[dict[str, Any]], dict[str, Any]]

_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
_INTERN_MAX = 64  # short strings repeat across objects (reasons, statuses, label values)


def drop_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Remove `managedFields` and kubectl's last-applied annotation (in place)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            for name in _DROPPED_ANNOTATIONS:
                annotations.pop(name, None)
    return obj


def compact(value: Any) -> Any:
    """Rebuild a JSON value with interned keys and short string values.

    Every object parsed from its own watch event owns private copies of "metadata",
    "status", "True"...; interning makes 30,000 objects share one copy of each.
    """
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _INTERN_MAX:
        return sys.intern(value)
    return value


def default_transform(obj: dict[str, Any]) -> dict[str, Any]:
    """What every informer applies last unless told otherwise."""
    return compact(drop_managed_fields(obj))  # type: ignore[no-any-return]
