"""Trim functions keep what the reconcilers read and little else, so that the informer
cache of 10,000 Agents with multi-KB inventories stays far below 150 MB."""

from __future__ import annotations

import copy
import json
import sys
import tracemalloc
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from agentforge.api import kinds, names, trim, views
from agentforge.reconcilers.common import indexes
from agentforge.reconcilers.planning import snapshot

Load = Callable[[str], dict[str, Any]]


@pytest.fixture(autouse=True)
def _empty_shared_table() -> None:
    """Each test starts with no shared mappings (the table is emptied when full)."""
    trim._shared.clear()


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


# --- what the reconcilers read survives the trim --------------------------------------
#
# Every read of a cached Agent, AgentMachine, Machine or InfraEnv goes through one of
# these: the planner's facts (`snapshot`), the index functions, the views' answers the
# reconcilers ask directly, and the involvedObject of an Event recorded on the object.
# A keep-spec may drop anything else; it must not change any of these.


def _involved(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta = obj.get("metadata") or {}
    return (
        obj.get("apiVersion"),
        obj.get("kind"),
        *(meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")),
    )


def _agent_reads(obj: dict[str, Any]) -> tuple[Any, ...]:
    view = views.Agent.model_validate(obj)
    installed = view.status.condition(views.CONDITION_INSTALLED)
    return (
        snapshot.agent_facts(obj),
        indexes.infra_env_of_agent(obj),
        indexes.agent_identity_keys(obj),
        view.metadata.key,
        view.metadata.resource_version,
        view.is_installed,
        (installed.status, installed.reason) if installed else None,
        view.is_bound,
    )


def _agent_machine_reads(obj: dict[str, Any]) -> tuple[Any, ...]:
    view = views.AgentMachine.model_validate(obj)
    return (
        snapshot.agent_machine_facts(obj),
        indexes.control_plane_object_key(obj),
        _involved(obj),
        view.metadata.key,
        view.node_pool,
        view.is_waiting,
        view.spec.agent_label_selector.match_labels,
    )


def _machine_reads(obj: dict[str, Any]) -> tuple[Any, ...]:
    view = views.Machine.model_validate(obj)
    return (
        snapshot.machine_facts(obj),
        indexes.control_plane_object_key(obj),
        view.metadata.key,
        view.node_pool,
    )


def _infra_env_reads(obj: dict[str, Any]) -> tuple[Any, ...]:
    view = views.InfraEnv.model_validate(obj)
    return (snapshot.infra_env_facts(obj), view.metadata.key, view.iso_download_url)


READS: dict[str, tuple[trim.Trim, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {
    "agent.yaml": (trim.trim_agent, _agent_reads),
    "agentmachine.yaml": (trim.trim_agent_machine, _agent_machine_reads),
    "machine.yaml": (trim.trim_machine, _machine_reads),
    "infraenv.yaml": (trim.trim_infra_env, _infra_env_reads),
}


def _unbound_agent_known_by_mac(raw: dict[str, Any]) -> None:
    del raw["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF]
    del raw["metadata"]["labels"][names.LABEL_INFRAENV]  # InfraEnv from the ownerReference
    del raw["spec"]["clusterDeploymentName"]
    raw["status"]["inventory"]["systemVendor"]["serialNumber"] = "not-a-vmware-serial"
    raw["metadata"]["deletionTimestamp"] = "2026-03-02T12:00:00Z"


def _installed_false(raw: dict[str, Any]) -> None:
    for condition in raw["status"]["conditions"]:
        if condition["type"] == views.CONDITION_INSTALLED:
            condition.update(status="False", reason="InstallationInProgress")


def _agent_machine_with_agent(raw: dict[str, Any]) -> None:
    raw["spec"]["providerID"] = f"{names.AGENT_PROVIDER_ID_PREFIX}0b1c2d3e"
    raw["status"]["agentRef"] = {"name": "0b1c2d3e", "namespace": "demo"}
    raw["status"]["conditions"][0].update(status="True", reason="", message="")


VARIANTS: list[tuple[str, Callable[[dict[str, Any]], None] | None]] = [
    ("agent.yaml", None),
    ("agent.yaml", _unbound_agent_known_by_mac),
    ("agent.yaml", _installed_false),
    ("agentmachine.yaml", None),
    ("agentmachine.yaml", _agent_machine_with_agent),
    ("machine.yaml", None),
    ("infraenv.yaml", None),
]


@pytest.mark.parametrize(
    ("name", "change"), VARIANTS, ids=[f"{n}-{c.__name__ if c else 'as-is'}" for n, c in VARIANTS]
)
def test_the_reconcilers_read_the_same_from_trimmed_and_full_objects(
    fixture: Load, name: str, change: Callable[[dict[str, Any]], None] | None
) -> None:
    trimmer, reads = READS[name]
    full = fixture(name)
    if change is not None:
        change(full)
    assert reads(trimmer(copy.deepcopy(full))) == reads(full)


# --- exactly the listed paths -------------------------------------------------------------


def _listed(spec: trim.Keep, prefix: str = "") -> set[str]:
    """The dotted paths a keep-spec names (a whole-kept value contributes its own path)."""
    if isinstance(spec, trim.Shared):
        return _listed(spec.spec, prefix)
    if isinstance(spec, list):
        return _listed(spec[0], prefix)
    if not isinstance(spec, Mapping):
        return set()
    found: set[str] = set()
    for key, sub in spec.items():
        path = f"{prefix}.{key}" if prefix else key
        found |= {path} | _listed(sub, path)
    return found


WHOLE = ("metadata.labels.", "metadata.annotations.", "spec.clusterDeploymentName.")


@pytest.mark.parametrize(
    ("name", "trimmer", "spec"),
    [
        ("agent.yaml", trim.trim_agent, trim.AGENT),
        ("agentmachine.yaml", trim.trim_agent_machine, trim.AGENT_MACHINE),
        ("machine.yaml", trim.trim_machine, trim.MACHINE),
        ("infraenv.yaml", trim.trim_infra_env, trim.INFRA_ENV),
    ],
)
def test_trimmed_objects_keep_only_the_paths_their_keep_spec_lists(
    fixture: Load, name: str, trimmer: trim.Trim, spec: trim.Keep
) -> None:
    kept = paths(trimmer(fixture(name)))
    listed = _listed(spec)
    assert {p for p in kept if not p.startswith(WHOLE) and "matchLabels." not in p} <= listed
    assert not {p for p in kept if p.startswith(WHOLE)} - {
        p for p in paths(fixture(name)) if p.startswith(WHOLE)
    }


def test_trimmed_capi_objects_keep_exactly_these_paths(fixture: Load) -> None:
    machine = paths(trim.trim_machine(fixture("machine.yaml")))
    assert {p for p in machine if not p.startswith(WHOLE)} == {
        "apiVersion",
        "kind",
        "metadata",
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.resourceVersion",
        "metadata.generation",
        "metadata.creationTimestamp",
        "metadata.deletionTimestamp",
        "metadata.finalizers",
        "metadata.labels",
        "metadata.annotations",
        "spec",
        "spec.infrastructureRef",
        "spec.infrastructureRef.kind",
        "spec.infrastructureRef.name",
        "status",
        "status.phase",
        "status.nodeRef",
        "status.nodeRef.kind",
        "status.nodeRef.name",
    }
    agent_machine = paths(trim.trim_agent_machine(fixture("agentmachine.yaml")))
    assert {p for p in agent_machine if not p.startswith(WHOLE) and "matchLabels." not in p} == {
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
        "metadata.annotations",
        "metadata.ownerReferences",
        "metadata.ownerReferences.apiVersion",
        "metadata.ownerReferences.kind",
        "metadata.ownerReferences.name",
        "metadata.ownerReferences.uid",
        "metadata.ownerReferences.controller",
        "metadata.ownerReferences.blockOwnerDeletion",
        "spec",
        "spec.agentLabelSelector",
        "spec.agentLabelSelector.matchLabels",
        "status",
        "status.conditions",
        "status.conditions.type",
        "status.conditions.status",
        "status.conditions.reason",
        "status.conditions.message",
        "status.conditions.lastTransitionTime",
    }


# --- shared mappings -----------------------------------------------------------------------


def _agents(fixture: Load, count: int) -> list[dict[str, Any]]:
    text = json.dumps(fixture("agent.yaml"))
    out = []
    for i in range(count):
        obj = json.loads(text)  # as the watch delivers them: every object its own strings
        obj["metadata"]["name"] = obj["metadata"]["uid"] = f"agent-{i:08d}"
        out.append(trim.trim_agent(obj))
    return out


def test_cached_agents_share_their_equal_conditions_labels_and_debug_info(fixture: Load) -> None:
    agents = _agents(fixture, 50)
    conditions = {id(c) for a in agents for c in a["status"]["conditions"]}
    assert len(conditions) == len(agents[0]["status"]["conditions"])
    assert len({id(a["metadata"]["labels"]) for a in agents}) == 1
    assert len({id(a["status"]["debugInfo"]) for a in agents}) == 1
    # what is not shared stays each object's own
    assert len({id(a["metadata"]) for a in agents}) == len(agents)
    assert len({id(a["status"]["inventory"]) for a in agents}) == len(agents)


def test_capi_objects_share_labels_annotations_selectors_conditions_and_status(
    fixture: Load,
) -> None:
    first, second = (trim.trim_agent_machine(fixture("agentmachine.yaml")) for _ in range(2))
    assert first["metadata"]["labels"] is second["metadata"]["labels"]
    assert first["metadata"]["annotations"] is second["metadata"]["annotations"]
    matches = first["spec"]["agentLabelSelector"], second["spec"]["agentLabelSelector"]
    assert matches[0]["matchLabels"] is matches[1]["matchLabels"]
    assert first["status"]["conditions"] is second["status"]["conditions"]
    agents = trim.trim_agent(fixture("agent.yaml")), trim.trim_agent(fixture("agent.yaml"))
    assert agents[0]["status"]["conditions"] is agents[1]["status"]["conditions"]
    raw = fixture("machine.yaml")
    del raw["status"]["nodeRef"]
    machines = trim.trim_machine(raw), trim.trim_machine(copy.deepcopy(raw))
    assert machines[0]["status"] is machines[1]["status"] == {"phase": "Deleting"}


def test_only_equal_mappings_of_strings_and_booleans_are_shared() -> None:
    spec = trim.Shared()
    assert trim.keep({"a": "True"}, spec) is not trim.keep({"a": True}, spec)
    assert trim.keep({"a": True}, spec) is trim.keep({"a": True}, spec)
    assert trim.keep({"a": "x", "b": "y"}, spec) is not trim.keep({"b": "y", "a": "x"}, spec)
    assert trim.keep({"a": "x"}, spec) is not trim.keep({"a": "y"}, spec)
    one, other = trim.keep({"n": 1}, spec), trim.keep({"n": 1}, spec)
    assert one == other == {"n": 1}
    assert one is not other  # 1 == True: numbers are never shared
    nested = {"ref": {"name": "x"}}
    assert trim.keep(nested, spec) is not trim.keep(nested, spec)
    assert trim.keep("not a mapping", spec) == "not a mapping"
    assert trim.keep({"a": "x"}, trim.Shared({"b": True})) == {}


def test_shared_annotations_never_hold_the_dropped_ones(fixture: Load) -> None:
    raw = fixture("agentmachine.yaml")
    raw["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    with_it, without = (
        trim.trim_agent_machine(raw),
        trim.trim_agent_machine(fixture("agentmachine.yaml")),
    )
    assert with_it["metadata"]["annotations"] is without["metadata"]["annotations"]
    assert not trim.DROPPED_ANNOTATIONS & set(with_it["metadata"]["annotations"])
    assert all(not trim.DROPPED_ANNOTATIONS & set(key) for key in trim._shared)
    only_dropped = fixture("agent.yaml")  # its one annotation is kubectl's
    assert "annotations" not in trim.trim_agent(only_dropped)["metadata"]


def test_the_shared_table_stays_bounded() -> None:
    for i in range(trim._SHARED_MAX + 10):
        trim.keep({"unique": str(i)}, trim.Shared())
    assert len(trim._shared) <= trim._SHARED_MAX


def test_our_own_kinds_are_never_shared(fixture: Load) -> None:
    first, second = (trim.trim_vsphere_agent_pool(fixture("go_pool.yaml")) for _ in range(2))
    assert first == second
    assert first["metadata"]["annotations"] is not second["metadata"]["annotations"]
    assert first["spec"] is not second["spec"]
    assert first["status"] is not second["status"]


def test_conditions_drop_observed_generation_which_nothing_reads(fixture: Load) -> None:
    raw = fixture("agentmachine.yaml")
    raw["status"]["conditions"][0]["observedGeneration"] = 2
    condition = trim.trim_agent_machine(raw)["status"]["conditions"][0]
    assert "observedGeneration" not in condition
    assert (
        condition
        is trim.trim_agent_machine(fixture("agentmachine.yaml"))["status"]["conditions"][0]
    )


def test_any_other_kind_is_kept_whole_but_for_managed_fields_and_last_applied() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "a1",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "9",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                "keep": "me",
            },
        },
        "data": {"big": "x" * 500, "small": "y"},
    }
    out = trim.trim_any(copy.deepcopy(obj))
    assert out["metadata"] == {
        "name": "a1",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": "9",
        "annotations": {"keep": "me"},
    }
    assert out["data"] == obj["data"]
    assert out["kind"] == "ConfigMap"


def test_trims_intern_keys_and_short_values() -> None:
    one = trim.trim_any({"metadata": {}, "".join(["sta", "tus"]): "".join(["Tr", "ue"])})
    two = trim.trim_any({"metadata": {}, "".join(["st", "atus"]): "".join(["T", "rue"])})
    (k1, v1), (k2, v2) = [next((k, v) for k, v in o.items() if k != "metadata") for o in (one, two)]
    assert k1 is k2
    assert v1 is v2
    assert v1 is sys.intern("True")


def test_only_equal_lists_of_shareable_mappings_are_shared() -> None:
    spec = trim.Shared([trim.Shared()])
    assert trim.keep([{"a": "x"}, {"b": "y"}], spec) is trim.keep([{"a": "x"}, {"b": "y"}], spec)
    assert trim.keep([{"a": "x"}, {"b": "y"}], spec) is not trim.keep([{"a": "x", "b": "y"}], spec)
    assert trim.keep([{"a": "x"}], spec) is not trim.keep([{"a": "x"}, {"a": "x"}], spec)
    one, other = trim.keep([{"n": 1}], spec), trim.keep([{"n": 1}], spec)
    assert one == other == [{"n": 1}]
    assert one is not other
