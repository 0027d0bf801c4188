"""The probes of `python -m agentforge check`: one object each, read only, as `Item`s.

Every probe turns what it finds into items naming the object and the fix, and
never raises for a failed read: "could not read" is a failed item with the reason,
so one unreachable thing does not hide the verdicts on the others. The rules are
the operator's own: `views` for InfraEnvs and AgentMachines, `indexes` for which
AgentMachines and pools belong to a NodePool, `pool_specs.placement` +
`VsphereService.preflight` for vSphere (the credentials Secret: `secret` below).

The credentials Secret item (`secret`), by the operator's rules.

The Secret is read with the caller's own kubeconfig and judged by
`agentforge.secret_credentials`: `parse_credentials` for its keys and, for a Secret in
another namespace than the pool's, the namespace boundary (it must list the pool's
namespace in its `agent-forge.containeroo.ch/allowed-namespaces` annotation, no
wildcard). The caller sees what their own permissions let them see: a Secret they
may read is judged in detail (missing, not shared, which key is wrong); one they
may not read is reported as unverifiable, with the rule and who can fix it. Entries
of the annotation that cannot be namespace names (such as `*`) are flagged to
whoever can read them. Secret values never reach an item.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Final

import aiohttp
from pydantic import ValidationError

from agentforge import vsphere
from agentforge.api import kinds, names, views
from agentforge.api.pool import VsphereAgentPool
from agentforge.check.render import Item, Status
from agentforge.kube import errors
from agentforge.kube.client import JsonObj, KubeClient
from agentforge.reconcilers.common import indexes, pool_specs
from agentforge.redaction import redact, redact_url
from agentforge.secret_credentials import (
    ALLOWED_NAMESPACES,
    CA_BUNDLE_KEYS,
    KEY_INSECURE,
    KEY_PASSWORD,
    KEY_SERVER,
    KEY_USERNAME,
    CredentialsError,
    allowed_namespaces,
    parse_credentials,
    shared_with,
)
from agentforge.vsphere.iso import image_http as iso_http

__all__ = [
    "ISO_LIMITS",
    "SESSION_OPTIONS",
    "demand",
    "human_size",
    "infraenv",
    "iso_url",
    "read_pool",
    "redact_url",
    "secret",
    "spec_item",
    "unreadable",
    "vsphere_preflight",
]

SESSION_OPTIONS: Final = vsphere.SessionOptions(
    max_workers=4,
    keepalive_seconds=3600.0,
    http_timeout_seconds=30.0,
    retry_attempts=2,
    login_wait_seconds=math.inf,  # a one-shot check waits for its (bounded) login
)
ISO_LIMITS: Final = vsphere.IsoLimits(connect_timeout_seconds=10.0, read_timeout_seconds=20.0)


def _object_missing(exc: errors.NotFound, name: str) -> bool:
    """404 for the object itself, not for its resource type (a CRD not installed)."""
    return str(exc.details.get("name", "")) == name


def unreadable(check: str, subject: str, exc: errors.KubeError, what: str) -> Item:
    return Item(
        check,
        Status.FAIL,
        subject,
        f"could not be read: {exc}",
        f"check the API server and that your kubeconfig may get {what}",
    )


async def read_pool(
    client: KubeClient, namespace: str, name: str
) -> tuple[VsphereAgentPool | None, Item | None]:
    subject = f"{kinds.VSPHERE_AGENT_POOL.kind} {namespace}/{name}"
    try:
        raw = await client.get(kinds.VSPHERE_AGENT_POOL, namespace=namespace, name=name)
    except errors.NotFound as exc:
        message = "not found" if _object_missing(exc, name) else "the CRD is not installed"
        fix = "check the name (kubectl get vap -A)" if "found" in message else "apply config/crd"
        return None, Item("spec", Status.FAIL, subject, message, fix)
    except errors.KubeError as exc:
        return None, unreadable("spec", subject, exc, "vsphereagentpools")
    try:
        return VsphereAgentPool.model_validate(raw), None
    except ValidationError as exc:
        return None, Item(
            "spec", Status.FAIL, subject, f"spec does not validate: {exc}", "fix the fields named"
        )


def spec_item(pool: VsphereAgentPool) -> Item:
    """The spec (already schema-valid) in the vSphere layer's terms, and its defaults."""
    subject = f"{kinds.VSPHERE_AGENT_POOL.kind} {pool.metadata.namespace}/{pool.metadata.name}"
    try:
        pool_specs.hardware(pool)
    except pool_specs.UnsupportedSpec as exc:
        message, _, fix = str(exc).partition("; ")
        return Item("spec", Status.FAIL, subject, message, fix)
    return Item(
        "spec",
        Status.PASS,
        subject,
        f"spec valid; VMs {pool.effective_name_prefix()}-* in folder {pool.effective_folder()}, "
        f"ISOs in [{pool.spec.vsphere.iso_datastore}] {pool.effective_path_prefix()}",
    )


# --- InfraEnv and its ISO -------------------------------------------------------------------


async def infraenv(client: KubeClient, pool: VsphereAgentPool) -> tuple[Item, str | None]:
    """The InfraEnv item and, when it has one, the ISO URL to probe."""
    ns, name = pool.metadata.namespace, pool.spec.infra_env_ref.name
    subject = f"InfraEnv {ns}/{name}"

    def failed(message: str, fix: str) -> tuple[Item, None]:
        return Item("infraenv", Status.FAIL, subject, message, fix), None

    try:
        raw = await client.get(kinds.INFRA_ENV, namespace=ns, name=name)
    except errors.NotFound as exc:
        if not _object_missing(exc, name):
            return failed("the InfraEnv API is not installed", "install the Assisted Installer")
        return failed(
            "not found", f"create it, or set spec.infraEnvRef.name to an InfraEnv in {ns}"
        )
    except errors.KubeError as exc:
        return unreadable("infraenv", subject, exc, "infraenvs"), None
    view = views.InfraEnv.model_validate(raw)
    url = view.iso_download_url
    if not url:
        return failed(
            "has no status.isoDownloadURL",
            "wait for the Assisted Installer to create the discovery image "
            f"(kubectl -n {ns} get infraenv {name} -o yaml: condition ImageCreated)",
        )
    if not view.image_created:
        message = f"condition ImageCreated is not True (ISO URL {redact_url(url)})"
        fix = "wait for the image; the URL may not serve the current one yet"
        return Item("infraenv", Status.WARN, subject, message, fix), url
    return Item("infraenv", Status.PASS, subject, f"ImageCreated=True, ISO {redact_url(url)}"), url


def _scrub(text: str, url: str) -> str:
    """An error text about `url` with the URL in its shown form and no credential."""
    return redact(text.replace(url, redact_url(url)))


def _size(response: aiohttp.ClientResponse) -> int | None:
    total = response.headers.get("Content-Range", "").rpartition("/")[2]
    if response.status == 206 and total.isdigit():
        return int(total)
    length = response.headers.get("Content-Length", "")
    return int(length) if response.status != 206 and length.isdigit() else None


def human_size(size: int | None) -> str:
    if size is None:
        return "size not announced"
    if size < 1024:
        return f"{size} bytes"
    value, unit = float(size), "bytes"
    for unit in ("KiB", "MiB", "GiB"):  # noqa: B007 - the last unit is used after the loop
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit} ({size} bytes)"


async def iso_url(url: str, *, access: vsphere.IsoAccess | None = None) -> Item:
    """HEAD (else a one-byte ranged GET whose body is dropped) as the operator downloads:
    TLS verified against the system store and `access`'s CA bundle (`--iso-ca-bundle`),
    the proxy variables honoured, redirects followed only to https (`vsphere.iso_http`)."""
    subject = f"ISO URL {redact_url(url)}"
    access = access or vsphere.IsoAccess()
    try:
        source = access.source(url)
        async with iso_http.client(source, ISO_LIMITS) as http:
            async with iso_http.request(
                http, source, method="HEAD", headers={}, limits=ISO_LIMITS
            ) as response:
                status, size = response.status, _size(response)
            if status >= 400 and status not in (404, 410):  # HEAD refused: try a ranged GET
                headers = {"Range": "bytes=0-0"}
                async with iso_http.get(http, source, headers=headers, limits=ISO_LIMITS) as got:
                    status, size = got.status, _size(got)
                    got.close()  # never read the body
    except vsphere.IsoSourceUntrusted as exc:
        return Item(
            "iso-url",
            Status.FAIL,
            subject,
            f"TLS verification failed: {_scrub(str(exc), url)}",
            "the operator trusts the system store plus --iso-ca-bundle (ConfigMap "
            "agent-forge-trusted-ca; on OpenShift the cluster's trusted CAs): add the image "
            "service's CA there, and pass the same file here with --iso-ca-bundle",
        )
    except vsphere.IsoRedirectRefused as exc:
        return Item(
            "iso-url",
            Status.FAIL,
            subject,
            _scrub(str(exc), url),
            "serve the image over https, or make the InfraEnv's isoDownloadURL the final URL",
        )
    except vsphere.IsoSourceError as exc:
        return Item("iso-url", Status.FAIL, subject, _scrub(str(exc), url), "fix --iso-ca-bundle")
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Item(
            "iso-url",
            Status.FAIL,
            subject,
            f"did not answer: {_scrub(str(exc), url) or type(exc).__name__}",
            "check that the image service is up and reachable (from here and from the "
            "operator, directly or through HTTPS_PROXY)",
        )
    if status >= 400:
        return Item(
            "iso-url",
            Status.FAIL,
            subject,
            f"answers HTTP {status}",
            "the InfraEnv's discovery image cannot be downloaded: check the InfraEnv and the "
            "image service (a regenerated image has a new URL)",
        )
    return Item("iso-url", Status.PASS, subject, f"HTTP {status}, {human_size(size)}")


# --- vSphere (the Secret: `secret` below) -----------------------------------------------------


async def vsphere_preflight(
    sessions: vsphere.SessionRegistry,
    pool: VsphereAgentPool,
    credentials: vsphere.Credentials | None,
) -> list[Item]:
    where = pool_specs.placement(pool)
    if credentials is None:
        return [
            Item("vsphere", Status.SKIP, "vCenter", "not checked: no usable credentials Secret")
        ]
    service = vsphere.VsphereService(registry=sessions, credentials=credentials)
    try:
        problems = await service.preflight(placement=where)
    except vsphere.VsphereError as exc:
        problems = [vsphere.Problem("vCenter", str(exc), "check vCenter and run the check again")]
    if problems:
        return [Item("vsphere", Status.FAIL, p.subject, p.message, p.fix) for p in problems]
    return [
        Item(
            "vsphere",
            Status.PASS,
            f"vCenter {credentials.netloc}",
            f"{_tls(credentials)}, login ok; datacenter {where.datacenter}, resource pool "
            f"{where.resource_pool}, "
            f"network {where.network}, datastore cluster {where.datastore_cluster} and "
            f"ISO datastore {where.iso_datastore} found; folder {where.folder}",
        ),
        *await failure_domains(service, pool),
    ]


async def failure_domains(service: vsphere.VsphereService, pool: VsphereAgentPool) -> list[Item]:
    """One item per failure domain in effect: resolved like the pool's placement."""
    report = await pool_specs.inspect_domains(service, pool)
    items = [
        Item("vsphere", Status.PASS, f"failure domain {name}", "cluster, storage, network found")
        for name in report.usable
    ]
    items += [
        Item(
            "vsphere",
            Status.FAIL,
            f"failure domain {name}",
            why,
            "fix or remove it in spec.vsphere.failureDomains (new VMs skip it)",
        )
        for name, why in report.unusable
    ]
    return items


def _tls(credentials: vsphere.Credentials) -> str:
    """How vCenter's certificate was checked: said only after the login succeeded."""
    if credentials.insecure:
        return "TLS not verified (insecure)"
    if credentials.ca_bundle_pem:
        return "TLS verified with the Secret's CA bundle"
    return "TLS verified with the system store"


# --- demand ---------------------------------------------------------------------------------


async def demand(client: KubeClient, pool: VsphereAgentPool) -> list[Item]:
    """The control plane namespace, the pool's AgentMachines, other pools of its NodePool."""
    ns, cp = pool.metadata.namespace, pool.spec.control_plane_namespace
    annotation = pool.node_pool_annotation()
    key = indexes.node_pool_key(
        control_plane_namespace=cp, node_pool_namespace=ns, node_pool=pool.spec.node_pool_ref.name
    )
    try:
        await client.get(kinds.NAMESPACE, name=cp)
    except errors.NotFound:
        fix = "set spec.controlPlaneNamespace to the hosted control plane namespace"
        return [Item("namespace", Status.FAIL, f"Namespace {cp}", "does not exist", fix)]
    except errors.KubeError:
        pass  # may not get namespaces: the AgentMachine list below still tells
    return [
        await _agent_machines(client, cp=cp, key=key, annotation=annotation),
        await _other_pools(client, pool, key=key),
    ]


async def _agent_machines(client: KubeClient, *, cp: str, key: str, annotation: str) -> Item:
    subject = f"AgentMachines in {cp}"
    try:
        listed = (await client.list(kinds.AGENT_MACHINE, namespace=cp)).items
    except errors.KubeError as exc:
        return unreadable("agentmachines", subject, exc, "agentmachines")
    mine = [
        views.AgentMachine.model_validate(am)
        for am in listed
        if indexes.control_plane_object_key(am) == key
    ]
    live = [am for am in mine if not am.is_deleting]
    if live:
        waiting = sum(1 for am in live if am.is_waiting)
        without = sum(1 for am in live if not am.is_ready and not am.has_agent)
        return Item(
            "agentmachines",
            Status.PASS,
            subject,
            f"{len(live)} carry {names.ANNOTATION_NODEPOOL}={annotation} "
            f"({waiting} waiting for an Agent, {without} without an Agent)",
        )
    others = Counter(
        str(((am.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_NODEPOOL))
        for am in listed
        if indexes.control_plane_object_key(am) not in (None, key)
    )
    seen = f"; there are AgentMachines of {', '.join(sorted(others))}" if others else ""
    return Item(
        "agentmachines",
        Status.WARN,
        subject,
        f"none carries {names.ANNOTATION_NODEPOOL}={annotation} (no demand yet){seen}",
        "fine while the NodePool has 0 replicas; else check spec.nodePoolRef.name and "
        "spec.controlPlaneNamespace",
    )


async def _other_pools(client: KubeClient, pool: VsphereAgentPool, *, key: str) -> Item:
    ns, name = pool.metadata.namespace, pool.metadata.name
    subject = f"NodePool {pool.node_pool_annotation()}"
    try:
        listed: list[JsonObj] = (await client.list(kinds.VSPHERE_AGENT_POOL, namespace=ns)).items
    except errors.NotFound:
        return Item(
            "nodepool",
            Status.FAIL,
            subject,
            "the VsphereAgentPool CRD is not installed",
            "apply config/crd",
        )
    except errors.KubeError as exc:
        return unreadable("nodepool", subject, exc, "vsphereagentpools")
    others = sorted(
        f"{ns}/{p['metadata']['name']}"
        for p in listed
        if p["metadata"]["name"] != name and indexes.pool_node_pool_key(p) == key
    )
    if others:
        return Item(
            "nodepool",
            Status.FAIL,
            subject,
            f"also served by VsphereAgentPool {', '.join(others)} (its AgentMachines would "
            "match two pools: reported, never served)",
            "delete the other pool, or point one of them at another NodePool",
        )
    return Item("nodepool", Status.PASS, subject, "served by this pool only")


_KEYS: Final = (
    KEY_SERVER,
    KEY_USERNAME,
    KEY_PASSWORD,
    KEY_INSECURE,
    *CA_BUNDLE_KEYS,
)
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


async def secret(
    client: KubeClient, pool: VsphereAgentPool
) -> tuple[list[Item], vsphere.Credentials | None]:
    """Items about the pool's credentials Secret, and its credentials when usable."""
    ns, name = pool.credentials_secret_namespace(), pool.spec.vsphere.credentials_secret_ref.name
    own = pool.metadata.namespace
    subject = f"Secret {ns}/{name}"
    try:
        raw = await client.get(kinds.SECRET, namespace=ns, name=name)
    except errors.NotFound:
        create = (
            f"kubectl -n {ns} create secret generic {name} --from-literal=server=... "
            "--from-literal=username=... --from-literal=password=..."
        )
        if ns == own:
            fix = f"{create}, or fix spec.vsphere.credentialsSecretRef"
            return [Item("secret", Status.FAIL, subject, "not found", fix)], None
        message = (
            f"not found (and a Secret in another namespace than the pool's is used only when "
            f"its annotation {ALLOWED_NAMESPACES} lists {own})"
        )
        fix = (
            f"whoever manages namespace {ns}: {create}, then annotate it with "
            f"{ALLOWED_NAMESPACES}={own}; or use a Secret in namespace {own}"
        )
        return [Item("secret", Status.FAIL, subject, message, fix)], None
    except errors.Forbidden as exc:
        if ns == own:
            return [unreadable("secret", subject, exc, "secrets")], None
        return [_unverifiable(subject, own=own, ns=ns)], None
    except errors.KubeError as exc:
        return [unreadable("secret", subject, exc, "secrets")], None
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    items = _odd_entries(subject, annotations)
    if not shared_with(pool_namespace=own, secret_namespace=ns, annotations=annotations):
        return [*items, _not_shared(subject, own=own, ns=ns, name=name)], None
    data: dict[str, str] = raw.get("data") or {}
    try:
        credentials = parse_credentials(namespace=ns, name=name, data=data)
    except CredentialsError as exc:
        message, fix = _problem_and_fix(str(exc), prefix=f"vSphere credentials {subject}")
        return [*items, Item("secret", Status.FAIL, subject, message, fix)], None
    found = f"keys {', '.join(k for k in _KEYS if data.get(k))}; vCenter {credentials.netloc}"
    if ns != own:
        found = f"shared with namespace {own} ({ALLOWED_NAMESPACES}); {found}"
    if credentials.insecure:
        warning = "insecure: true, the vCenter certificate is not verified"
        fix = "put the vCenter CA in key caBundle and remove insecure"
        items += [
            Item("secret", Status.PASS, subject, found),
            Item("secret", Status.WARN, subject, warning, fix),
        ]
        return items, credentials
    # Whether vCenter's certificate verifies is known only after the login (vsphere item).
    trust = (
        "its CA bundle and the system store" if credentials.ca_bundle_pem else "the system store"
    )
    return [
        *items,
        Item(
            "secret", Status.PASS, subject, f"{found}; the certificate is checked against {trust}"
        ),
    ], credentials


def _share_fix(*, own: str, ns: str, name: str) -> str:
    return (
        f"whoever manages namespace {ns} adds {own} to the annotation (comma-separated), e.g. "
        f"kubectl -n {ns} annotate --overwrite secret {name} "
        f"{ALLOWED_NAMESPACES}=<names already listed>,{own}; or use a Secret in "
        f"namespace {own}"
    )


def _not_shared(subject: str, *, own: str, ns: str, name: str) -> Item:
    return Item(
        "secret",
        Status.FAIL,
        subject,
        f"in another namespace than the pool ({own}) and its annotation "
        f"{ALLOWED_NAMESPACES} does not list {own}: the operator refuses it "
        "(VsphereReady=False, CredentialsNotShared)",
        _share_fix(own=own, ns=ns, name=name),
    )


def _unverifiable(subject: str, *, own: str, ns: str) -> Item:
    return Item(
        "secret",
        Status.FAIL,
        subject,
        f"you may not read it, so whether it exists and lists {own} in its annotation "
        f"{ALLOWED_NAMESPACES} cannot be checked; the operator uses a Secret in "
        "another namespace only then (else VsphereReady=False, CredentialsNotShared)",
        f"ask whoever manages namespace {ns} to check the Secret and its annotation (or run "
        f"this check with their kubeconfig), or use a Secret in namespace {own}",
    )


def _odd_entries(subject: str, annotations: dict[str, str]) -> list[Item]:
    odd = sorted(n for n in allowed_namespaces(annotations) if not _DNS1123_LABEL.match(n))
    if not odd:
        return []
    return [
        Item(
            "secret",
            Status.WARN,
            subject,
            f"annotation {ALLOWED_NAMESPACES} has entries that are no namespace "
            f"names: {', '.join(repr(n) for n in odd)} (there is no wildcard)",
            "list each namespace that may use the Secret by name, separated by commas",
        )
    ]


def _problem_and_fix(text: str, *, prefix: str) -> tuple[str, str]:
    """`parse_credentials` says "<secret> <problem>: <fix>" (or "; <fix>"): split it."""
    text = text.removeprefix(prefix).lstrip(": ")
    cuts = [i for i in (text.find(": "), text.find("; ")) if i > 0]
    if not cuts:
        return text, "fix the Secret's keys: server, username, password (insecure, caBundle)"
    return text[: min(cuts)], text[min(cuts) + 2 :]
