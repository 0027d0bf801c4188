"""What ships in config/: valid offline, rendered alike by kustomize and kubectl, and secure.

The validator (`make lint`) and the image overlay (`make deploy`) are tested for what they
accept and what they must refuse; kustomize (the pinned binary of `make packaging-tools`)
and the control plane's kubectl must render every kustomization alike, since lint, the
bundle and the chart read the one and `make deploy` applies with the other. Then the
Deployment's security and sizing rules, one by one.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge import settings
from agentforge.api import names, rbac
from agentforge.reconcilers.infra import credentials
from scripts import kustomize, validate_manifests
from sim.paths import binary

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


# --- the whole tree validates ------------------------------------------------------------


def test_every_manifest_under_config_validates_offline() -> None:
    checked, problems = validate_manifests.validate_config(CONFIG)
    assert problems == []
    shipped = len(list(CONFIG.rglob("*.yaml"))) - len(list(CONFIG.rglob("kustomization.yaml")))
    assert checked >= shipped, "every YAML file under config/ is checked"


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


# --- kustomizations -----------------------------------------------------------------------


def _kustomization(directory: Path, body: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(body))


def test_a_kustomization_listing_a_missing_file_fails(tmp_path: Path) -> None:
    _kustomization(tmp_path, {"resources": ["absent.yaml"]})
    with pytest.raises(kustomize.KustomizeError, match=r"absent\.yaml"):
        kustomize.build(tmp_path)


def test_an_object_defined_twice_is_refused(tmp_path: Path) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(cm))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(cm))
    _kustomization(tmp_path, {"resources": ["a.yaml", "b.yaml"]})
    with pytest.raises(kustomize.KustomizeError, match="already registered id"):
        kustomize.build(tmp_path)


def test_a_broken_kustomization_is_a_validation_problem_naming_its_directory(
    tmp_path: Path,
) -> None:
    root = tmp_path / "config"
    shutil.copytree(CONFIG, root)
    kustomization = root / "network-policy" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + "- absent.yaml\n")
    _, problems = validate_manifests.validate_config(root)
    # network-policy itself, and every kustomization that includes it (through default)
    including = {
        "config/network-policy",
        "config/default",
        "config/openshift",
        "config/cert-manager",
    }
    assert len(problems) == len(including), problems
    assert {p.split(":")[0] for p in problems} == including
    assert all("absent.yaml" in p for p in problems)


def test_a_yaml_file_no_kustomization_lists_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "config"
    shutil.copytree(CONFIG, root)
    orphan = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "orphan", "namespace": "agent-forge-system"},
    }
    (root / "manager" / "orphan.yaml").write_text(yaml.safe_dump(orphan))
    _, problems = validate_manifests.validate_config(root)
    assert problems == ["config/manager/orphan.yaml: not listed by any kustomization.yaml"]


def _overlay(*args: str) -> list[dict[str, Any]]:
    """config/default through scripts/kustomize-overlay.sh, as `make deploy` renders it."""
    made = subprocess.run(
        [str(REPO / "scripts" / "kustomize-overlay.sh"), str(CONFIG / "default"), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    overlay = Path(made.stdout.strip())
    try:
        return kustomize.build(overlay)
    finally:
        shutil.rmtree(overlay)


@pytest.mark.parametrize(
    "image",
    [
        "quay.io/acme/agent-forge:v1.2",
        "registry:5000/agent-forge",
        "registry:5000/team/agent-forge:v3",
        "r.example/af@sha256:" + "a" * 64,
        "r.example:443/af:v2@sha256:" + "a" * 64,
    ],
)
def test_deploy_overlay_sets_the_image_telling_registry_ports_from_tags_and_digests(
    image: str,
) -> None:
    objects = _overlay("--image", image)
    images = [
        c["image"]
        for o in objects
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    ]
    if "@" in image:  # by digest alone, a tag next to it dropped
        name, _, digest = image.partition("@")
        name = name.rsplit(":", 1)[0] if ":" in name.rpartition("/")[2] else name
        assert images == [f"{name}@{digest}"]
    else:  # without a tag, config/default's stays, as kustomize's images field does
        tagged = ":" in image.rpartition("/")[2]
        assert images == [image if tagged else image + ":dev"]


def test_deploy_overlay_refuses_what_is_not_an_image_reference() -> None:
    made = subprocess.run(
        [str(REPO / "scripts" / "kustomize-overlay.sh"), str(CONFIG / "default"), "--image", "@x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 2
    assert "not an image reference" in made.stderr


def test_kubectl_applies_namespaces_and_crds_before_anything_else() -> None:
    # `kubectl apply -k` sends objects in kustomize's output order.
    kinds = [o["kind"] for o in _overlay("--image", "x:1")]
    assert kinds[0] == "Namespace"
    first_other = next(
        i for i, k in enumerate(kinds) if k not in {"Namespace", "CustomResourceDefinition"}
    )
    assert set(kinds[first_other:]).isdisjoint({"Namespace", "CustomResourceDefinition"})


def test_undeploy_overlay_drops_the_crds_and_nothing_else() -> None:
    everything = {kustomize.object_id(o) for o in _overlay()}
    kept = {kustomize.object_id(o) for o in _overlay("--without-crds")}
    assert {oid[1] for oid in everything - kept} == {"CustomResourceDefinition"}
    assert len(everything - kept) == 2


@pytest.mark.parametrize(
    "directory", ["default", "crd", "rbac", "manager", "network-policy", "prometheus", "samples"]
)
def test_pinned_kustomize_renders_as_the_control_planes_kubectl(directory: str) -> None:
    kubectl = binary("kubectl")  # built by `make controlplane`; fails with that hint if missing
    output = subprocess.run(
        [str(kubectl), "kustomize", str(CONFIG / directory)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    theirs = [o for o in yaml.safe_load_all(output) if o]
    assert kustomize.build(CONFIG / directory) == theirs


# --- the Deployment: security ----------------------------------------------------------------


def test_manager_runs_as_non_root_without_fixing_a_uid_or_gid(
    deployment: dict[str, Any], manager: dict[str, Any]
) -> None:
    # OpenShift's restricted-v2 assigns the UID from the namespace's range; elsewhere the
    # image's numeric USER applies (tests/unit/test_pod_security.py has every rule).
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


def test_service_monitor_scrapes_https_with_prometheus_own_bound_token() -> None:
    (endpoint,) = _one(CONFIG / "prometheus" / "monitor.yaml", "ServiceMonitor")["spec"][
        "endpoints"
    ]
    assert endpoint["scheme"] == "https"
    # The projected token of the Prometheus pod (bound, expiring), not a Secret's.
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert "authorization" not in endpoint
    kinds = {o["kind"] for o in kustomize.build(CONFIG / "prometheus")}
    assert "Secret" not in kinds, "no legacy (non-expiring) token Secret ships"
    (binding,) = _load(CONFIG / "prometheus" / "metrics_reader.yaml")
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]
    role = _one(CONFIG / "rbac" / "metrics_reader_role.yaml", "ClusterRole")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def _verified_install(overlay: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The ServiceMonitor endpoint of an overlay that verifies /metrics, and its objects
    by kind/name."""
    objects = {f"{o['kind']}/{o['metadata']['name']}": o for o in kustomize.build(CONFIG / overlay)}
    monitor = objects["ServiceMonitor/agent-forge-controller-manager-metrics-monitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    service = objects["Service/agent-forge-controller-manager-metrics-service"]
    meta = service["metadata"]
    assert endpoint["tlsConfig"]["serverName"] == f"{meta['name']}.{meta['namespace']}.svc"
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]
    assert "authorization" not in endpoint
    assert endpoint["bearerTokenFile"]
    pod = objects["Deployment/agent-forge-controller-manager"]["spec"]["template"]["spec"]
    (manager,) = pod["containers"]
    (flag,) = [a for a in manager["args"] if a.startswith("--metrics-cert-path=")]
    mount_path = flag.partition("=")[2]
    (mount,) = [m for m in manager["volumeMounts"] if m["mountPath"] == mount_path]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "agent-forge-metrics-tls"
    return endpoint, objects


def test_openshift_overlay_serves_the_service_ca_certificate_the_platform_prometheus_verifies() -> (
    None
):
    endpoint, objects = _verified_install("openshift")
    service = objects["Service/agent-forge-controller-manager-metrics-service"]
    annotations = service["metadata"]["annotations"]
    assert annotations == {
        "service.beta.openshift.io/serving-cert-secret-name": "agent-forge-metrics-tls"
    }
    assert endpoint["tlsConfig"] == {
        "caFile": "/etc/prometheus/configmaps/serving-certs-ca-bundle/service-ca.crt",
        "serverName": endpoint["tlsConfig"]["serverName"],
    }
    namespace = objects["Namespace/agent-forge-system"]["metadata"]["labels"]
    assert namespace["openshift.io/cluster-monitoring"] == "true"
    platform = {
        "kind": "ServiceAccount",
        "name": "prometheus-k8s",
        "namespace": "openshift-monitoring",
    }
    assert objects["ClusterRoleBinding/agent-forge-metrics-reader"]["subjects"] == [platform]
    assert objects["RoleBinding/agent-forge-prometheus-k8s"]["subjects"] == [platform]


def test_cert_manager_overlay_serves_a_certificate_verified_against_the_issuers_ca() -> None:
    endpoint, objects = _verified_install("cert-manager")
    serving = objects["Certificate/agent-forge-metrics-tls"]["spec"]
    assert serving["secretName"] == "agent-forge-metrics-tls"
    assert endpoint["tlsConfig"]["serverName"] in serving["dnsNames"]
    issuer = objects[f"Issuer/{serving['issuerRef']['name']}"]["spec"]
    ca = objects[f"Certificate/{issuer['ca']['secretName']}"]["spec"]
    assert ca["isCA"] is True
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": ca["secretName"], "key": "ca.crt"}}


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
    required = {credentials.KEY_SERVER, credentials.KEY_USERNAME, credentials.KEY_PASSWORD}
    assert required <= keys
    optional = {credentials.KEY_INSECURE, *credentials.CA_BUNDLE_KEYS}
    assert keys - required <= optional
    assert keys & set(credentials.CA_BUNDLE_KEYS), "the sample shows the CA bundle key"
    assert "REPLACE" in secret["stringData"][credentials.KEY_PASSWORD]


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


def test_deploy_overlay_binds_the_credentials_reader_in_each_named_namespace_only() -> None:
    """`make deploy CREDENTIAL_NAMESPACES="a b"`: a RoleBinding per namespace and the list in
    the manager's environment, so the operator starts and reads Secrets there only."""
    plain = _overlay("--image", "x:1")
    objects = _overlay(
        "--image", "x:1", "--credential-namespace", "vsphere-creds", "--credential-namespace", "b"
    )
    added = {kustomize.object_id(o) for o in objects} - {kustomize.object_id(o) for o in plain}
    assert added == {
        ("rbac.authorization.k8s.io", "RoleBinding", ns, names.CREDENTIALS_READER_ROLE)
        for ns in ("vsphere-creds", "b")
    }
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        if binding["metadata"]["name"] == names.CREDENTIALS_READER_ROLE:
            assert binding == rbac.credentials_binding(binding["metadata"]["namespace"])
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in manager.get("env") or []}
    assert env == {"AGENT_FORGE_CREDENTIAL_NAMESPACE": "vsphere-creds,b"}
    assert not any(
        o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == names.CREDENTIALS_READER_ROLE
        for o in objects
    )
    refused = subprocess.run(
        [str(REPO / "scripts" / "kustomize-overlay.sh"), str(CONFIG / "default"),
         "--credential-namespace", "Not_A_Namespace"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "not a namespace name" in refused.stderr
