"""`python -m agentforge check`: would this VsphereAgentPool work? (the Go operator's test mode)

Input: `-f FILE` (one or more VsphereAgentPool documents, `-` for stdin) or `--pool
NAMESPACE/NAME` (a pool in the cluster). For each pool, against the cluster of the
kubeconfig and the vCenter of the pool's credentials Secret:

* the spec validates against `agentforge.api.pool.VsphereAgentPool` (field by field,
  unknown fields included) and the vSphere layer can express it;
* its InfraEnv exists and has `status.isoDownloadURL` (and ImageCreated=True), and
  that URL answers a HEAD (or a one-byte ranged GET) as the operator downloads it:
  TLS verified against the system store and `--iso-ca-bundle`, the proxy variables
  of this environment honoured, redirects only to https; nothing is downloaded;
* the credentials Secret parses (`reconcilers.infra.credentials.parse_credentials`, the
  operator's own rules) and, when it lies in another namespace, lists the pool's in
  its allowed-namespaces annotation (`check.probes.secret`), and `VsphereService.preflight`
  logs in (only then is vCenter's certificate reported verified) and finds the
  pool's placement (`reconcilers.common.pool_specs.placement`, the infra
  controller's translation);
* the control plane namespace exists, AgentMachines there carry the pool's nodePool
  annotation, and no other pool serves the same NodePool;
* RBAC (`check.rbac`): every rule the code declares, reviewed for the operator's
  ServiceAccount (or `--as-serviceaccount`, or the caller) in the pool's namespaces.

Exit codes: 0 every item passed (warnings allowed), 1 an item failed, 2 usage error.
Reads only; writes nothing but access reviews. Secret values never reach an item.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console

from agentforge import vsphere
from agentforge.api import crdgen, kinds
from agentforge.api.pool import VsphereAgentPool, VsphereAgentPoolSpec
from agentforge.check import probes as check_probes
from agentforge.check import rbac as check_rbac
from agentforge.check.render import (
    EXIT_FAIL,
    EXIT_USAGE,
    Item,
    PoolReport,
    Report,
    UsageError,
    render_json,
    render_text,
    render_usage_json,
    render_usage_text,
)
from agentforge.kube import config as kube_config
from agentforge.kube import errors as kube_errors
from agentforge.kube.client import KubeClient, RetryPolicy

__all__ = ["Target", "check_pool", "load_manifests", "main", "parser", "run"]

POOL_API_VERSION = kinds.VSPHERE_AGENT_POOL.api_version
POOL_KIND = kinds.VSPHERE_AGENT_POOL.kind


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentforge check",
        description="Would this pool work? Check VsphereAgentPools (from a manifest or the "
        "cluster): spec, InfraEnv and its ISO URL, credentials Secret, vSphere placement, "
        "AgentMachine demand and RBAC. Exit 0 all passed (warnings allowed), 1 something "
        "failed, 2 usage error.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "-f", "--filename", metavar="FILE", help="VsphereAgentPool manifest(s); - reads stdin"
    )
    what.add_argument("--pool", metavar="NAMESPACE/NAME", help="a pool in the cluster")
    parser.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, in-cluster, ~/.kube")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace of manifest pools without metadata.namespace (default: default)",
    )
    parser.add_argument(
        "--as-serviceaccount",
        metavar="NAMESPACE/NAME",
        help="review RBAC for this ServiceAccount (default: the operator's, "
        f"{check_rbac.DEFAULT_SERVICE_ACCOUNT}, when you may create SubjectAccessReviews; "
        "else your own permissions)",
    )
    parser.add_argument(
        "--iso-ca-bundle",
        type=Path,
        metavar="FILE",
        help="PEM CA certificates trusted for the ISO URL besides the system store, as the "
        "operator's --iso-ca-bundle (e.g. key ca-bundle.crt of ConfigMap agent-forge-trusted-ca)",
    )
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return parser


@dataclass(frozen=True, slots=True)
class Target:
    """One pool to check: from a manifest document, or named in the cluster."""

    source: str
    pool: VsphereAgentPool | None = None
    key: tuple[str, str] | None = None  # --pool: (namespace, name), read in `run`


# --- manifests --------------------------------------------------------------------------


def load_manifests(
    text: str, *, source: str, default_namespace: str
) -> tuple[list[Target], list[UsageError]]:
    """Every VsphereAgentPool in `text` (a `List`'s items too), or why not."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        return [], [UsageError(source, _yaml_error(exc))]
    targets: list[Target] = []
    problems: list[UsageError] = []
    for index, doc in enumerate(_expand(documents), start=1):
        where = f"{source} document {index}"
        pool, errors = _parse_pool(doc, where=where, default_namespace=default_namespace)
        problems += errors
        if pool is not None:
            targets.append(Target(source=where, pool=pool))
    if not targets and not problems:
        problems.append(UsageError(source, f"no {POOL_KIND} in it"))
    return targets, problems


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML: line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    return f"not valid YAML: {exc}"


def _expand(documents: list[Any]) -> Iterator[Any]:
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
            yield from doc.get("items") or []
        else:
            yield doc


def _parse_pool(
    doc: Any, *, where: str, default_namespace: str
) -> tuple[VsphereAgentPool | None, list[UsageError]]:
    if not isinstance(doc, dict):
        return None, [UsageError(where, f"is a {type(doc).__name__}, not a {POOL_KIND} object")]
    if (doc.get("apiVersion"), doc.get("kind")) != (POOL_API_VERSION, POOL_KIND):
        found = f"{doc.get('apiVersion') or '?'} {doc.get('kind') or '?'}"
        return None, [UsageError(where, f"is a {found}, not a {POOL_API_VERSION} {POOL_KIND}")]
    raw_meta = doc.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    errors = [UsageError(where, "required", "metadata.name")] if not meta.get("name") else []
    spec = doc.get("spec")
    if isinstance(spec, dict):
        schema = _spec_schema()
        errors += [
            UsageError(where, "unknown field (kubectl rejects it; the API server drops it)", path)
            for path in unknown_fields(spec, schema, path="spec")
        ]
    try:
        pool = VsphereAgentPool.model_validate(
            {**doc, "metadata": {**meta, "namespace": meta.get("namespace") or default_namespace}},
            by_alias=True,
            by_name=False,
        )
    except ValidationError as exc:
        errors += [
            UsageError(where, e["msg"], ".".join(str(p) for p in e["loc"]) or "(document)")
            for e in exc.errors(include_url=False)
        ]
        return None, errors
    return (None if errors else pool), errors


@functools.cache
def _spec_schema() -> dict[str, Any]:
    return crdgen.structural_schema(VsphereAgentPoolSpec)


def unknown_fields(value: Any, schema: dict[str, Any], *, path: str) -> list[str]:
    """Dotted paths of fields in `value` that the structural `schema` does not declare."""
    found: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        props: dict[str, Any] = schema["properties"]
        for key, child in value.items():
            if key not in props:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(child, props[key], path=f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, child in enumerate(value):
            found += unknown_fields(child, schema["items"], path=f"{path}[{i}]")
    return found


# --- running ----------------------------------------------------------------------------


async def check_pool(
    pool: VsphereAgentPool,
    *,
    client: KubeClient,
    sessions: vsphere.SessionRegistry,
    reviewer: check_rbac.Reviewer,
    iso: vsphere.IsoAccess | None = None,
) -> list[Item]:
    """Every item for one valid pool, in reading order."""

    async def kube_then_iso() -> list[Item]:
        item, url = await check_probes.infraenv(client, pool)
        return [item, await check_probes.iso_url(url, access=iso)] if url else [item]

    async def secret_then_vsphere() -> list[Item]:
        items, credentials = await check_probes.secret(client, pool)
        return [*items, *await check_probes.vsphere_preflight(sessions, pool, credentials)]

    parts = await asyncio.gather(
        kube_then_iso(),
        secret_then_vsphere(),
        check_probes.demand(client, pool),
        reviewer.review(pool),
    )
    return [check_probes.spec_item(pool), *(item for part in parts for item in part)]


async def run(
    targets: list[Target],
    *,
    config: kube_config.ClusterConfig,
    as_serviceaccount: str | None,
    iso: vsphere.IsoAccess | None = None,
) -> Report:
    report = Report()
    retry = RetryPolicy(attempts=3, max_backoff=2.0)
    async with KubeClient(
        config=config, retry=retry, request_timeout=15.0, user_agent="agent-forge-check"
    ) as client:
        sessions = vsphere.SessionRegistry(options=check_probes.SESSION_OPTIONS)
        try:
            reviewer = await check_rbac.Reviewer.create(client, as_serviceaccount)
            for target in targets:
                pool = target.pool
                if pool is None and target.key is not None:
                    pool, failed = await check_probes.read_pool(client, *target.key)
                    if pool is None:
                        items = [failed] if failed else []
                        report.pools.append(PoolReport("/".join(target.key), target.source, items))
                        continue
                assert pool is not None
                items = await check_pool(
                    pool, client=client, sessions=sessions, reviewer=reviewer, iso=iso
                )
                key = f"{pool.metadata.namespace}/{pool.metadata.name}"
                report.pools.append(PoolReport(key, target.source, items))
        finally:
            await sessions.close()
    return report


def _split_ref(value: str, *, flag: str) -> tuple[str, str] | UsageError:
    namespace, sep, name = value.partition("/")
    if not (sep and namespace and name) or "/" in name:
        return UsageError(flag, f"{value!r} is not NAMESPACE/NAME")
    return namespace, name


def _targets(args: argparse.Namespace) -> tuple[list[Target], list[UsageError]]:
    problems: list[UsageError] = []
    if args.as_serviceaccount:
        ref = _split_ref(args.as_serviceaccount, flag="--as-serviceaccount")
        if isinstance(ref, UsageError):
            problems.append(ref)
    if args.pool:
        key = _split_ref(args.pool, flag="--pool")
        if isinstance(key, UsageError):
            return [], [*problems, key]
        return [Target(source="cluster", key=key)], problems
    source = "stdin" if args.filename == "-" else str(args.filename)
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return [], [*problems, UsageError(source, f"cannot be read: {exc}")]
    targets, errors = load_manifests(text, source=source, default_namespace=args.namespace)
    return targets, [*problems, *errors]


def main(argv: Sequence[str]) -> int:
    """`agentforge check ARGS`: print the report; return the exit code (argparse exits 2)."""
    args = parser().parse_args(argv)
    console = Console(highlight=False)
    as_json = args.output == "json"

    def usage(errors: list[UsageError]) -> int:
        if as_json:
            print(render_usage_json(errors))
        else:
            render_usage_text(errors, Console(stderr=True, highlight=False))
        return EXIT_USAGE

    targets, problems = _targets(args)
    bundle = args.iso_ca_bundle
    if bundle is not None and not bundle.is_file():
        problems.append(UsageError("--iso-ca-bundle", f"{bundle} is not a readable file"))
    try:
        iso = vsphere.IsoAccess(
            proxies=vsphere.Proxies.from_environ(os.environ),
            ca_bundle=vsphere.CaBundleFile(bundle) if bundle is not None else None,
        )
    except ValueError as exc:
        problems.append(UsageError("environment", str(exc)))
    if problems:
        return usage(problems)
    try:
        config = asyncio.run(
            kube_config.load_config(kubeconfig=args.kubeconfig, context=args.context)
        )
    except kube_config.ConfigError as exc:
        return usage([UsageError("kubeconfig", str(exc))])
    try:
        report = asyncio.run(
            run(targets, config=config, as_serviceaccount=args.as_serviceaccount, iso=iso)
        )
    except kube_errors.KubeError as exc:  # the probes report their own; this is the rest
        Console(stderr=True, highlight=False).print(f"✗ the cluster cannot be asked: {exc}")
        return EXIT_FAIL
    if as_json:
        print(render_json(report))
    else:
        render_text(report, console)
    return report.exit_code
