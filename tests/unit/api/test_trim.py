"""Trim functions keep what the reconcilers read and little else, so that the informer
cache of 10,000 Agents with multi-KB inventories stays far below 150 MB."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

from agentforge.api import kinds, trim

Load = Callable[[str], dict[str, Any]]


def paths(obj: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every mapping key in `obj` (list items share their list's path)."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else key
            found |= {path} | paths(value, path)
    elif isinstance(obj, list):
        for item in obj:
            found |= paths(item, prefix)
    return found


def test_trimmed_agent_keeps_only_what_the_agent_view_reads(fixture: Load) -> None:
    trimmed = trim.trim_agent(fixture("agent.yaml"))
    kept = {p for p in paths(trimmed) if not p.startswith(("metadata.labels.", "spec.cluster"))}
    assert kept == {
        "apiVersion",
        "kind",
        "metadata",
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.resourceVersion",
        "metadata.generation",
        "metadata.creationTimestamp",
        "metadata.labels",
        "metadata.finalizers",
        "metadata.ownerReferences",
        "metadata.ownerReferences.apiVersion",
        "metadata.ownerReferences.kind",
        "metadata.ownerReferences.name",
        "metadata.ownerReferences.uid",
        "spec",
        "spec.approved",
        "spec.role",
        "spec.hostname",
        "status",
        "status.conditions",
        "status.conditions.type",
        "status.conditions.status",
        "status.conditions.reason",
        "status.debugInfo",
        "status.debugInfo.state",
        "status.inventory",
        "status.inventory.hostname",
        "status.inventory.interfaces",
        "status.inventory.interfaces.macAddress",
        "status.inventory.systemVendor",
        "status.inventory.systemVendor.serialNumber",
    }


def test_trimming_drops_last_applied_configuration_but_keeps_other_annotations(
    fixture: Load,
) -> None:
    raw = fixture("agent.yaml")
    assert "annotations" not in trim.trim_agent(raw)["metadata"]
    raw["metadata"]["annotations"]["example.com/keep"] = "yes"
    assert trim.trim_agent(raw)["metadata"]["annotations"] == {"example.com/keep": "yes"}


def test_trimmed_agent_is_a_fraction_of_the_full_object(fixture: Load) -> None:
    raw = fixture("agent.yaml")
    assert len(json.dumps(trim.trim_agent(raw))) * 4 < len(json.dumps(raw))


def test_ten_thousand_cached_agents_stay_far_below_150_mb(fixture: Load) -> None:
    """Measured on 1,000 Agents decoded from JSON as the watch delivers them."""
    text = json.dumps(fixture("agent.yaml"))
    count = 1000
    tracemalloc.start()
    try:
        cache = []
        for i in range(count):
            obj = json.loads(text)
            obj["metadata"]["name"] = obj["metadata"]["uid"] = f"agent-{i:08d}"
            cache.append(trim.trim_agent(obj))
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    projected_mb = used / count * 10_000 / 1e6
    assert projected_mb < 75, f"10,000 trimmed Agents would take {projected_mb:.0f} MB"


def test_trimmed_capi_and_infra_env_objects_drop_unread_fields(fixture: Load) -> None:
    machine = trim.trim_machine(fixture("machine.yaml"))
    assert set(machine["spec"]) == {"infrastructureRef"}
    assert machine["spec"]["infrastructureRef"] == {
        "kind": "AgentMachine",
        "name": "demo-worker-7d9f8-x2x4q",
    }
    agent_machine = trim.trim_agent_machine(fixture("agentmachine.yaml"))
    assert set(agent_machine["status"]["conditions"][0]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastTransitionTime",
    }
    infra_env = trim.trim_infra_env(fixture("infraenv.yaml"))
    assert "spec" not in infra_env
    assert set(infra_env["status"]) == {"isoDownloadURL", "conditions"}


def test_our_kinds_keep_all_of_spec_and_status_but_not_managed_fields(fixture: Load) -> None:
    raw = fixture("go_pool.yaml")
    trimmed = trim.trim_vsphere_agent_pool(raw)
    assert trimmed["spec"] == raw["spec"]
    assert trimmed["status"] == raw["status"]
    assert "managedFields" not in trimmed["metadata"]


def test_keep_applies_a_list_spec_to_every_item_and_skips_mismatched_shapes() -> None:
    spec: trim.Keep = {"items": [{"a": True}], "scalar": {"x": True}}
    value = {"items": [{"a": 1, "b": 2}, {"b": 3}], "scalar": "not a mapping", "other": 1}
    assert trim.keep(value, spec) == {"items": [{"a": 1}, {}]}


def test_every_cached_kind_has_a_trim_function() -> None:
    assert set(trim.BY_KIND) == {
        kinds.AGENT,
        kinds.AGENT_MACHINE,
        kinds.MACHINE,
        kinds.INFRA_ENV,
        kinds.VSPHERE_AGENT_POOL,
        kinds.VSPHERE_AGENT,
    }
    assert kinds.SECRET not in trim.BY_KIND
