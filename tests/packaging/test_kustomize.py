"""config/ as kustomize renders it: valid offline, rendered alike by the pinned kustomize and
the control plane's kubectl, and as `make deploy`'s image overlay shapes it.

Packaging checks: they run the Go-built kustomize (`make packaging-tools`) and kubectl
(`make controlplane`); `make test-packaging` builds both first. Without them a test fails
saying which make target builds the missing tool. Lint, the bundle and the chart read
kustomize's rendering and `make deploy` applies kubectl's, so the two must agree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import names, rbac
from scripts import kustomize, validate_manifests
from sim.paths import binary
from tests.unit.test_manifests_valid import _load, _one

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"


# --- the whole tree validates ------------------------------------------------------------


def test_every_manifest_under_config_validates_offline() -> None:
    checked, problems = validate_manifests.validate_config(CONFIG)
    assert problems == []
    shipped = len(list(CONFIG.rglob("*.yaml"))) - len(list(CONFIG.rglob("kustomization.yaml")))
    assert checked >= shipped, "every YAML file under config/ is checked"


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


# --- what the overlays add ---------------------------------------------------------------


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
