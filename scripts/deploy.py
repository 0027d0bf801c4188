"""`make install/uninstall/deploy/undeploy/deploy-monitoring`, without kubectl or kustomize.

The Go operator's habits, kept: `make install` puts the CRDs into the cluster of the
active kubeconfig, `make deploy IMG=...` the whole operator (`config/default`) with
that image, `make undeploy` and `make uninstall` take them away again. Here they are
one Python helper over the operator's own Kubernetes client (`agentforge.kube`), so
the only prerequisite is `make venv` and a kubeconfig (`$KUBECONFIG`, else
`~/.kube/config`; `--context` picks a context):

* manifests are rendered by `scripts.kustomize_lite` (the same objects
  `kubectl apply -k` would create: a unit test compares the two), the image set in
  memory, so the checkout stays clean;
* objects are applied with server-side apply (field manager `agent-forge-deploy`,
  conflicts forced, as `kubectl apply --server-side --force-conflicts` does),
  Namespaces and CRDs first; the CRDs must be Established before anything else;
* `undeploy` deletes what `deploy` applied except the CRDs, so no VsphereAgentPool
  is lost by redeploying; `uninstall` deletes the CRDs and refuses while pools or
  VsphereAgents exist (deleting a CRD deletes every object of it, and without the
  operator running their finalizers would hold the deletion forever), unless
  `--force` says that is intended.

`python -m scripts.deploy render DIR [--image IMG]` prints the rendered YAML, for
review or for `kubectl apply -f -`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentforge.api import kinds
from agentforge.kube import config as kube_config
from agentforge.kube import errors
from agentforge.kube.client import KubeClient
from scripts import kustomize_lite

__all__ = ["Applier", "apply_order", "main", "rendered"]

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
FIELD_MANAGER = "agent-forge-deploy"
ESTABLISH_TIMEOUT_S = 60.0

JsonObj = dict[str, Any]

# Applied first, deleted last; everything else keeps its order within the kustomization.
_FIRST = ("Namespace", "CustomResourceDefinition")


def rendered(directory: Path, *, image: str | None = None) -> list[JsonObj]:
    """The objects of a kustomization directory, with the operator image replaced."""
    images = [kustomize_lite.set_image(image)] if image else []
    return kustomize_lite.plain(kustomize_lite.render(directory, images=images))


def apply_order(objects: Iterable[JsonObj]) -> list[JsonObj]:
    """Namespaces, then CRDs, then the rest in their rendered order."""
    objects = list(objects)

    def rank(obj: JsonObj) -> int:
        kind = obj.get("kind", "")
        return _FIRST.index(kind) if kind in _FIRST else len(_FIRST)

    return sorted(objects, key=rank)  # stable: keeps the kustomization order within a rank


@dataclass(frozen=True, slots=True)
class _Resource:
    plural: str
    namespaced: bool


class Applier:
    """Applies and deletes rendered objects through the API server's discovery."""

    def __init__(self, client: KubeClient, *, out: Any = sys.stdout) -> None:
        self.client = client
        self.out = out
        self._discovery: dict[str, dict[str, _Resource]] = {}

    async def _resource(self, obj: Mapping[str, Any]) -> _Resource:
        api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
        if api_version not in self._discovery:
            path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            try:
                listing = await self.client.request(
                    "GET", path, verb="get", resource=path, repeatable=True
                )
            except errors.NotFound:
                raise SystemExit(
                    f"error: the cluster does not serve {api_version} (needed for {kind} "
                    f"{obj['metadata']['name']}); install the CRDs that provide it first"
                ) from None
            self._discovery[api_version] = {
                r["kind"]: _Resource(r["name"], bool(r["namespaced"]))
                for r in listing.get("resources", [])
                if "/" not in r["name"]
            }
        found = self._discovery[api_version].get(kind)
        if found is None:
            raise SystemExit(f"error: the cluster serves {api_version} but not kind {kind}")
        return found

    async def _path(self, obj: Mapping[str, Any]) -> str:
        resource = await self._resource(obj)
        api_version = str(obj["apiVersion"])
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        meta = obj["metadata"]
        if resource.namespaced:
            base += f"/namespaces/{meta['namespace']}"
        return f"{base}/{resource.plural}/{meta['name']}"

    def _say(self, verb: str, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        print(f"{verb} {obj['kind']} {where}{meta['name']}", file=self.out)

    async def apply(self, objects: Iterable[JsonObj]) -> None:
        """Server-side apply, Namespaces and CRDs first; wait for CRDs to be Established."""
        ordered = apply_order(objects)
        crds = [o for o in ordered if o["kind"] == "CustomResourceDefinition"]
        for obj in ordered:
            if obj["kind"] not in _FIRST and crds:
                await self._established(crds)
                crds = []
            path = await self._path(obj)
            await self.client.request(
                "PATCH",
                path,
                verb="patch",
                resource=path,
                params={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=obj,
                content_type="application/apply-patch+yaml",
            )
            self._say("applied", obj)
        if crds:
            await self._established(crds)

    async def _established(self, crds: Sequence[JsonObj]) -> None:
        deadline = time.monotonic() + ESTABLISH_TIMEOUT_S
        for crd in crds:
            path = await self._path(crd)
            while True:
                current = await self.client.request("GET", path, verb="get", resource=path)
                conditions = (current.get("status") or {}).get("conditions") or []
                if any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"error: CRD {crd['metadata']['name']} not Established after "
                        f"{ESTABLISH_TIMEOUT_S:.0f} s: {conditions}"
                    )
                await asyncio.sleep(0.2)
            # Discovery of the new group is cached lazily; drop what we know of it.
            group = crd["spec"]["group"]
            for version in crd["spec"]["versions"]:
                self._discovery.pop(f"{group}/{version['name']}", None)

    async def delete(self, objects: Iterable[JsonObj]) -> None:
        """Delete in reverse apply order; objects already gone are fine."""
        for obj in reversed(apply_order(objects)):
            try:
                path = await self._path(obj)
            except SystemExit:
                self._say("skipped (kind not served)", obj)
                continue
            try:
                await self.client.request(
                    "DELETE",
                    path,
                    verb="delete",
                    resource=path,
                    body={"propagationPolicy": "Background"},
                )
            except errors.NotFound:
                self._say("already gone", obj)
                continue
            self._say("deleted", obj)

    async def count(self, kind: kinds.Kind) -> int:
        """Objects of `kind` in all namespaces (0 when the kind is not served)."""
        try:
            listed = await self.client.list(kind)
        except errors.NotFound:
            return 0
        return len(listed.items)


# --- commands --------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> int:
    cfg = await kube_config.load_config(kubeconfig=args.kubeconfig, context=args.context)
    print(f"cluster {cfg.server} (from {cfg.source})")
    async with KubeClient(config=cfg, user_agent="agent-forge-deploy") as client:
        applier = Applier(client)
        if args.command == "install":
            await applier.apply(rendered(CONFIG / "crd"))
        elif args.command == "uninstall":
            remaining = {
                kind.kind: await applier.count(kind)
                for kind in (kinds.VSPHERE_AGENT_POOL, kinds.VSPHERE_AGENT)
            }
            if any(remaining.values()) and not args.force:
                found = ", ".join(f"{n} {k}(s)" for k, n in remaining.items() if n)
                print(
                    f"error: {found} still exist. Deleting the CRDs deletes them too, and "
                    "without the operator their finalizers hold the deletion forever.\n"
                    "Delete your VsphereAgentPools while the operator runs (it removes "
                    "their VMs per cleanupPolicy), or run `make uninstall FORCE=1` to "
                    "delete the CRDs anyway.",
                    file=sys.stderr,
                )
                return 1
            await applier.delete(rendered(CONFIG / "crd"))
        elif args.command == "deploy":
            await applier.apply(rendered(CONFIG / "default", image=args.image))
        elif args.command == "undeploy":
            objects = rendered(CONFIG / "default")
            await applier.delete(o for o in objects if o["kind"] != "CustomResourceDefinition")
            print("CRDs kept (your pools with them); `make uninstall` removes them.")
        elif args.command == "deploy-monitoring":
            await applier.apply(rendered(CONFIG / "prometheus"))
        elif args.command == "undeploy-monitoring":
            await applier.delete(rendered(CONFIG / "prometheus"))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scripts.deploy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("install", "apply the CRDs (config/crd)"),
        ("uninstall", "delete the CRDs (refused while pools or VsphereAgents exist)"),
        ("deploy", "apply config/default (CRDs, RBAC, Deployment, Service, NetworkPolicy)"),
        ("undeploy", "delete what deploy applied, except the CRDs"),
        ("deploy-monitoring", "apply config/prometheus (needs the Prometheus Operator CRDs)"),
        ("undeploy-monitoring", "delete what deploy-monitoring applied"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--kubeconfig", type=Path, default=None)
        command.add_argument("--context", default=None)
        if name == "deploy":
            command.add_argument("--image", required=True, help="the operator image to run")
        if name == "uninstall":
            command.add_argument("--force", action="store_true")
    render = sub.add_parser("render", help="print the rendered manifests of a kustomization")
    render.add_argument("directory", type=Path)
    render.add_argument("--image", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "render":
        try:
            objects = rendered(args.directory, image=args.image)
        except kustomize_lite.KustomizeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
        return 0
    try:
        return asyncio.run(_run(args))
    except kube_config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except errors.KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
