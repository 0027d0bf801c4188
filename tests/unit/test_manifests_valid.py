"""What ships in config/, read as written: the validator's rules, then the Deployment's
security and sizing rules, one by one.

The validator (`make lint`) is tested for what it accepts and what it must refuse. How
kustomize renders config/ (the whole tree valid, `make deploy`'s image overlay, kubectl
alike) needs the Go-built tools and is in tests/packaging/test_kustomize.py.
"""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge import secret_credentials, settings
from agentforge.api import names
from scripts import validate_manifests

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str) -> dict[str, Any]:
    found = [d for d in _load(path) if d["kind"] == kind]
    assert len(found) == 1, f"{path} should hold exactly one {kind}"
    return found[0]


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    return _one(CONFIG / "manager" / "manager.yaml", "Deployment")


@pytest.fixture(scope="module")
def manager(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["manager"]
    return dict(containers[0])


@pytest.fixture(scope="module")
def crds() -> dict[tuple[str, str], Any]:
    return validate_manifests.crd_schemas(CONFIG / "crd")


# --- the validator -----------------------------------------------------------------------


def test_validator_refuses_an_unknown_field_in_a_kubernetes_object(
    deployment: dict[str, Any], crds: dict[tuple[str, str], Any]
) -> None:
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    problems = validate_manifests.validate_object(broken, crds=crds)
    assert any("imagePullPolicyy" in p for p in problems)


def test_validator_refuses_a_misspelt_field_in_a_pool(crds: dict[tuple[str, str], Any]) -> None:
    pool = _one(
        CONFIG / "samples" / "agent-forge_v1alpha1_vsphereagentpool.yaml", "VsphereAgentPool"
    )
    assert validate_manifests.validate_object(pool, crds=crds) == []
    broken = copy.deepcopy(pool)
    broken["spec"]["template"]["numCPU"] = 4
    problems = validate_manifests.validate_object(broken, crds=crds)
    assert any("numCPU" in p for p in problems)
    broken = copy.deepcopy(pool)
    broken["spec"]["template"]["numCPUs"] = 512
    assert validate_manifests.validate_object(broken, crds=crds) != []


def test_validator_refuses_a_service_monitor_endpoint_without_a_port(
    crds: dict[tuple[str, str], Any],
) -> None:
    monitor = _one(CONFIG / "prometheus" / "monitor.yaml", "ServiceMonitor")
    broken = copy.deepcopy(monitor)
    del broken["spec"]["endpoints"][0]["port"]
    assert validate_manifests.validate_object(broken, crds=crds) != []


def test_validator_refuses_an_alert_on_a_metric_the_operator_does_not_export(
    crds: dict[tuple[str, str], Any],
) -> None:
    rule = _one(CONFIG / "prometheus" / "prometheus_rule.yaml", "PrometheusRule")
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["expr"] = "agent_forge_pool_capacity_typo > 0"
    problems = validate_manifests.validate_object(broken, crds=crds)
    assert problems == [
        "rule AgentForgeDemandDeficitNotShrinking: metric agent_forge_pool_capacity_typo "
        "is not exported by the operator"
    ]


def test_validator_refuses_unbalanced_promql() -> None:
    assert validate_manifests.promql_problems('sum(rate(x{a="("}[5m])') == ["unclosed '('"]
    assert validate_manifests.promql_problems('sum(rate(x{a=")"}[5m]))') == []


def test_promql_metric_names_skip_functions_labels_keywords_and_durations() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (name, le) (rate(workqueue_queue_duration_seconds_bucket"
        '{job=~"agent-forge-.*"}[10m]))) > 60 and on (name) up offset 5m unless absent(x_y)'
    )
    assert validate_manifests.promql_metric_names(expr) == {
        "workqueue_queue_duration_seconds_bucket",
        "up",
        "x_y",
    }


def test_every_metric_in_alerts_and_dashboard_is_exported_by_the_operator() -> None:
    rule = _one(CONFIG / "prometheus" / "prometheus_rule.yaml", "PrometheusRule")
    used: set[str] = set()
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            used |= validate_manifests.promql_metric_names(alert["expr"])
    dashboard = (CONFIG / "prometheus" / "grafana-dashboard.json").read_text()
    for expr in re.findall(r'"expr": "((?:[^"\\]|\\.)*)"', dashboard):
        text = expr.encode().decode("unicode_escape")
        used |= validate_manifests.promql_metric_names(re.sub(r"\$\{?\w+\}?", "x", text))
    assert used, "alerts and dashboard query metrics"
    assert sorted(used - validate_manifests.exported_metric_names()) == []


def test_alerts_cover_the_failure_modes_operators_page_on() -> None:
    rule = _one(CONFIG / "prometheus" / "prometheus_rule.yaml", "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    wanted = {
        "AgentForgeDemandDeficitNotShrinking": 'state="demand_deficit"',
        "AgentForgeISOEjectionFailed": 'reason="EjectionFailed"',
        "AgentForgeISOPruneFailing": 'operation="prune"',
        "AgentForgeVsphereOperationsFailing": "agent_forge_vsphere_vm_operations_total",
        "AgentForgeReconcileErrors": 'result="error"',
        "AgentForgeWorkQueueBackingUp": "workqueue_depth",
        "AgentForgeNoLeader": "leader_election_master_status",
    }
    for alert, needle in wanted.items():
        assert needle in alerts.get(alert, ""), alert


# --- the Deployment: security ----------------------------------------------------------------


def test_manager_runs_as_non_root_without_fixing_a_uid_or_gid(
    deployment: dict[str, Any], manager: dict[str, Any]
) -> None:
    # OpenShift's restricted-v2 assigns the UID from the namespace's range; elsewhere the
    # image's numeric USER applies (tests/packaging/test_pod_security.py has every rule).
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert manager["securityContext"]["runAsNonRoot"] is True
    for context in (pod, manager["securityContext"]):
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context)


def test_manager_root_filesystem_is_read_only_with_a_writable_tmp(
    deployment: dict[str, Any], manager: dict[str, Any]
) -> None:
    assert manager["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in manager["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_manager_drops_all_capabilities_and_forbids_privilege_escalation(
    manager: dict[str, Any],
) -> None:
    context = manager["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False


def test_manager_uses_the_runtime_default_seccomp_profile(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}


def test_manager_meets_the_restricted_pod_security_standard(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(field), field
    allowed = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= allowed, volume
    for container in pod["containers"] + pod.get("initContainers", []):
        assert all("hostPort" not in port for port in container.get("ports", []))
    namespace = _one(CONFIG / "manager" / "namespace.yaml", "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_manager_runs_as_the_generated_service_account_in_the_generated_namespace(
    deployment: dict[str, Any],
) -> None:
    assert deployment["metadata"]["namespace"] == names.DEPLOYMENT_NAMESPACE
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == names.SERVICE_ACCOUNT
    service_account = _one(CONFIG / "rbac" / "service_account.yaml", "ServiceAccount")
    assert service_account["metadata"]["name"] == names.SERVICE_ACCOUNT


# --- the Deployment: availability and operation --------------------------------------------


def _settings_of(manager: dict[str, Any]) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser)
    return settings.load(
        parser.parse_args(manager["args"]),
        environ={},
        namespace_file=Path(__file__),  # any readable file stands in for the pod's namespace
    )


def test_manager_args_are_valid_operator_flags_with_leader_election(
    manager: dict[str, Any],
) -> None:
    parsed = _settings_of(manager)
    assert parsed.leader_elect is True
    assert not parsed.namespaces  # every namespace


def test_manager_probes_hit_healthz_and_readyz_on_the_bound_health_port(
    manager: dict[str, Any],
) -> None:
    parsed = _settings_of(manager)
    ports = {p["name"]: p["containerPort"] for p in manager["ports"]}
    assert parsed.health_probe_bind_address is not None
    assert parsed.metrics_bind_address is not None
    assert ports["health"] == parsed.health_probe_bind_address.port
    assert ports["metrics"] == parsed.metrics_bind_address.port
    assert manager["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert manager["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_two_replicas_spread_by_preferred_anti_affinity_and_a_disruption_budget(
    deployment: dict[str, Any],
) -> None:
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    preferred = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    budget = _one(CONFIG / "manager" / "pod_disruption_budget.yaml", "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert budget["spec"]["maxUnavailable"] == 1


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * _UNITS[unit]


def _benchmarked_rss_bytes() -> int:
    latest = (REPO / "bench" / "results" / "latest.md").read_text()
    match = re.search(r"\| RSS, steady, caches synced \| ([\d.,]+) \| MB \|", latest)
    assert match, "bench/results/latest.md reports the steady RSS"
    return int(float(match.group(1).replace(",", "")) * 1e6)


def test_memory_request_covers_the_benchmarked_steady_rss_with_headroom_to_the_limit(
    manager: dict[str, Any],
) -> None:
    rss = _benchmarked_rss_bytes()  # 10,000 each of Agents, AgentMachines, Machines cached
    resources = manager["resources"]
    assert _bytes(resources["requests"]["memory"]) >= rss
    assert _bytes(resources["limits"]["memory"]) >= 3 * rss
    assert "cpu" in resources["requests"]
    assert "cpu" in resources["limits"]


def test_metrics_service_and_network_policy_expose_only_the_metrics_port(
    deployment: dict[str, Any], manager: dict[str, Any]
) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _one(CONFIG / "default" / "metrics_service.yaml", "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    policy = _one(CONFIG / "network-policy" / "allow-metrics-traffic.yaml", "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    metrics_port = {p["name"]: p["containerPort"] for p in manager["ports"]}["metrics"]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [metrics_port]


def test_manager_serves_metrics_over_https_behind_the_api_servers_review(
    manager: dict[str, Any],
) -> None:
    parsed = _settings_of(manager)
    assert parsed.metrics_secure is True
    assert parsed.metrics_bind_address is not None
    assert parsed.health_probe_bind_address is not None
    assert parsed.metrics_bind_address.port == 8443
    assert parsed.health_probe_bind_address.port != parsed.metrics_bind_address.port


def test_service_monitor_selects_the_metrics_service() -> None:
    service = _one(CONFIG / "default" / "metrics_service.yaml", "Service")
    monitor = _one(CONFIG / "prometheus" / "monitor.yaml", "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]


# --- samples ----------------------------------------------------------------------------


def test_sample_secret_uses_the_keys_the_operator_reads() -> None:
    secret = _one(CONFIG / "samples" / "vsphere_credentials_secret.yaml", "Secret")
    keys = set(secret["stringData"])
    required = {
        secret_credentials.KEY_SERVER,
        secret_credentials.KEY_USERNAME,
        secret_credentials.KEY_PASSWORD,
    }
    assert required <= keys
    optional = {secret_credentials.KEY_INSECURE, *secret_credentials.CA_BUNDLE_KEYS}
    assert keys - required <= optional
    assert keys & set(secret_credentials.CA_BUNDLE_KEYS), "the sample shows the CA bundle key"
    assert "REPLACE" in secret["stringData"][secret_credentials.KEY_PASSWORD]


def test_sample_pool_names_the_sample_secret_and_adopted_agent_names_the_pool() -> None:
    pool = _one(
        CONFIG / "samples" / "agent-forge_v1alpha1_vsphereagentpool.yaml", "VsphereAgentPool"
    )
    secret = _one(CONFIG / "samples" / "vsphere_credentials_secret.yaml", "Secret")
    agent = _one(
        CONFIG / "samples" / "agent-forge_v1alpha1_vsphereagent_adopted.yaml", "VsphereAgent"
    )
    assert pool["spec"]["vsphere"]["credentialsSecretRef"]["name"] == secret["metadata"]["name"]
    assert pool["metadata"]["namespace"] == secret["metadata"]["namespace"]
    assert agent["spec"]["poolRef"]["name"] == pool["metadata"]["name"]
    labels, annotations = agent["metadata"]["labels"], agent["metadata"]["annotations"]
    assert labels[names.LABEL_CREATED_FOR] == names.CreatedFor.ADOPTED.value
    assert labels[names.LABEL_POOL] == pool["metadata"]["name"]
    assert annotations[names.ANNOTATION_VM_NAME]
    assert annotations[names.ANNOTATION_VM_BIOS_UUID]
