"""Memory rules of the cache: 30,000 objects must fit in the operator's 150 MB.

Budget arithmetic (measured on CPython 3.11): the interpreter plus aiohttp,
prometheus-client, pydantic, PyYAML and pyVmomi take ~52 MB RSS, which leaves ~3 KB
per cached object. What is cached is the caller's trim; these tests pin what the
runtime adds on top of it (keys, indexes; ~0.5 KB) and what trimming saves (a raw
Agent parses to ~11 KB of dicts, the Agent informer's trim keeps ~2.1 KB).
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

from agentforge.api.trim import trim_agent, trim_any
from agentforge.kube import store

N = 2000


def agent(i: int) -> dict[str, Any]:
    """A ~3.5 KB Agent as Assisted Installer writes it (managedFields, inventory...)."""
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "metadata": {
            "name": f"agent-{i:05d}",
            "namespace": "hosted",
            "uid": f"{i:08d}-1111-2222-3333-444444444444",
            "resourceVersion": str(100000 + i),
            "labels": {"agent-forge.containeroo.ch/pool": "pool-a"},
            "managedFields": [{"manager": "assisted-service", "fieldsV1": {"f:status": {}}}] * 3,
        },
        "spec": {"approved": True, "role": "worker", "hostname": f"host-{i}"},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": "Ok", "message": "fine " * 10}
                for t in ("SpecSynced", "Connected", "RequirementsMet", "Validated", "Bound")
            ],
            "inventory": {
                "systemVendor": {"serialNumber": f"VMware-{i:032d}", "manufacturer": "VMware"},
                "interfaces": [{"macAddress": f"00:50:56:00:{i // 256 % 256:02x}:{i % 256:02x}"}],
                "disks": [{"name": f"sd{j}", "sizeBytes": 120 * 10**9} for j in range(3)],
                "cpu": {"count": 8, "flags": ["fpu", "vme", "de", "pse", "tsc"] * 5},
            },
            "debugInfo": {"state": "known"},
        },
    }


def traced_bytes(build: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    tracemalloc.start()
    try:
        kept = build()
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return current / N, kept


KEEP = trim_agent  # what the Agent informer caches
RAW = [json.dumps(agent(i)) for i in range(N)]  # as they arrive from the apiserver


def test_store_keys_and_indexes_add_well_under_a_kilobyte_per_object() -> None:
    def objects_only() -> list[dict[str, Any]]:
        return [KEEP(json.loads(raw)) for raw in RAW]

    def in_store() -> store.Store:
        s = store.Store()
        s.add_index("pool", lambda o: [o["metadata"]["labels"]["agent-forge.containeroo.ch/pool"]])
        for raw in RAW:
            store.apply_upsert(s, KEEP(json.loads(raw)))
        return s

    bare, _ = traced_bytes(objects_only)
    cached, s = traced_bytes(in_store)
    assert len(s) == N
    assert cached - bare < 800, f"store overhead {cached - bare:.0f} B/object"


def test_compact_trims_make_an_agent_fit_the_per_object_budget() -> None:
    raw_size, _ = traced_bytes(lambda: [json.loads(raw) for raw in RAW])
    default_size, _ = traced_bytes(lambda: [trim_any(json.loads(r)) for r in RAW])
    kept_size, _ = traced_bytes(lambda: [KEEP(json.loads(raw)) for raw in RAW])
    assert default_size < raw_size
    assert kept_size < 4000, f"a trimmed Agent takes {kept_size:.0f} B (measured ~2.1 KB)"
    assert kept_size < raw_size / 3
