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
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import chart, kustomize
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


def template(*sets: str, namespace: str = "agent-forge-system") -> list[dict[str, Any]]:
    flags = [f"--set={s}" for s in sets]
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


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("replicaCont=3", "replicaCont"),
        ("replicaCount=three", "replicaCount"),
        ("image.tagg=v1", "tagg"),
        ("networkPolicy.enabled=maybe", "enabled"),
    ],
)
def test_a_misspelt_or_mistyped_value_is_refused(value: str, complaint: str) -> None:
    result = helm("template", "agent-forge", str(CHART), f"--set={value}")
    assert result.returncode != 0
    assert complaint in result.stderr
