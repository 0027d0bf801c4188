"""Which documents `install_crds` takes from files and folders (pure, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import paths
from sim.controlplane import crds

_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - {name: v1alpha1, served: false, storage: false}
  - {name: v1, served: true, storage: true}
"""


def test_the_external_crds_are_the_four_kinds_the_operator_reads() -> None:
    loaded = {crd.name: crd for crd in crds.load([paths.EXTERNAL_CRDS_DIR])}
    assert set(loaded) == {
        "agents.agent-install.openshift.io",
        "infraenvs.agent-install.openshift.io",
        "agentmachines.capi-provider.agent-install.openshift.io",
        "machines.cluster.x-k8s.io",
    }
    assert (
        "v1beta1"
        in loaded["agentmachines.capi-provider.agent-install.openshift.io"].served_versions
    )


def test_a_folder_yields_its_crds_and_skips_other_documents(tmp_path: Path) -> None:
    (tmp_path / "widgets.yaml").write_text(_CRD + "---\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [widgets.yaml]\n")
    (tmp_path / "notes.txt").write_text("not yaml")
    [crd] = crds.load([tmp_path])
    assert (crd.name, crd.group, crd.plural) == ("widgets.example.com", "example.com", "widgets")
    assert crd.served_versions == ("v1",)


def test_a_file_named_explicitly_must_hold_only_crds(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(_CRD + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ValueError, match="ConfigMap"):
        crds.load([mixed])


def test_a_missing_path_is_an_error_not_an_empty_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        crds.load([tmp_path / "absent"])
