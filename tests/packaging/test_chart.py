"""The Helm chart: generated from config/, rendering config/'s objects, refusing bad values.

`charts/agent-forge` must be exactly what `make chart` writes from config/ today; Helm
itself (`.build/bin/helm`, built from helm.sh/helm/v4) must lint it strictly, and with
default values `helm template` must render the objects `kustomize build config/default`
renders (the Namespace and the CRDs aside, which Helm handles apart), in the release
namespace, with Helm's labels added and nothing else changed. Values change what they
name and only that; a misspelt or mistyped value is refused by the chart's schema.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import chart, kustomize
from sim.metrics_reader import servicemonitor_targets
from sim.paths import binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agent-forge"
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary("helm")), *args], capture_output=True, text=True, check=False)


def template(
    *sets: str, namespace: str = "agent-forge-system", json_values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    flags = [f"--set={s}" for s in sets]
    flags += [f"--set-json={k}={json.dumps(v)}" for k, v in (json_values or {}).items()]
    result = helm("template", "agent-forge", str(CHART), "--namespace", namespace, *flags)
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def _without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    labels = out["metadata"].get("labels") or {}
    assert set(labels) >= HELM_LABELS, f"{obj['kind']} {obj['metadata']['name']}"
    for key in HELM_LABELS:
        labels.pop(key)
    if not labels:
        out["metadata"].pop("labels")
    return out


def _by_id(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {kustomize.object_id(o): o for o in objects}


def test_committed_chart_is_what_make_chart_generates() -> None:
    files = chart.render()
    for path, text in files.items():
        assert path.read_text() == text, f"{path} drifted: run `make chart`"
    assert {p for p in CHART.rglob("*") if p.is_file()} == set(files)


def test_helm_lints_the_chart_strictly() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_default_values_render_configs_objects_with_helms_labels() -> None:
    config = [
        o
        for o in kustomize.build(REPO / "config" / "default")
        if o["kind"] not in {"Namespace", "CustomResourceDefinition"}
    ]
    rendered = [_without_helm_labels(o) for o in template()]
    expected = _by_id(config)
    deployment = next(o for o in expected.values() if o["kind"] == "Deployment")
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        container["image"] = (
            "agent-forge:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        )
    assert _by_id(rendered) == expected


def test_crds_are_configs_crds() -> None:
    config = {o["metadata"]["name"]: o for o in kustomize.build(REPO / "config" / "crd")}
    shipped = {p.stem: yaml.safe_load(p.read_text()) for p in (CHART / "crds").glob("*.yaml")}
    assert shipped == config


def test_values_set_image_namespaces_replicas_and_resources_in_the_release_namespace() -> None:
    objects = template(
        "image.repository=quay.io/acme/agent-forge",
        "image.digest=sha256:" + "c" * 64,
        "namespaces={clusters,clusters-example}",
        "replicaCount=3",
        "resources.limits.memory=1Gi",
        "logLevel=debug",
        namespace="platform-operators",
    )
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "platform-operators"
    assert deployment["spec"]["replicas"] == 3
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == "quay.io/acme/agent-forge@sha256:" + "c" * 64
    args = manager["args"]
    assert {"--log-level=debug", "--namespace=clusters", "--namespace=clusters-example"} <= set(
        args
    )
    assert args.index("--namespace=clusters") < args.index("--namespace=clusters-example")
    assert not any(a.startswith("--log-level=") and a != "--log-level=debug" for a in args)
    assert manager["resources"]["limits"]["memory"] == "1Gi"
    bindings = [o for o in objects if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert bindings
    for binding in bindings:
        assert [s["namespace"] for s in binding["subjects"]] == ["platform-operators"]


def test_switches_leave_out_network_policies_and_pdb_and_add_monitoring() -> None:
    kinds = {
        o["kind"]
        for o in template("networkPolicy.enabled=false", "podDisruptionBudget.enabled=false")
    }
    assert not kinds & {"NetworkPolicy", "PodDisruptionBudget"}
    default_ids = set(_by_id(template()))
    monitored = template("monitoring.enabled=true")
    added = [o for oid, o in _by_id(monitored).items() if oid not in default_ids]
    expected = _by_id(kustomize.build(REPO / "config" / "prometheus"))
    assert _by_id([_without_helm_labels(o) for o in added]) == expected
    rule = next(o for o in added if o["kind"] == "PrometheusRule")
    annotations = [r["annotations"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels." in text for a in annotations for text in a.values()), (
        "alert templates reach Prometheus unrendered by Helm"
    )


def _manager(pod: dict[str, Any]) -> dict[str, Any]:
    (manager,) = [c for c in pod["spec"]["containers"] if c["name"] == "manager"]
    found: dict[str, Any] = manager
    return found


PROXY_ENV = [
    {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
    {"name": "NO_PROXY", "valueFrom": {"configMapKeyRef": {"name": "proxy", "key": "no"}}},
]
TOLERATIONS = [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}]
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "infra", "operator": "Exists", "values": []}]}
            ]
        }
    }
}
# Each pod value, and what it does to the pod template of the default rendering.
POD_VALUES: list[tuple[str, Any, Callable[[dict[str, Any]], None]]] = [
    ("env", PROXY_ENV, lambda pod: _manager(pod).update(env=PROXY_ENV)),
    (
        "imagePullSecrets",
        [{"name": "registry-example-com"}],
        lambda pod: pod["spec"].update(imagePullSecrets=[{"name": "registry-example-com"}]),
    ),
    (
        "priorityClassName",
        "system-cluster-critical",
        lambda pod: pod["spec"].update(priorityClassName="system-cluster-critical"),
    ),
    (
        "podLabels",
        {"team": "platform", "cost-center": "42"},
        lambda pod: pod["metadata"]["labels"].update({"team": "platform", "cost-center": "42"}),
    ),
    (
        "podAnnotations",
        {"example.com/scrape": "false"},
        lambda pod: pod["metadata"]["annotations"].update({"example.com/scrape": "false"}),
    ),
    (
        "nodeSelector",
        {"node-role.kubernetes.io/infra": ""},
        lambda pod: pod["spec"].update(nodeSelector={"node-role.kubernetes.io/infra": ""}),
    ),
    ("tolerations", TOLERATIONS, lambda pod: pod["spec"].update(tolerations=TOLERATIONS)),
    # Helm merges a mapping into its default: config's spread over nodes stays (unless
    # set to null, below).
    ("affinity", AFFINITY, lambda pod: pod["spec"]["affinity"].update(AFFINITY)),
]


@pytest.mark.parametrize(("value", "setting", "effect"), POD_VALUES, ids=[v[0] for v in POD_VALUES])
def test_a_pod_value_sets_what_it_names_and_nothing_else(
    value: str, setting: Any, effect: Callable[[dict[str, Any]], None]
) -> None:
    default = template()
    (pod,) = [o["spec"]["template"] for o in default if o["kind"] == "Deployment"]
    expected = _by_id(default)
    effect(pod)  # the default rendering, changed as the value says
    assert _by_id(template(json_values={value: setting})) == expected


def test_configs_affinity_can_be_replaced() -> None:
    objects = template(json_values={"affinity": {"podAntiAffinity": None, **AFFINITY}})
    (pod,) = [o["spec"]["template"] for o in objects if o["kind"] == "Deployment"]
    assert pod["spec"]["affinity"] == AFFINITY


def test_by_default_the_pod_has_no_env_pull_secrets_priority_or_placement() -> None:
    (pod,) = [o["spec"]["template"] for o in template() if o["kind"] == "Deployment"]
    assert "env" not in _manager(pod)
    for field in ("imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations"):
        assert field not in pod["spec"]
    assert pod["spec"]["affinity"]["podAntiAffinity"], "config's spread over nodes"


@pytest.mark.parametrize("namespace", ["agent-forge-system", "monitoring-elsewhere"])
def test_the_servicemonitor_selects_the_metrics_service_of_the_release_namespace(
    namespace: str,
) -> None:
    objects = template("monitoring.enabled=true", namespace=namespace)
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["namespace"] == namespace
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    # The same objects in another namespace too, as a second release would be: the
    # ServiceMonitor must select its own release's Service only.
    other = template("monitoring.enabled=true", namespace="someone-else")
    services = [o for o in [*objects, *other] if o["kind"] == "Service"]
    targets = servicemonitor_targets(monitor, services)
    assert [(s["metadata"]["namespace"], s["metadata"]["name"], e["port"]) for s, e in targets] == [
        (namespace, "agent-forge-controller-manager-metrics-service", "https")
    ]


@pytest.mark.parametrize(("value", "overlay"), sorted(chart.METRICS_CERTIFICATES.items()))
def test_a_metrics_certificate_renders_what_its_overlay_applies(value: str, overlay: str) -> None:
    # The chart with monitoring and a certificate is config/<overlay> (Namespace and
    # CRDs aside): the certificate mounted for --metrics-cert-path, the ServiceMonitor
    # verifying it, and the overlay's own objects (Certificates, Issuers, Roles).
    rendered = template("monitoring.enabled=true", f"metricsCertificate={value}")
    expected = [
        o
        for o in kustomize.build(REPO / "config" / overlay)
        if o["kind"] not in {"Namespace", "CustomResourceDefinition"}
    ]
    by_id = _by_id(expected)
    deployment = next(o for o in by_id.values() if o["kind"] == "Deployment")
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        container["image"] = (
            "agent-forge:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        )
    assert _by_id([_without_helm_labels(o) for o in rendered]) == by_id
    (monitor,) = [o for o in rendered if o["kind"] == "ServiceMonitor"]
    assert "insecureSkipVerify" not in monitor["spec"]["endpoints"][0]["tlsConfig"]


def test_a_metrics_certificate_names_the_release_namespace() -> None:
    rendered = template(
        "monitoring.enabled=true", "metricsCertificate=cert-manager", namespace="platform-ops"
    )
    server = "agent-forge-controller-manager-metrics-service.platform-ops.svc"
    (monitor,) = [o for o in rendered if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == server
    serving = next(o for o in rendered if o["kind"] == "Certificate" and not o["spec"].get("isCA"))
    assert server in serving["spec"]["dnsNames"]
    assert {o["metadata"]["namespace"] for o in rendered if "namespace" in o["metadata"]} == {
        "platform-ops"
    }


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("replicaCont=3", "replicaCont"),
        ("replicaCount=three", "replicaCount"),
        ("image.tagg=v1", "tagg"),
        ("networkPolicy.enabled=maybe", "enabled"),
        ("extraEnv[0].name=HTTPS_PROXY", "extraEnv"),
        ("env[0].value=http://proxy:3128", "name"),
        ("imagePullSecrets[0].secret=x", "secret"),
        # A key of config's own labels or annotations (Helm names the key, not the value).
        ("podLabels.app\\.kubernetes\\.io/name=other", "'app.kubernetes.io/name'"),
        ("podAnnotations.kubectl\\.kubernetes\\.io/default-container=x", "default-container'"),
        ("podLabels.tier=1", "podLabels"),
        ("priorityClassName[0]=high", "priorityClassName"),
        ("metricsCertificate=self-made", "metricsCertificate"),
    ],
)
def test_a_misspelt_or_mistyped_value_is_refused(value: str, complaint: str) -> None:
    result = helm("template", "agent-forge", str(CHART), f"--set={value}")
    assert result.returncode != 0
    assert complaint in result.stderr


def _credentials_bindings(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["namespace"]: o
        for o in objects
        if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "agent-forge-credentials-reader"
    }


def _manager_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(manager["args"])


def test_secrets_are_granted_per_credentials_namespace_never_cluster_wide() -> None:
    """credentialNamespaces, else namespaces: a RoleBinding to the credentials reader in
    each; none at all by default (the operator then refuses to start)."""
    default = template()
    assert _credentials_bindings(default) == {}
    assert not [a for a in _manager_args(default) if a.startswith("--credential-namespace")]
    for obj in default:
        if obj["kind"] == "ClusterRoleBinding":
            assert obj["roleRef"]["name"] != "agent-forge-credentials-reader"

    watched = template("namespaces={tenant-a,clusters-tenant-a}", namespace="platform")
    bindings = _credentials_bindings(watched)
    assert set(bindings) == {"tenant-a", "clusters-tenant-a"}
    for binding in bindings.values():
        assert binding["roleRef"]["name"] == "agent-forge-credentials-reader"
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "agent-forge-controller-manager",
                "namespace": "platform",
            }
        ]
        assert binding["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

    apart = template("namespaces={x,clusters-x}", "credentialNamespaces={vsphere-credentials}")
    assert set(_credentials_bindings(apart)) == {"vsphere-credentials"}
    assert "--credential-namespace=vsphere-credentials" in _manager_args(apart)
    assert "--namespace=x" in _manager_args(apart)
