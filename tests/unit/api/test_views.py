"""Views of Agent, AgentMachine, Machine and InfraEnv answer the reconcilers' questions
the same way for full API objects and for the informer cache's trimmed copies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentforge.api import names, trim, views
from tests.unit.api.support import upstream_validator

Load = Callable[[str], dict[str, Any]]

UPSTREAM = {
    "agent.yaml": ("agent-install.openshift.io_agents.yaml", "v1beta1"),
    "agentmachine.yaml": ("capi-provider.agent-install.openshift.io_agentmachines.yaml", "v1beta1"),
    "machine.yaml": ("cluster.x-k8s.io_machines.yaml", "v1beta1"),
    "infraenv.yaml": ("agent-install.openshift.io_infraenvs.yaml", "v1beta1"),
}
ParsedView = type[views.Agent | views.AgentMachine | views.Machine | views.InfraEnv]
VIEWS: dict[str, tuple[ParsedView, trim.Trim]] = {
    "agent.yaml": (views.Agent, trim.trim_agent),
    "agentmachine.yaml": (views.AgentMachine, trim.trim_agent_machine),
    "machine.yaml": (views.Machine, trim.trim_machine),
    "infraenv.yaml": (views.InfraEnv, trim.trim_infra_env),
}


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_fixtures_follow_the_upstream_schemas(fixture: Load, name: str) -> None:
    crd_file, version = UPSTREAM[name]
    errors = [e.message for e in upstream_validator(crd_file, version).iter_errors(fixture(name))]
    assert errors == []


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_parse_trimmed_objects_the_same_as_full_ones(fixture: Load, name: str) -> None:
    view, trimmer = VIEWS[name]
    full = fixture(name)
    trimmed = view.model_validate(trimmer(full))
    annotations = full["metadata"].get("annotations", {})
    for dropped in trim.DROPPED_ANNOTATIONS:  # trimming drops these on purpose
        annotations.pop(dropped, None)
    assert trimmed == view.model_validate(full)


@pytest.mark.parametrize("view", [views.Agent, views.AgentMachine, views.Machine, views.InfraEnv])
def test_views_tolerate_objects_without_spec_or_status(view: ParsedView) -> None:
    parsed = view.model_validate({"metadata": {"name": "x", "namespace": "ns"}})
    assert parsed.metadata.name == "x"


def test_agent_view_reads_identity_binding_and_installation(fixture: Load) -> None:
    agent = views.Agent.model_validate(fixture("agent.yaml"))
    assert agent.bios_uuid == "423297c6-d72e-28bb-b279-1209c29ab72b"
    assert agent.mac_addresses == frozenset({"00:50:56:aa:bb:cc"})
    assert agent.hostname == "demo-worker-7d9f8-x2x4q"
    assert agent.infra_env_name == "demo"
    assert agent.agent_machine_ref == "demo-worker-7d9f8-x2x4q"
    assert agent.is_bound
    assert agent.is_installed
    assert not agent.is_deleting
    assert agent.spec.approved
    assert agent.status.debug_info.state == "added-to-existing-cluster"


def test_agent_is_bound_by_label_or_by_cluster_deployment(fixture: Load) -> None:
    raw = fixture("agent.yaml")
    del raw["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF]
    assert views.Agent.model_validate(raw).is_bound
    del raw["spec"]["clusterDeploymentName"]
    assert not views.Agent.model_validate(raw).is_bound
    raw["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = "am-1"
    assert views.Agent.model_validate(raw).is_bound


@pytest.mark.parametrize(("status", "installed"), [("True", True), ("False", False), (None, False)])
def test_agent_is_installed_only_with_installed_true(
    fixture: Load, status: str | None, installed: bool
) -> None:
    raw = fixture("agent.yaml")
    conditions = [c for c in raw["status"]["conditions"] if c["type"] != "Installed"]
    if status is not None:
        conditions.append({"type": "Installed", "status": status, "reason": "x"})
    raw["status"]["conditions"] = conditions
    assert views.Agent.model_validate(raw).is_installed is installed


def test_agent_infra_env_falls_back_to_the_owner_reference(fixture: Load) -> None:
    raw = fixture("agent.yaml")
    del raw["metadata"]["labels"][names.LABEL_INFRAENV]
    assert views.Agent.model_validate(raw).infra_env_name == "demo"
    raw["metadata"]["ownerReferences"] = []
    assert views.Agent.model_validate(raw).infra_env_name is None


def test_agent_with_a_non_vmware_serial_has_no_bios_uuid(fixture: Load) -> None:
    raw = fixture("agent.yaml")
    raw["status"]["inventory"]["systemVendor"]["serialNumber"] = "CZJ1234567"
    assert views.Agent.model_validate(raw).bios_uuid is None


def test_agent_machine_waits_when_ready_false_with_no_suitable_agents(fixture: Load) -> None:
    machine = views.AgentMachine.model_validate(fixture("agentmachine.yaml"))
    assert machine.is_waiting
    assert not machine.is_ready
    assert not machine.has_agent
    assert machine.node_pool == views.NodePoolKey("demo", "demo-worker")
    assert machine.spec.agent_label_selector.match_labels[names.LABEL_AGENT_MACHINE] == (
        "demo-worker-7d9f8-m4n6v"
    )


def test_agent_machine_has_an_agent_by_agent_ref_or_provider_id(fixture: Load) -> None:
    raw = fixture("agentmachine.yaml")
    raw["spec"]["providerID"] = "agent://0b1c2d3e"
    assert views.AgentMachine.model_validate(raw).has_agent
    del raw["spec"]["providerID"]
    raw["status"]["agentRef"] = {"name": "agent-1", "namespace": "demo"}
    parsed = views.AgentMachine.model_validate(raw)
    assert parsed.has_agent
    assert parsed.agent_name == "agent-1"


def test_agent_machine_ready_false_for_another_reason_is_not_waiting(fixture: Load) -> None:
    raw = fixture("agentmachine.yaml")
    raw["status"]["conditions"][0]["reason"] = "AgentNotYetFound"
    assert not views.AgentMachine.model_validate(raw).is_waiting


def test_machine_is_deleting_by_timestamp_or_phase(fixture: Load) -> None:
    raw = fixture("machine.yaml")
    machine = views.Machine.model_validate(raw)
    assert machine.is_deleting
    assert machine.infrastructure_name == "demo-worker-7d9f8-x2x4q"
    assert machine.node_pool == views.NodePoolKey("demo", "demo-worker")
    del raw["metadata"]["deletionTimestamp"]
    assert views.Machine.model_validate(raw).is_deleting
    raw["status"]["phase"] = "Running"
    assert not views.Machine.model_validate(raw).is_deleting


def test_infra_env_exposes_the_iso_url_and_image_created(fixture: Load) -> None:
    infra_env = views.InfraEnv.model_validate(fixture("infraenv.yaml"))
    assert infra_env.image_created
    assert infra_env.iso_download_url is not None
    assert infra_env.iso_download_url.endswith("/minimal.iso")
    assert views.InfraEnv.model_validate({}).iso_download_url is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("demo/demo-worker", views.NodePoolKey("demo", "demo-worker")),
        (" demo/demo-worker ", views.NodePoolKey("demo", "demo-worker")),
        (None, None),
        ("", None),
        ("demo-worker", None),
        ("/demo-worker", None),
        ("demo/", None),
        ("a/b/c", None),
    ],
)
def test_node_pool_annotation_parses_only_namespace_slash_name(
    value: str | None, expected: views.NodePoolKey | None
) -> None:
    assert views.parse_node_pool_annotation(value) == expected
