"""The world the vSphere-facing controllers run in during integration tests.

A `World` is one test namespace on the real control plane plus the shared vcsim: a
credentials Secret for the simulator, an InfraEnv whose ISO URL points at a small
aiohttp image server the test controls (content, ETag, 404), informers over the
kinds the controllers read, and a `Deps` like the app builds. `world.run(...)`
runs the `vm` and/or `infra` controllers in-process until the block ends (or until
`crash()` cancels them mid-flight, as a killed process would stop).

The CRDs installed are rendered from the current models, so fields added to the
API are there even before `make manifests` refreshed `config/crd`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client import REGISTRY

from agentforge import vsphere
from agentforge.api import crdgen, kinds, names
from agentforge.app import cache_transform
from agentforge.kube import client
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Controller
from agentforge.kube.events import EventRecorder
from agentforge.kube.informer import Informer
from agentforge.reconcilers.common import records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.ejection import eject
from agentforge.reconcilers.infra import reconcile as infra
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.spread import reconcile as spread_rules
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.secret_credentials import SecretCredentials
from sim.actors.isoserver import discovery_iso
from sim.actors.waiting import eventually
from sim.vcsim.launcher import Vcsim
from sim.vsphere_tasks import TaskDriver

FAST = vsphere.SessionOptions(
    retry_attempts=3, retry_initial_seconds=0.01, retry_max_seconds=0.05, wait_max_seconds=15
)
CACHED = (kinds.VSPHERE_AGENT_POOL, kinds.VSPHERE_AGENT, kinds.AGENT, kinds.INFRA_ENV)
SECRET = "vc-creds"
INFRA_ENV = "infra"
DEADLINE = 30.0
REFRESH_S = 1.0
ISO_DS = "iso-ds"
MUTATING = (
    "CreateVM_Task",
    "ReconfigVM_Task",
    "Destroy_Task",
    "PowerOnVM_Task",
    "MakeDirectory",
    "DeleteDatastoreFile_Task",
    "MoveDatastoreFile_Task",
    "CreateFolder",
)


def install_current_crds(controlplane: Any, folder: Path) -> None:
    for name, crd in crdgen.render_all().items():
        (folder / name).write_text(yaml.safe_dump(crd))
    controlplane.install_crds([folder])


def discovery_image() -> bytes:
    """A bootable ISO 9660 image of its own content (the operator checks what it caches)."""
    return discovery_iso(uuid.uuid4().hex, 1024 * 1024 + 17)


@dataclass
class IsoServer:
    """One discovery image with a strong ETag; counts requests and body bytes it served.

    `content_type`, `encoding` and `chunked` shape the answer, so a test can make it
    answer 200 with something that is no ISO (an HTML page, a JSON error, an archive);
    `break_after` closes the connection after that many bytes of a Content-Length body.
    """

    body: bytes = field(default_factory=discovery_image)
    etag: str = '"v1"'
    status: int = 200
    content_type: str = "application/octet-stream"
    encoding: str | None = None
    chunked: bool = False
    break_after: int | None = None
    served: int = 0
    requests: int = 0
    url: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def change(self) -> None:
        self.body = discovery_image()
        self.etag = f'"{uuid.uuid4().hex}"'

    def answer(self, body: bytes, *, content_type: str, **shape: Any) -> None:
        """Answer 200 with `body` (a new version: a new ETag) from now on."""
        self.body, self.content_type, self.etag = body, content_type, f'"{uuid.uuid4().hex}"'
        self.encoding = shape.get("encoding")
        self.chunked = bool(shape.get("chunked"))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.status != 200:
            return web.Response(status=self.status)
        if request.headers.get("If-None-Match") == self.etag:
            return web.Response(status=304, headers={"ETag": self.etag})
        self.served += len(self.body)
        headers = {"ETag": self.etag, "Content-Type": self.content_type}
        if self.encoding:
            headers["Content-Encoding"] = self.encoding
        if self.break_after is not None:
            cut = web.StreamResponse(headers=headers)
            cut.content_length = len(self.body)
            await cut.prepare(request)
            await cut.write(self.body[: self.break_after])
            request.transport.close()  # type: ignore[union-attr]
            return cut
        if not self.chunked:
            return web.Response(body=self.body, headers=headers)
        resp = web.StreamResponse(headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(self.body), 64 * 1024):
            await resp.write(self.body[start : start + 64 * 1024])
        await resp.write_eof()
        return resp


class World:
    def __init__(
        self,
        *,
        kube: client.KubeClient,
        namespace: str,
        vcsim: Vcsim,
        iso: IsoServer,
        registry: vsphere.SessionRegistry,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.vcsim = vcsim
        self.iso = iso
        self.registry = registry
        self.folder = f"af-it/{namespace}"
        self.prefix = f"agent-forge-it/{namespace}"
        self.informers = {
            kind: Informer(
                client=kube,
                kind=kind,
                namespaces=[namespace],
                transform=cache_transform(kind),
                parse=records.parser(kind),
            )
            for kind in CACHED
        }
        # Re-read every second (the default is a minute) so a fixed Secret shows quickly.
        self.credentials = SecretCredentials(client=kube, refresh_interval=REFRESH_S)
        self.deps = Deps(
            client=kube,
            informers=self.informers,
            events=EventRecorder(client=kube, component="agent-forge-it"),
            vsphere=registry,
            credentials=self.credentials,
        )
        self.service = vsphere.VsphereService(registry=registry, credentials=self.vc_credentials)
        self.tasks = TaskDriver(registry)
        """vCenter tasks a test runs itself, run as the controllers run theirs."""
        self._running: list[tuple[Controller, asyncio.Task[None]]] = []

    # --- vSphere ------------------------------------------------------------------------

    @property
    def vc_credentials(self) -> vsphere.Credentials:
        return vsphere.Credentials(
            server=self.vcsim.server,
            username=self.vcsim.username,
            password=self.vcsim.password,
            ca_bundle_pem=Path(self.vcsim.ca_file).read_text(),
        )

    @property
    def placement(self) -> vsphere.Placement:
        return vsphere.Placement(
            datacenter="dc1",
            resource_pool="cluster/Resources",
            folder=self.folder,
            network="VM Network",
            datastore_cluster="dsc1",
            iso_datastore=ISO_DS,
        )

    @property
    def iso_location(self) -> vsphere.Location:
        return vsphere.Location(datacenter="dc1", datastore=ISO_DS)

    async def iso_files(self) -> list[str]:
        files = await self.service.list_files(where=self.iso_location, prefix=self.prefix)
        return sorted(f.path for f in files)

    async def vms(self) -> list[vsphere.VmFacts]:
        return sorted(
            await self.service.vms_in_folder(placement=self.placement), key=lambda v: v.name
        )

    async def govc(self, *args: str) -> str:
        return await asyncio.to_thread(self.vcsim.govc, *args)

    async def unmarked_vm(self, name: str, *, folder: str | None = None) -> vsphere.VmFacts:
        """A VM made behind the operator's back (no markers), powered off."""
        where = folder or self.folder
        parts = where.split("/")
        for depth in range(1, len(parts) + 1):  # govc has no mkdir -p
            with contextlib.suppress(RuntimeError):
                await self.govc("folder.create", "/dc1/vm/" + "/".join(parts[:depth]))
        await self.govc(
            "vm.create",
            "-folder",
            f"/dc1/vm/{where}",
            "-pool",
            "cluster/Resources",
            "-ds",
            "ds1",
            "-on=false",
            "-net",
            "VM Network",
            name,
        )
        placement = dataclasses.replace(self.placement, folder=where)
        found = await self.service.vm_by_name(placement=placement, name=name)
        assert found is not None
        return found

    # --- Kubernetes objects -------------------------------------------------------------

    async def create_secret(
        self, *, name: str = SECRET, namespace: str | None = None, **override: str | None
    ) -> None:
        values: dict[str, str | None] = {
            "server": self.vcsim.server,
            "username": self.vcsim.username,
            "password": self.vcsim.password,
            "caBundle": self.vc_credentials.ca_bundle_pem,
        }
        values.update(override)
        data = {
            k: base64.b64encode(v.encode()).decode() for k, v in values.items() if v is not None
        }
        await self.kube.create(
            kinds.SECRET,
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data},
            namespace=namespace or self.namespace,
        )

    async def create_infra_env(self, *, url: str | None = None, name: str = INFRA_ENV) -> None:
        await self.kube.create(
            kinds.INFRA_ENV,
            {
                "apiVersion": kinds.INFRA_ENV.api_version,
                "kind": "InfraEnv",
                "metadata": {"name": name},
                "spec": {"pullSecretRef": {"name": "pull"}},
            },
            namespace=self.namespace,
        )
        await self.set_iso_url(self.iso.url if url is None else url, name=name)

    async def set_iso_url(self, url: str, *, name: str = INFRA_ENV) -> None:
        def mutate(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"] = {"isoDownloadURL": url} if url else {}
            return obj

        await self.kube.update_status(
            kinds.INFRA_ENV, namespace=self.namespace, name=name, mutate=mutate
        )

    def pool_body(self, name: str = "pool", **spec: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "hostedClusterRef": {"name": "hc"},
            "nodePoolRef": {"name": "np"},
            "infraEnvRef": {"name": INFRA_ENV},
            "controlPlaneNamespace": "clusters-hc",
            "vsphere": {
                "credentialsSecretRef": {"name": SECRET},
                "datacenter": "dc1",
                "datastoreCluster": "dsc1",
                "isoDatastore": ISO_DS,
                "resourcePool": "cluster/Resources",
                "folder": self.folder,
                "network": "VM Network",
            },
            "template": {"namePrefix": "w", "numCPUs": 2, "memoryMiB": 2048, "diskGiB": 20},
            "agent": {"labels": {"pool": name}},
            "iso": {"pathPrefix": self.prefix},
        }
        for key, value in spec.items():
            if isinstance(value, dict) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        return {
            "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
            "kind": "VsphereAgentPool",
            "metadata": {"name": name},
            "spec": body,
        }

    async def create_pool(self, name: str = "pool", **spec: Any) -> dict[str, Any]:
        return await self.kube.create(
            kinds.VSPHERE_AGENT_POOL, self.pool_body(name, **spec), namespace=self.namespace
        )

    async def create_vsphere_agent(
        self,
        name: str,
        *,
        pool: str = "pool",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        return await self.kube.create(
            kinds.VSPHERE_AGENT,
            {
                "apiVersion": kinds.VSPHERE_AGENT.api_version,
                "kind": "VsphereAgent",
                "metadata": {
                    "name": name,
                    "labels": {names.LABEL_POOL: pool, **(labels or {})},
                    "annotations": annotations or {},
                },
                "spec": {"poolRef": {"name": pool}},
            },
            namespace=self.namespace,
        )

    async def create_agent(self, name: str, *, bound: bool = False) -> dict[str, Any]:
        labels = {names.LABEL_INFRAENV: INFRA_ENV}
        if bound:
            labels[names.LABEL_AGENT_MACHINE_REF] = "am-1"
        return await self.kube.create(
            kinds.AGENT,
            {
                "apiVersion": kinds.AGENT.api_version,
                "kind": "Agent",
                "metadata": {"name": name, "labels": labels},
                "spec": {"approved": True, "role": "worker"},
            },
            namespace=self.namespace,
        )

    async def set_agent_ref(self, vsphere_agent: str, agent: str) -> None:
        """What the pool controller does once it matched the Agent to the VM."""

        def mutate(obj: dict[str, Any]) -> dict[str, Any]:
            vm_status = obj.setdefault("status", {}).setdefault("vm", {"name": "unknown"})
            vm_status["agentRef"] = {"name": agent, "namespace": self.namespace, "kind": "Agent"}
            return obj

        await self.kube.update_status(
            kinds.VSPHERE_AGENT, namespace=self.namespace, name=vsphere_agent, mutate=mutate
        )

    async def get(self, kind: kinds.Kind, name: str) -> dict[str, Any] | None:
        try:
            return await self.kube.get(kind, namespace=self.namespace, name=name)
        except kerrors.NotFound:
            return None

    def unique(self, stem: str) -> str:
        """A VM name no other test uses (datastore folders are named after VMs)."""
        return f"{stem}-{hashlib.sha256(self.namespace.encode()).hexdigest()[:8]}"

    def vm_name(self, vsphere_agent: str, prefix: str = "w") -> str:
        return naming.vm_name(
            name_prefix=prefix, namespace=self.namespace, vsphere_agent=vsphere_agent
        )

    async def events(self, reason: str) -> list[dict[str, Any]]:
        listed = await self.kube.list(kinds.EVENT, namespace=self.namespace)
        return [e for e in listed.items if e.get("reason") == reason]

    # --- waiting ------------------------------------------------------------------------

    async def condition(
        self, kind: kinds.Kind, name: str, type_: str, *, status: str, reason: str | None = None
    ) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            obj = await self.get(kind, name)
            for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
                if (
                    cond["type"] == type_
                    and cond["status"] == status
                    and (reason is None or cond["reason"] == reason)
                ):
                    return obj
            return None

        found: dict[str, Any] = await eventually(
            check, what=f"{kind.kind} {name} {type_}={status}/{reason}"
        )
        return found

    # --- controllers --------------------------------------------------------------------

    async def _cache_current(self, kind: kinds.Kind, name: str) -> bool:
        """Does the informer hold the API server's current version of `name`?"""
        current = await self.get(kind, name)
        cached = self.informers[kind].get(namespace=self.namespace, name=name)
        version = ((current or {}).get("metadata") or {}).get("resourceVersion")
        seen = ((cached or {}).get("metadata") or {}).get("resourceVersion")
        return version is not None and version == seen

    async def caught_up(self, kind: kinds.Kind, name: str) -> None:
        """Wait until the informers hold the API server's current version of `name`, as
        a process that starts now would list it."""

        async def check() -> bool:
            return await self._cache_current(kind, name)

        await eventually(check, what=f"the informer to hold {kind.kind} {name} as stored")

    async def settled(self, kind: kinds.Kind, name: str, controller: Controller) -> None:
        """Wait until the cache holds the API server's current version of `name` and
        `controller` is idle: it has seen (and reconciled) its own last write."""

        async def check() -> bool:
            idle = len(controller.queue) == 0 and not controller.queue.processing
            return await self._cache_current(kind, name) and idle

        await eventually(check, what=f"{controller.name} to see {kind.kind} {name} as stored")

    async def reconciled(self, controller: Controller, key: str) -> None:
        """Enqueue `key` and wait until `controller` has finished one more reconcile
        (its `agent_forge_reconcile_total` rose) and is idle again."""
        before = reconcile_count(controller)
        controller.enqueue(key)  # type: ignore[arg-type]

        async def check() -> bool:
            idle = len(controller.queue) == 0 and not controller.queue.processing
            return reconcile_count(controller) > before and idle

        await eventually(check, what=f"{controller.name} to reconcile {key}")

    @contextlib.asynccontextmanager
    async def run(
        self, *, vm_controller: bool = True, infra_controller: bool = True, ejection: bool = False
    ) -> AsyncIterator[list[Controller]]:
        """`ejection`: the `ejection` controller runs beside the vm controller (which
        finishes a recorded ejection before a deletion), as the app wires it.
        With the vm controller runs the `spread-rules` controller (a spread pool's DRS
        rules), as the app does."""
        built: list[Controller] = []
        if infra_controller:
            built.append(infra.controller(self.deps, retry_base=0.05))
        if vm_controller:
            step = eject.Ejection() if ejection else None
            # no quiet wait for the ISO: tests of WaitingForISO see it at once
            built.append(vm.controller(self.deps, ejection=step, retry_base=0.05, iso_quiet=0.0))
            if ejection:
                built.append(eject.controller(self.deps, retry_base=0.05))
            built.append(spread_rules.controller(self.deps, retry_base=0.05))
        self._running = [(c, asyncio.create_task(c.run(), name=f"it-{c.name}")) for c in built]
        try:
            yield built
        finally:
            await self.stop()

    async def crash(self) -> None:
        """Cancel the controllers mid-flight, as a killed process stops."""
        running, self._running = self._running, []
        for _, task in running:
            task.cancel()
        for _, task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.credentials.close()

    async def stop(self) -> None:
        running, self._running = self._running, []
        for ctrl, _ in running:
            await ctrl.stop()
        for _, task in running:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.deps.events.flush()  # as a clean shutdown does
        await self.credentials.close()


def reconcile_count(controller: Controller) -> float:
    """Reconciles `controller` finished, whatever their result (the operator's metric)."""
    return sum(
        REGISTRY.get_sample_value(
            "agent_forge_reconcile_total", {"controller": controller.name, "result": result}
        )
        or 0.0
        for result in ("success", "error", "requeue", "requeue_after")
    )


@contextlib.asynccontextmanager
async def world_for(
    *, kube: client.KubeClient, namespace: str, vcsim: Vcsim
) -> AsyncIterator[World]:
    iso = IsoServer()
    app = web.Application()
    app.router.add_get("/images/discovery.iso", iso.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    iso.url = f"http://127.0.0.1:{port}/images/discovery.iso?api_key=it-secret"
    registry = vsphere.SessionRegistry(options=FAST)
    world = World(kube=kube, namespace=namespace, vcsim=vcsim, iso=iso, registry=registry)
    await world.service.session()  # its background tasks exist before the test body
    world.deps.events.start()  # as the app does: its flusher too
    for informer in world.informers.values():
        informer.start()
    try:
        for informer in world.informers.values():
            await informer.synced()
        yield world
    finally:
        await world.stop()
        await world.deps.events.close()
        for informer in world.informers.values():
            await informer.stop()
        world.tasks.close()
        await registry.close()
        await runner.cleanup()
