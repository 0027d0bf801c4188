"""The OLM bundle: generated from config/, what it declares, and operator-framework's verdict.

`bundle/` must be exactly what `make bundle` writes from config/ today; the CSV must
carry config's RBAC and Deployment unchanged (plus the namespace list OLM hands over),
the install modes the operator supports and the infrastructure features it honours; and
operator-framework's own validation (`.build/bin/olm-validate`, built from
github.com/operator-framework/api and operator-registry) must pass it with no warning
and refuse a broken copy, so the check is known to bite.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge import __version__
from scripts import bundle, bundle_csv, kustomize
from sim.paths import binary

REPO = Path(__file__).resolve().parents[2]
CSV_PATH = REPO / "bundle" / "manifests" / "agent-forge.clusterserviceversion.yaml"


def _csv() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CSV_PATH.read_text())
    return loaded


def _config(kind: str, name: str) -> dict[str, Any]:
    objects = kustomize.build(REPO / "config" / "default")
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _validate(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("olm-validate")), "-strict", "-k8s-version", "1.27", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_committed_bundle_is_what_make_bundle_generates() -> None:
    files = bundle.render()
    for path, text in files.items():
        assert path.read_text() == text, f"{path} drifted: run `make bundle`"
    on_disk = {p for p in (REPO / "bundle").rglob("*") if p.is_file()}
    assert on_disk == set(files)


def test_operator_frameworks_validation_passes_the_bundle_without_warnings() -> None:
    result = _validate(REPO / "bundle")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 error(s), 0 warning(s)" in result.stdout


def test_operator_frameworks_validation_refuses_a_broken_bundle(tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(REPO / "bundle", broken)
    csv_file = broken / "manifests" / CSV_PATH.name
    csv = yaml.safe_load(csv_file.read_text())
    csv["spec"]["installModes"] = []  # a CSV must say how it may be installed
    csv["metadata"]["annotations"]["categories"] = "Not A Category"
    csv_file.write_text(yaml.safe_dump(csv))
    (broken / "metadata" / "annotations.yaml").write_text("annotations: {}\n")
    result = _validate(broken)
    assert result.returncode == 1
    assert "installModes" in result.stdout or "install modes" in result.stdout.lower()
    assert "Not A Category" in result.stdout
    assert "annotations" in result.stdout.lower()


def test_csv_runs_configs_deployment_with_the_olm_target_namespaces() -> None:
    csv = _csv()
    (deployment,) = csv["spec"]["install"]["spec"]["deployments"]
    config = _config("Deployment", deployment["name"])
    spec = deployment["spec"]
    (manager,) = spec["template"]["spec"]["containers"]
    assert manager.pop("env") == [
        {
            "name": "AGENT_FORGE_NAMESPACE",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['olm.targetNamespaces']"}
            },
        }
    ]
    assert spec == config["spec"], "everything else as config/ has it"


def test_csv_permissions_are_the_generated_rbac() -> None:
    strategy = _csv()["spec"]["install"]["spec"]
    (cluster,) = strategy["clusterPermissions"]
    (local,) = strategy["permissions"]
    assert cluster["serviceAccountName"] == local["serviceAccountName"]
    assert cluster["rules"] == _config("ClusterRole", "agent-forge-manager-role")["rules"]
    assert local["rules"] == _config("Role", "agent-forge-leader-election-role")["rules"]


def test_no_permission_list_grants_secrets_and_the_unbound_roles_ship_as_manifests() -> None:
    """OLM lifts `permissions` to a ClusterRole under AllNamespaces: a Secret rule in
    either list would let the operator read every Secret of the cluster."""
    strategy = _csv()["spec"]["install"]["spec"]
    rules = [
        r for p in strategy["clusterPermissions"] + strategy["permissions"] for r in p["rules"]
    ]
    assert not [r for r in rules if "secrets" in r["resources"]]
    shipped = {
        doc["metadata"]["name"]: doc
        for path in (bundle.BUNDLE / "manifests").glob("*_clusterrole.yaml")
        for doc in [yaml.safe_load(path.read_text())]
    }
    for name in (
        "agent-forge-credentials-reader",
        "agent-forge-pool-editor",
        "agent-forge-pool-viewer",
    ):
        assert shipped[name]["rules"] == _config("ClusterRole", name)["rules"]
    assert shipped["agent-forge-credentials-reader"]["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    ]


def test_install_modes_follow_the_namespace_flag() -> None:
    modes = {m["type"]: m["supported"] for m in _csv()["spec"]["installModes"]}
    # A pool and its AgentMachines live in two namespaces: one namespace never suffices.
    assert modes == {
        "AllNamespaces": True,
        "MultiNamespace": True,
        "OwnNamespace": False,
        "SingleNamespace": False,
    }


def _features(csv: dict[str, Any]) -> dict[str, str]:
    return {
        k.removeprefix("features.operators.openshift.io/"): v
        for k, v in csv["metadata"]["annotations"].items()
        if k.startswith("features.operators.openshift.io/")
    }


DIGEST_IMAGE = "quay.io/acme/agent-forge@sha256:" + "b" * 64


def test_infrastructure_features_claim_what_the_operator_does() -> None:
    # The committed bundle names the development image by tag: not for disconnected
    # clusters, whose mirrors are found by digest.
    csv = _csv()
    annotations = csv["metadata"]["annotations"]
    assert annotations["containerImage"] == "agent-forge:dev"
    assert _features(csv) == {**bundle_csv.INFRASTRUCTURE_FEATURES, "disconnected": "false"}
    assert _features(csv)["proxy-aware"] == "true"
    assert _features(csv)["fips-compliant"] == "false"
    assert json.loads(annotations["operators.openshift.io/infrastructure-features"]) == [
        "proxy-aware"
    ]
    images = csv["spec"]["relatedImages"]
    assert [i["image"] for i in images] == [annotations["containerImage"]]
    # Pinned by digest, the same bundle declares disconnected support.
    pinned = yaml.safe_load(bundle.render(DIGEST_IMAGE)[CSV_PATH])
    assert _features(pinned) == bundle_csv.INFRASTRUCTURE_FEATURES
    assert _features(pinned)["disconnected"] == "true"
    assert json.loads(
        pinned["metadata"]["annotations"]["operators.openshift.io/infrastructure-features"]
    ) == ["disconnected", "proxy-aware"]
    assert bundle_csv.disconnected_problems(pinned) == []


def test_a_csv_declaring_disconnected_beside_a_tag_is_refused() -> None:
    pinned = yaml.safe_load(bundle.render(DIGEST_IMAGE)[CSV_PATH])
    tagged = copy.deepcopy(pinned)
    (deployment,) = tagged["spec"]["install"]["spec"]["deployments"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    manager["image"] = "quay.io/acme/agent-forge:v1"
    assert bundle_csv.disconnected_problems(tagged) == [
        "quay.io/acme/agent-forge:v1: not pinned by digest, yet the CSV declares disconnected",
        "quay.io/acme/agent-forge:v1: run by the CSV but missing from relatedImages "
        "(a mirror would not copy it)",
    ]
    unlisted = copy.deepcopy(pinned)
    unlisted["spec"]["relatedImages"] = []
    assert [p.split(": ", 1)[1] for p in bundle_csv.disconnected_problems(unlisted)] == [
        "run by the CSV but missing from relatedImages (a mirror would not copy it)"
    ]
    # The older list alone is a claim too.
    listed = copy.deepcopy(tagged)
    del listed["metadata"]["annotations"]["features.operators.openshift.io/disconnected"]
    assert bundle_csv.disconnected_problems(listed)
    assert bundle_csv.disconnected_problems(_csv()) == []  # says false: nothing to refuse
    assert not bundle_csv.pinned("quay.io/acme/agent-forge:v1@sha256:" + "b" * 63)
    assert bundle_csv.pinned("quay.io/acme/agent-forge:v1@sha256:" + "b" * 64)


def test_the_generator_refuses_to_write_a_disconnected_csv_with_a_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bundle_csv, "pinned", lambda image: True)  # a generator bug
    with pytest.raises(SystemExit, match="not pinned by digest"):
        bundle.render("quay.io/acme/agent-forge:v1")


def test_csv_names_maintainers_links_and_the_providers_url() -> None:
    spec = _csv()["spec"]
    assert spec["maintainers"] == bundle_csv.MAINTAINERS
    assert all(m["name"] and "@" in m["email"] for m in spec["maintainers"])
    assert spec["links"] == bundle_csv.LINKS
    assert all(link["url"].startswith("https://") for link in spec["links"])
    assert spec["provider"]["url"].startswith("https://")


def test_owned_crds_have_descriptors_and_the_bundle_carries_the_crds() -> None:
    csv = _csv()
    owned = {o["kind"]: o for o in csv["spec"]["customresourcedefinitions"]["owned"]}
    assert set(owned) == {"VsphereAgentPool", "VsphereAgent"}
    pool = owned["VsphereAgentPool"]
    paths = {d["path"]: d for d in pool["specDescriptors"]}
    assert paths["vsphere.credentialsSecretRef.name"]["x-descriptors"] == [
        "urn:alm:descriptor:io.kubernetes:Secret"
    ]
    assert (
        "urn:alm:descriptor:com.tectonic.ui:booleanSwitch"
        in (paths["iso.ejectAfterInstall"]["x-descriptors"])
    )
    status = {d["path"]: d for d in pool["statusDescriptors"]}
    assert status["conditions"]["x-descriptors"] == ["urn:alm:descriptor:io.kubernetes.conditions"]
    for name in ("vsphereagentpools", "vsphereagents"):
        crd_file = REPO / "bundle" / "manifests" / f"agent-forge.containeroo.ch_{name}.yaml"
        crd = yaml.safe_load(crd_file.read_text())
        config_crd = _config("CustomResourceDefinition", f"{name}.agent-forge.containeroo.ch")
        assert crd == config_crd
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    assert {e["kind"] for e in examples} == {"VsphereAgentPool", "VsphereAgent"}


def test_bundle_metadata_names_package_channel_and_minimum_openshift() -> None:
    annotations = yaml.safe_load((REPO / "bundle" / "metadata" / "annotations.yaml").read_text())
    labels = annotations["annotations"]
    assert labels["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1"
    assert labels["operators.operatorframework.io.bundle.package.v1"] == "agent-forge"
    assert labels["com.redhat.openshift.versions"] == "v4.14"
    dockerfile = (REPO / "bundle" / "bundle.Dockerfile").read_text()
    for key, value in labels.items():
        assert f'LABEL {key}="{value}"' in dockerfile
    assert _csv()["spec"]["version"] == __version__
    assert _csv()["spec"]["minKubeVersion"] == "1.27.0"


def test_the_network_policies_ship_in_the_bundle_and_nothing_from_config_is_dropped_unseen() -> (
    None
):
    manifests = [yaml.safe_load(p.read_text()) for p in (REPO / "bundle" / "manifests").glob("*")]
    assert {m["kind"] for m in manifests} == {
        "ClusterServiceVersion",
        "CustomResourceDefinition",
        "ClusterRole",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",  # agent-forge-trusted-ca: OpenShift injects the trusted CAs into it
        "NetworkPolicy",  # a bundle kind since operator-registry v1.55.0
    }
    policies = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "NetworkPolicy"}
    assert set(policies) == {"agent-forge-allow-egress", "agent-forge-allow-metrics-traffic"}
    for name, policy in policies.items():
        config = copy.deepcopy(_config("NetworkPolicy", name))
        del config["metadata"]["namespace"]  # OLM installs into the operator's namespace
        assert policy == config


def test_a_kind_the_generator_does_not_place_fails_the_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = kustomize.build

    def with_extra(directory: Path) -> list[dict[str, Any]]:
        objects = real(directory)
        extra = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "x"}}
        return [*objects, extra] if directory.name == "default" else objects

    monkeypatch.setattr(kustomize, "build", with_extra)
    with pytest.raises(SystemExit, match="CronJob"):
        bundle.render()


def test_make_bundle_with_an_image_puts_it_everywhere(tmp_path: Path) -> None:
    image = DIGEST_IMAGE
    files = bundle.render(image)
    csv = yaml.safe_load(files[CSV_PATH])
    (deployment,) = csv["spec"]["install"]["spec"]["deployments"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == image
    assert csv["metadata"]["annotations"]["containerImage"] == image
    assert csv["spec"]["relatedImages"] == [{"name": "agent-forge", "image": image}]
