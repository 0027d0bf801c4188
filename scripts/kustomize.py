"""kustomize, the real one: render a `config/` directory as `kubectl apply -k` would.

`make lint`, `make bundle` and `make chart` need the objects of a kustomization. They get
them from kustomize itself, the binary `make packaging-tools` builds into `.build/bin`
from the version pinned in `hack/kustomize/go.mod` (the one kubectl of the test control
plane embeds, so `make deploy`'s `kubectl apply -k` renders the same objects). A fixed
version keeps the generated bundle and chart identical on every machine.

`build(directory)` returns the rendered objects; `listed_files(directory)` the files a
kustomization names itself (resources and generator inputs), so the validator can tell
a YAML file no kustomization ships.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KUSTOMIZATION", "KustomizeError", "binary", "build", "listed_files", "object_id"]

REPO = Path(__file__).resolve().parent.parent
KUSTOMIZATION = "kustomization.yaml"

JsonObj = dict[str, Any]


class KustomizeError(Exception):
    """kustomize refused a kustomization (its message names the file and the problem)."""


def binary() -> Path:
    """The pinned kustomize (`AGENTFORGE_BIN_DIR` overrides `.build/bin`)."""
    path = Path(os.environ.get("AGENTFORGE_BIN_DIR", REPO / ".build" / "bin")) / "kustomize"
    if not os.access(path, os.X_OK):
        raise KustomizeError(
            f"{path} is missing: run `make packaging-tools` (builds kustomize, Helm and the "
            "OLM bundle validator from Go modules; the first build takes minutes)"
        )
    return path


def build(directory: Path) -> list[JsonObj]:
    """The objects of the kustomization in `directory`, in kustomize's output order."""
    done = subprocess.run(
        [str(binary()), "build", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise KustomizeError(done.stderr.strip() or f"kustomize build {directory} failed")
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def object_id(obj: JsonObj) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize and the API server tell objects by."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = obj.get("metadata") or {}
    return group, str(obj.get("kind", "")), meta.get("namespace") or "", str(meta.get("name"))


def listed_files(directory: Path) -> set[Path]:
    """The files `directory/kustomization.yaml` names: resources, generator and patch files."""
    data = yaml.safe_load((directory / KUSTOMIZATION).read_text(encoding="utf-8")) or {}
    names: list[str] = [str(r) for r in data.get("resources") or []]
    for generator in (data.get("configMapGenerator") or []) + (data.get("secretGenerator") or []):
        names += [str(f).partition("=")[2] or str(f) for f in generator.get("files") or []]
    names += [str(p["path"]) for p in data.get("patches") or [] if "path" in p]
    return {(directory / name).resolve() for name in names if (directory / name).is_file()}
