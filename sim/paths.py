"""Where the Go-built test infrastructure lives, and a clear error when it is missing."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("AGENTFORGE_SHARED_DIR", REPO_ROOT.parent / "shared"))
EXTERNAL_CRDS_DIR = Path(
    os.environ.get("AGENTFORGE_EXTERNAL_CRDS", REPO_ROOT / "sim" / "crds" / "external")
)
OUR_CRDS_DIR = REPO_ROOT / "config" / "crd"
# The Prometheus Operator's ServiceMonitor and PrometheusRule (the chart's monitoring).
MONITORING_CRDS_DIR = REPO_ROOT / "sim" / "crds" / "monitoring"

_MAKE_TARGET = {
    "kube-apiserver": "controlplane",
    "etcd": "controlplane",
    "kubectl": "controlplane",
    "vcsim-af": "vcsim",
    "govc": "vcsim",
    "kustomize": "packaging-tools",
    "helm": "packaging-tools",
    "olm-validate": "packaging-tools",
}


class MissingBinaryError(RuntimeError):
    """A Go-built tool is not there; the message says which make target builds it."""


def bin_dir() -> Path:
    return Path(os.environ.get("AGENTFORGE_BIN_DIR", REPO_ROOT / ".build" / "bin"))


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        target = _MAKE_TARGET.get(name, "tools")
        raise MissingBinaryError(
            f"{path} is missing: run `make {target}` (needs Go 1.26+, builds it from Go modules "
            "through the module proxy; the first build takes minutes)"
        )
    return path
