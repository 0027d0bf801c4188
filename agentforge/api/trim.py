"""Trim functions: what the informer cache keeps of each kind.

An Agent as the API server returns it carries a hardware inventory of several KB,
managedFields and validation info; the operator reads a few hundred bytes of it.
The cache stores the output of these functions only, which keeps 10,000 Agents in
a few tens of MB. Each kept path is listed here, next to the view that reads it;
`tests/unit/api` checks every view parses a trimmed object the same as a full one.

Secrets are never cached (the vSphere layer reads one when it logs in), so there is
no trim function for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from agentforge.api import kinds

# A keep-spec: True keeps a value whole; a mapping keeps only the listed keys of a
# mapping (recursively); a one-element list applies its spec to every list item.
Keep = bool | Mapping[str, "Keep"] | list["Keep"]
Trim = Callable[[Mapping[str, Any]], dict[str, Any]]

# Annotations that can be large and that nothing here reads.
DROPPED_ANNOTATIONS: Final = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})

_CONDITION: Final[Keep] = {
    "type": True,
    "status": True,
    "reason": True,
    "message": True,
    "lastTransitionTime": True,
    "observedGeneration": True,
}
# Agents are the many: their conditions are only tested for status and reason.
_AGENT_CONDITION: Final[Keep] = {"type": True, "status": True, "reason": True}

METADATA: Final[Keep] = {
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

_ENVELOPE: Final[dict[str, Keep]] = {"apiVersion": True, "kind": True, "metadata": METADATA}

AGENT: Final[Keep] = {
    **_ENVELOPE,
    "spec": {
        "approved": True,
        "role": True,
        "hostname": True,
        "clusterDeploymentName": True,
    },
    "status": {
        "conditions": [_AGENT_CONDITION],
        "debugInfo": {"state": True},
        "inventory": {
            "hostname": True,
            "interfaces": [{"macAddress": True}],
            "systemVendor": {"serialNumber": True},
        },
    },
}

AGENT_MACHINE: Final[Keep] = {
    **_ENVELOPE,
    "spec": {"agentLabelSelector": {"matchLabels": True}, "providerID": True},
    "status": {"agentRef": True, "conditions": [_CONDITION]},
}

MACHINE: Final[Keep] = {
    **_ENVELOPE,
    "spec": {"infrastructureRef": {"kind": True, "name": True}},
    "status": {"phase": True, "nodeRef": {"kind": True, "name": True}},
}

INFRA_ENV: Final[Keep] = {
    **_ENVELOPE,
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


def keep(value: Any, spec: Keep) -> Any:
    """`value` reduced to what `spec` lists (see `Keep`), with strings interned;
    None when nothing is kept."""
    if spec is True:
        return _compact(value)
    if isinstance(spec, list):
        if not isinstance(value, list):
            return None
        return [keep(item, spec[0]) for item in value]
    if isinstance(spec, Mapping):
        if not isinstance(value, Mapping):
            return None
        kept = {}
        for key, sub in spec.items():
            if key in value:
                trimmed = keep(value[key], sub)
                if trimmed is not None:
                    kept[sys.intern(key)] = trimmed
        return kept
    return None


def _trimmer(spec: Keep) -> Trim:
    def trim(obj: Mapping[str, Any]) -> dict[str, Any]:
        kept: dict[str, Any] = keep(obj, spec) or {}
        metadata = kept.get("metadata", {})
        if "annotations" in metadata:
            annotations = {
                k: v for k, v in metadata["annotations"].items() if k not in DROPPED_ANNOTATIONS
            }
            if annotations:
                metadata["annotations"] = annotations
            else:
                del metadata["annotations"]
        return kept

    return trim


trim_agent: Final = _trimmer(AGENT)
trim_agent_machine: Final = _trimmer(AGENT_MACHINE)
trim_machine: Final = _trimmer(MACHINE)
trim_infra_env: Final = _trimmer(INFRA_ENV)
trim_vsphere_agent_pool: Final = _trimmer(VSPHERE_AGENT_POOL)
trim_vsphere_agent: Final = _trimmer(VSPHERE_AGENT)

BY_KIND: Final[Mapping[kinds.Kind, Trim]] = {
    kinds.AGENT: trim_agent,
    kinds.AGENT_MACHINE: trim_agent_machine,
    kinds.MACHINE: trim_machine,
    kinds.INFRA_ENV: trim_infra_env,
    kinds.VSPHERE_AGENT_POOL: trim_vsphere_agent_pool,
    kinds.VSPHERE_AGENT: trim_vsphere_agent,
}
"""The trim function of every cached kind, for the informer's transform."""
