"""Installing CustomResourceDefinitions and waiting until they can be used.

A CRD is applied with server-side apply (create or update in one call, idempotent),
then waited on twice: until its `Established` condition is True, and until every
served version answers a list request, because discovery and the REST handler lag
the condition slightly and a test's first request must not race them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.controlplane.processes import wait_for
from sim.controlplane.rest import RestClient

_CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "agentforge-sim-controlplane"


@dataclass(frozen=True, slots=True)
class Crd:
    name: str
    group: str
    plural: str
    served_versions: tuple[str, ...]
    manifest: dict[str, Any]
    source: Path


def expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """Each file with whether it was named explicitly; folders give their `*.yaml`/`*.yml`."""
    files: list[tuple[Path, bool]] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            files.extend((p, False) for p in found)
        elif path.exists():
            files.append((path, True))
        else:
            raise FileNotFoundError(f"CRD path {path} does not exist")
    return files


def load(paths: Iterable[Path]) -> list[Crd]:
    """Every CustomResourceDefinition document in the given files (multi-document YAML ok).

    In a folder, other documents (a kustomization.yaml, say) are skipped; a file named
    explicitly must hold only CRDs.
    """
    crds: list[Crd] = []
    for file, explicit in expand(paths):
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc:
                continue
            if doc.get("kind") != "CustomResourceDefinition":
                if not explicit:
                    continue
                raise ValueError(
                    f"{file}: expected only CustomResourceDefinition documents, "
                    f"got {doc.get('kind')!r}"
                )
            spec = doc["spec"]
            crds.append(
                Crd(
                    name=doc["metadata"]["name"],
                    group=spec["group"],
                    plural=spec["names"]["plural"],
                    served_versions=tuple(v["name"] for v in spec["versions"] if v.get("served")),
                    manifest=doc,
                    source=file,
                )
            )
    return crds


def install(client: RestClient, crds: list[Crd], *, timeout: float = 60.0) -> None:
    """Apply every CRD, then wait until each is Established and each served version lists."""
    for crd in crds:
        manifest = {key: value for key, value in crd.manifest.items() if key != "status"}
        client.request(
            "PATCH",
            f"{_CRD_API}/{crd.name}?fieldManager={FIELD_MANAGER}&force=true",
            body=manifest,
            content_type="application/apply-patch+yaml",
        )
    for crd in crds:
        wait_for(
            functools.partial(_established, client, crd.name),
            what=f"CRD {crd.name} (from {crd.source.name}) to be Established",
            timeout=timeout,
        )
        for version in crd.served_versions:
            path = f"/apis/{crd.group}/{version}/{crd.plural}?limit=1"
            wait_for(
                functools.partial(_serves, client, path),
                what=f"{crd.plural}.{crd.group}/{version} to be served",
                timeout=timeout,
            )


def _established(client: RestClient, name: str) -> bool:
    crd = client.get(f"{_CRD_API}/{name}").body
    for condition in crd.get("status", {}).get("conditions", []):
        if condition.get("type") == "Established":
            return bool(condition.get("status") == "True")
    return False


def _serves(client: RestClient, path: str) -> bool:
    return client.status_of(path) == 200
