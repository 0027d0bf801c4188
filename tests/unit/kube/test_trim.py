"""Trimming rules: identity survives, managedFields and unread fields do not."""

from __future__ import annotations

import sys
from typing import Any

from agentforge.kube import trim


def agent() -> dict[str, Any]:
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "metadata": {
            "name": "a1",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "9",
            "labels": {"pool": "p"},
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                "keep": "me",
            },
        },
        "spec": {"approved": True, "hostname": "h"},
        "status": {
            "inventory": {"disks": [{"size": 1}] * 20},
            "conditions": [{"type": "Bound", "status": "True", "message": "long text"}],
        },
    }


def test_drop_managed_fields_removes_managed_fields_and_last_applied() -> None:
    out = trim.drop_managed_fields(agent())
    assert "managedFields" not in out["metadata"]
    assert out["metadata"]["annotations"] == {"keep": "me"}


def test_compact_interns_keys_and_short_values() -> None:
    one = trim.compact({"".join(["sta", "tus"]): "".join(["Tr", "ue"])})
    two = trim.compact({"".join(["st", "atus"]): "".join(["T", "rue"])})
    (k1, v1), (k2, v2) = next(iter(one.items())), next(iter(two.items()))
    assert k1 is k2
    assert v1 is v2
    assert v1 is sys.intern("True")
