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

from scripts import kustomize, validate_manifests
from sim.paths import binary

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
    assert len(problems) == 2, problems  # network-policy itself, and default which includes it
    assert {p.split(":")[0] for p in problems} == {"config/network-policy", "config/default"}
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
