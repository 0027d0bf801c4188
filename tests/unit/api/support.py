"""Helpers shared by the API model tests: YAML fixtures and schema validators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from agentforge.api import crdgen

FIXTURES = Path(__file__).parent / "fixtures"
EXTERNAL_CRDS = Path(__file__).parents[3] / "sim" / "crds" / "external"

MINIMAL_SPEC: dict[str, Any] = {
    "hostedClusterRef": {"name": "demo"},
    "nodePoolRef": {"name": "demo-worker"},
    "infraEnvRef": {"name": "demo"},
    "controlPlaneNamespace": "demo-demo",
    "vsphere": {
        "credentialsSecretRef": {"name": "vsphere-credentials"},
        "datastoreCluster": "dsc1",
        "isoDatastore": "iso-ds",
        "resourcePool": "cluster/Resources",
        "network": "VM Network",
    },
    "template": {},
    "agent": {"labels": {"customer": "acme"}},
}


def read_fixture(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((FIXTURES / name).read_text()))


def crd_validator(resource: crdgen.Resource) -> jsonschema.Draft4Validator:
    """Validates an object against our generated CRD schema, as the API server would
    (jsonschema ignores the x-kubernetes-* keywords and the int32/int64 formats)."""
    schema = crdgen.render(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(schema)


def upstream_validator(filename: str, version: str) -> jsonschema.Draft4Validator:
    """Validates an object against an upstream CRD in `sim/crds/external/`."""
    crd = yaml.safe_load((EXTERNAL_CRDS / filename).read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft4Validator(served["schema"]["openAPIV3Schema"])


def pool_object(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgentPool",
        "metadata": {"name": "demo-worker", "namespace": "demo"},
        "spec": spec,
    }
