"""Trim functions: what the informer cache keeps of each kind (and of any other,
`trim_any`: whole, less `managedFields` and kubectl's last-applied annotation).

A trim must keep `metadata.name`, `metadata.namespace`, `metadata.uid` and
`metadata.resourceVersion`: the cache is keyed and versioned by them.

An Agent as the API server returns it carries a hardware inventory of several KB,
managedFields and validation info; the operator reads a few hundred bytes of it.
The cache stores the output of these functions only, which keeps 10,000 Agents in
a few tens of MB. Each kept path is listed here, next to the view that reads it;
`tests/unit/api` checks every view parses a trimmed object the same as a full one,
and that the reconcilers' facts, index keys and Events read the same from both.

The views model exactly what is kept here, so a field can leave the cache only
together with its field in `views`/`meta` (the equality above would fail first).

The kinds other projects own are the many (10,000 each), and their small string
mappings repeat: the same condition entries, label and annotation sets. Those are
kept `Shared`: one dict per distinct value, referenced by every cached object that
holds it. The cache is read-only (`kube.store`: copy before mutating), which is what
makes sharing safe; our own kinds, which the reconcilers write, are never shared.

Secrets are never cached (the vSphere layer reads one when it logs in), so there is
no trim function for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentforge.api import kinds


@dataclass(frozen=True, slots=True)
class Shared:
    """Keep `spec` (without the keys in `without`), then store the kept mapping once
    and share it with every cached object holding an equal one. Only mappings whose
    values are all strings or booleans, and lists of them, are shared; any other value
    is kept as is."""

    spec: Keep = True
    without: frozenset[str] = frozenset()


# A keep-spec: True keeps a value whole; a mapping keeps only the listed keys of a
# mapping (recursively); a one-element list applies its spec to every list item;
# `Shared` keeps its spec and shares the result.
Keep = bool | Mapping[str, "Keep"] | list["Keep"] | Shared
Trim = Callable[[Mapping[str, Any]], dict[str, Any]]

# Annotations that can be large and that nothing here reads.
DROPPED_ANNOTATIONS: Final = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})

# AgentMachine and InfraEnv conditions, as `views.ObservedCondition` models them (the
# ImageCreated message is shown on the pool). Nothing reads observedGeneration.
_CONDITION: Final[Keep] = {
    "type": True,
    "status": True,
    "reason": True,
    "message": True,
    "lastTransitionTime": True,
}
# Agents are the many: their conditions are only tested for status and reason.
_AGENT_CONDITION: Final[Keep] = Shared({"type": True, "status": True, "reason": True})

METADATA: Final[Mapping[str, Keep]] = {
    "name": True,
    "namespace": True,
    "uid": True,
    "resourceVersion": True,
    "generation": True,
    "creationTimestamp": True,
    "deletionTimestamp": True,
    "labels": True,
    "annotations": True,
    "finalizers": True,
    "ownerReferences": [
        {
            "apiVersion": True,
            "kind": True,
            "name": True,
            "uid": True,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ],
}

# The kinds other projects own: the same fields, label and annotation sets shared.
_SHARED_METADATA: Final[Keep] = {
    **METADATA,
    "labels": Shared(),
    "annotations": Shared(without=DROPPED_ANNOTATIONS),
}

_ENVELOPE: Final[dict[str, Keep]] = {"apiVersion": True, "kind": True, "metadata": METADATA}
_SHARED_ENVELOPE: Final[dict[str, Keep]] = {**_ENVELOPE, "metadata": _SHARED_METADATA}

AGENT: Final[Keep] = {
    **_SHARED_ENVELOPE,
    "spec": {
        "approved": True,
        "role": True,
        "hostname": True,
        "clusterDeploymentName": True,
    },
    "status": {
        "conditions": Shared([_AGENT_CONDITION]),
        "debugInfo": Shared({"state": True}),
        "inventory": {
            "hostname": True,
            "interfaces": [{"macAddress": True}],
            "systemVendor": {"serialNumber": True},
        },
    },
}

AGENT_MACHINE: Final[Keep] = {
    **_SHARED_ENVELOPE,
    "spec": {"agentLabelSelector": {"matchLabels": Shared()}, "providerID": True},
    "status": {"agentRef": True, "conditions": Shared([Shared(_CONDITION)])},
}

MACHINE: Final[Keep] = {
    **_SHARED_ENVELOPE,
    "spec": {"infrastructureRef": {"kind": True, "name": True}},
    "status": Shared({"phase": True, "nodeRef": {"kind": True, "name": True}}),
}

INFRA_ENV: Final[Keep] = {
    **_SHARED_ENVELOPE,
    "status": {"isoDownloadURL": True, "conditions": [_CONDITION]},
}

# Our own kinds: the reconcilers read all of spec and status.
VSPHERE_AGENT_POOL: Final[Keep] = {**_ENVELOPE, "spec": True, "status": True}
VSPHERE_AGENT: Final[Keep] = {**_ENVELOPE, "spec": True, "status": True}


_INTERN_MAX: Final = 128


def _compact(value: Any) -> Any:
    """`value` with its keys and short strings interned: thousands of cached objects
    repeat the same label keys, condition types and values, and then share them."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= _INTERN_MAX else value
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


# Distinct shared mappings, by their keys then values. Emptied when full: unique
# mappings (an Agent's own labels) pass through, the repeated ones come back at once.
_SHARED_MAX: Final = 4096
_shared: dict[tuple[Any, ...], dict[str, Any]] = {}


_LIST: Final = object()  # starts a shared list's key (a mapping's holds strings alone)


def _flat(kept: dict[str, Any]) -> tuple[Any, ...] | None:
    """A mapping of strings and booleans as a tuple of its keys then values (None for
    any other: a number would compare equal to a boolean)."""
    if all(type(v) in (str, bool) for v in kept.values()):
        return (*kept, *kept.values())
    return None


def _share(kept: Any) -> Any:
    """The one stored value equal to `kept`, when it is a mapping of strings and
    booleans or a list of such mappings (an object's conditions); else `kept` itself."""
    key: tuple[Any, ...] | None = None
    if isinstance(kept, dict):
        key = _flat(kept)
    elif isinstance(kept, list) and all(isinstance(item, dict) for item in kept):
        flats = [flat for item in kept if (flat := _flat(item)) is not None]
        if len(flats) == len(kept):
            key = (_LIST, *(part for flat in flats for part in (len(flat), *flat)))
    if key is None:
        return kept
    found = _shared.get(key)
    if found is not None:
        return found
    if len(_shared) >= _SHARED_MAX:
        _shared.clear()
    _shared[key] = kept
    return kept


def compile_keep(spec: Keep) -> Callable[[Any], Any]:
    """The function that reduces a value to what `spec` lists (see `Keep`), with
    strings interned; it returns None when nothing is kept. The spec is read once, here,
    not again for every cached object (the trims run on the sync path)."""
    if isinstance(spec, Shared):
        inner, without = compile_keep(spec.spec), spec.without

        def shared(value: Any) -> Any:
            kept = inner(value)
            if without and isinstance(kept, dict) and not without.isdisjoint(kept):
                kept = {k: v for k, v in kept.items() if k not in without}
            return None if kept is None else _share(kept)

        return shared
    if spec is True:
        return _compact
    if isinstance(spec, list):
        item = compile_keep(spec[0])
        return lambda value: [item(v) for v in value] if isinstance(value, list) else None
    if isinstance(spec, Mapping):
        fields = tuple((sys.intern(key), compile_keep(sub)) for key, sub in spec.items())

        def mapping(value: Any) -> Any:
            if not isinstance(value, Mapping):
                return None
            kept = {}
            for key, sub in fields:
                if key in value:
                    trimmed = sub(value[key])
                    if trimmed is not None:
                        kept[key] = trimmed
            return kept

        return mapping
    return lambda value: None


def keep(value: Any, spec: Keep) -> Any:
    """`value` reduced to what `spec` lists (`compile_keep`, for a spec used once)."""
    return compile_keep(spec)(value)


class Trimmer:
    """The trim of a kind: called with an object, it returns what `keep` lists of it.
    The informer also decodes the kind's LIST pages to `keep` alone (`kube.pages`)."""

    __slots__ = ("_kept_of", "keep")

    def __init__(self, keep: Keep) -> None:
        self.keep = keep
        self._kept_of = compile_keep(keep)

    def __call__(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = self._kept_of(obj) or {}
        metadata = kept.get("metadata", {})
        annotations = metadata.get("annotations")
        if annotations is not None:
            if not DROPPED_ANNOTATIONS.isdisjoint(annotations):
                annotations = {k: v for k, v in annotations.items() if k not in DROPPED_ANNOTATIONS}
            if annotations:
                metadata["annotations"] = annotations
            else:
                del metadata["annotations"]
        return kept


_trim_metadata: Final = Trimmer({"metadata": METADATA})


def trim_any(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A kind without its own trim: every field but metadata kept whole (interned),
    metadata as `METADATA` lists it (no `managedFields`, no last-applied annotation)."""
    kept = {sys.intern(k): _compact(v) for k, v in obj.items() if k != "metadata"}
    kept.update(_trim_metadata(obj))
    return kept


trim_agent: Final = Trimmer(AGENT)
trim_agent_machine: Final = Trimmer(AGENT_MACHINE)
trim_machine: Final = Trimmer(MACHINE)
trim_infra_env: Final = Trimmer(INFRA_ENV)
trim_vsphere_agent_pool: Final = Trimmer(VSPHERE_AGENT_POOL)
trim_vsphere_agent: Final = Trimmer(VSPHERE_AGENT)

BY_KIND: Final[Mapping[kinds.Kind, Trim]] = {
    kinds.AGENT: trim_agent,
    kinds.AGENT_MACHINE: trim_agent_machine,
    kinds.MACHINE: trim_machine,
    kinds.INFRA_ENV: trim_infra_env,
    kinds.VSPHERE_AGENT_POOL: trim_vsphere_agent_pool,
    kinds.VSPHERE_AGENT: trim_vsphere_agent,
}
"""The trim function of every cached kind, for the informer's transform."""
