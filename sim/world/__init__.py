"""The world around the operator, composed: image service, InfraEnvs, NodePools, CAPI, AI.

`async with World(controlplane=cp, vcsim=vc, namespace="ns") as world:` starts, on
one machine and in this event loop:

- the ISO server (`world.iso_server`) and the InfraEnv stand-in (`world.infraenvs`),
- the CAPI agent provider (`world.capi`) and the Assisted Installer (`world.assisted`),
  which reads vcsim through its own pyVmomi session,
- CAPI's Machine controller (`world.machines`) and one NodePool driver per
  `world.nodepool(name)` (the replicas knob),

all talking to the control plane as admin straight to the apiserver (not through
the fault proxy, so proxy faults and counters concern the operator alone). The pool
namespace (InfraEnvs, Agents, pools, Secrets) is `namespace`; AgentMachines and
Machines live in `control_plane_namespace` (created when missing).

Helpers create the objects a user would (`create_infraenv`, `create_credentials`,
`create_pool` for the default vcsim inventory), and `snapshot()` gathers pools,
VsphereAgents, Agents, AgentMachines, Machines, events and this world's VMs.
`violations` collects broken domain rules the actors witnessed (a bound Agent
deleted, a bound Agent's VM deleted); `check()` fails on them, on actor bugs and on
a cached ISO whose content-addressed name is not the sha256 of its bytes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from agentforge.api import kinds
from agentforge.kube import config as kube_config
from agentforge.kube.client import KubeClient
from agentforge.vsphere.model import markers
from sim.actors.assisted import AssistedInstaller
from sim.actors.base import Actor, Journal, Timings
from sim.actors.capi import CapiAgentProvider
from sim.actors.infraenv import InfraEnvStandIn
from sim.actors.isoserver import DEFAULT_ISO_SIZE, IsoServer
from sim.actors.nodepool import MACHINE_V1BETA2, MachineController, NodePoolDriver
from sim.actors.vcenter import VcenterReader, VmFact
from sim.cluster_config import cluster_config
from sim.controlplane import ControlPlane
from sim.vcsim import Vcsim
from sim.world import samples
from sim.world.snapshot import Snapshot

__all__ = ["Snapshot", "World", "control_plane_namespace_for"]

T = TypeVar("T")

DEFAULT_CLUSTER = "hc1"
DEFAULT_INFRAENV = "discovery"
DEFAULT_SECRET = "vsphere-credentials"


def control_plane_namespace_for(namespace: str) -> str:
    """A DNS label for the hosted control plane namespace of a pool namespace."""
    digest = hashlib.sha256(namespace.encode()).hexdigest()[:6]
    return f"{namespace[:50].rstrip('-')}-cp-{digest}"


class World:
    def __init__(
        self,
        *,
        controlplane: ControlPlane,
        vcsim: Vcsim,
        namespace: str,
        control_plane_namespace: str | None = None,
        hosted_cluster: str = DEFAULT_CLUSTER,
        timings: Timings | None = None,
        iso_size: int = DEFAULT_ISO_SIZE,
        kubeconfig: Path | None = None,
    ) -> None:
        self.controlplane = controlplane
        self.vcsim = vcsim
        self.namespace = namespace
        self.control_plane_namespace = control_plane_namespace or control_plane_namespace_for(
            namespace
        )
        self.hosted_cluster = hosted_cluster
        self.timings = timings or Timings()
        self.journal = Journal()
        self.violations: list[str] = []
        self.iso_server = IsoServer(size=iso_size)
        self.nodepools: dict[str, NodePoolDriver] = {}
        self._kubeconfig = kubeconfig
        self._client: KubeClient | None = None
        self._vcenter: VcenterReader | None = None
        self._infraenvs: InfraEnvStandIn | None = None
        self._capi: CapiAgentProvider | None = None
        self._assisted: AssistedInstaller | None = None
        self._machines: MachineController | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> Self:
        for ns in (self.namespace, self.control_plane_namespace):
            await asyncio.to_thread(self.controlplane.create_namespace, ns)
        if self._kubeconfig is not None:
            cluster = await cluster_config(self._kubeconfig)
        else:  # admin straight to the apiserver (what direct_admin_kubeconfig holds)
            cluster = kube_config.ClusterConfig(
                server=self.controlplane.apiserver_url,
                ca_file=str(self.controlplane.ca_file),
                token=kube_config.StaticToken(f"Bearer {self.controlplane.admin_token}"),
                source="sim admin",
            )
        self._client = KubeClient(config=cluster, user_agent="agent-forge-sim")
        await self.iso_server.start()
        self._vcenter = VcenterReader(
            host=self.vcsim.host,
            port=self.vcsim.port,
            username=self.vcsim.username,
            password=self.vcsim.password,
            ssl_context=self.vcsim.ssl_context(),
        )
        await self._vcenter.connect()
        timings, journal = self.timings, self.journal
        self._infraenvs = InfraEnvStandIn(
            client=self._client,
            iso_server=self.iso_server,
            namespaces=(self.namespace,),
            timings=timings,
            journal=journal,
        )
        self._capi = CapiAgentProvider(
            client=self._client,
            control_plane_namespaces=(self.control_plane_namespace,),
            agent_namespaces=(self.namespace,),
            violations=self.violations,
            timings=timings,
            journal=journal,
        )
        self._machines = MachineController(
            client=self._client,
            control_plane_namespace=self.control_plane_namespace,
            timings=timings,
            journal=journal,
        )
        self._assisted = AssistedInstaller(
            client=self._client,
            vcenter=self._vcenter,
            iso_server=self.iso_server,
            namespaces=(self.namespace,),
            violations=self.violations,
            timings=timings,
            journal=journal,
        )
        for actor in self.actors:
            actor.start()
        return self

    async def stop(self) -> None:
        for actor in self.actors:
            await actor.stop()
        if self._vcenter is not None:
            await self._vcenter.close()
        await self.iso_server.stop()
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- parts ---------------------------------------------------------------------------

    @property
    def client(self) -> KubeClient:
        return _started(self._client)

    @property
    def infraenvs(self) -> InfraEnvStandIn:
        return _started(self._infraenvs)

    @property
    def capi(self) -> CapiAgentProvider:
        return _started(self._capi)

    @property
    def assisted(self) -> AssistedInstaller:
        return _started(self._assisted)

    @property
    def machines(self) -> MachineController:
        return _started(self._machines)

    @property
    def vcenter(self) -> VcenterReader:
        return _started(self._vcenter)

    @property
    def actors(self) -> list[Actor]:
        parts: list[Actor | None] = [self._infraenvs, self._machines, self._capi, self._assisted]
        return [a for a in parts if a is not None]

    def kick(self) -> None:
        for actor in self.actors:
            actor.kick()

    async def settle(self) -> None:
        """Every actor has run a whole step since this call."""
        await asyncio.gather(*(a.settle() for a in self.actors))

    def failures(self) -> list[str]:
        """Unexpected errors inside the actors (bugs of the simulation)."""
        return [f"{a.name}: {f}" for a in self.actors for f in a.failures]

    def untrue_isos(self) -> list[str]:
        """Cached ISOs of this namespace's pools (default prefix `agent-forge/<ns>/`, on the
        simulator's disk) whose bytes do not hash to their content-addressed name: no
        Assisted Installer would recognise them, and the operator promised the name."""
        if self.vcsim.workdir is None:
            return []
        root = self.vcsim.workdir / "datastores" / "dc1" / "iso-ds" / "agent-forge"
        folder = root / self.namespace
        problems = []
        for path in sorted(folder.rglob("*.iso")) if folder.is_dir() else []:
            name = path.name.removesuffix(".iso")
            if len(name) != 64 or path.name.startswith("."):
                continue
            try:
                digest = _sha256_of(path)
            except FileNotFoundError:  # pruned meanwhile
                continue
            if digest != name:
                problems.append(
                    f"[iso-ds] {path.relative_to(root.parent)} holds bytes with sha256 {digest}"
                )
        return problems

    def check(self) -> None:
        """Fail when a domain rule was broken, an actor hit an unexpected error, or a
        cached ISO's content-addressed name is not the sha256 of its bytes."""
        problems = [*self.violations, *self.failures(), *self.untrue_isos()]
        if problems:
            raise AssertionError(
                "the simulated world saw problems:\n  "
                + "\n  ".join(problems)
                + "\njournal:\n"
                + self.journal.render()
            )

    # --- objects a user creates ----------------------------------------------------------

    async def create_infraenv(self, name: str = DEFAULT_INFRAENV, **kwargs: Any) -> dict[str, Any]:
        return await self.infraenvs.create(name, namespace=self.namespace, **kwargs)

    async def create_credentials(
        self, name: str = DEFAULT_SECRET, *, omit: Iterable[str] = (), with_ca: bool = True
    ) -> dict[str, Any]:
        secret = samples.credentials_secret(
            name=name,
            namespace=self.namespace,
            server=self.vcsim.server,
            username=self.vcsim.username,
            password=self.vcsim.password,
            ca_file=Path(self.vcsim.ca_file) if with_ca else None,
            omit=omit,
        )
        return await self.client.create(kinds.SECRET, secret)

    def nodepool_labels(self, nodepool: str) -> dict[str, str]:
        """The labels of a NodePool's agentLabelSelector (and so of its pool's agents)."""
        return {"agent-pool": nodepool}

    def pool_manifest(self, name: str = "workers", **kwargs: Any) -> dict[str, Any]:
        nodepool = kwargs.pop("nodepool", name)
        kwargs.setdefault("labels", self.nodepool_labels(nodepool))
        kwargs.setdefault("infraenv", DEFAULT_INFRAENV)
        kwargs.setdefault("secret", DEFAULT_SECRET)
        kwargs.setdefault("hosted_cluster", self.hosted_cluster)
        return samples.pool_manifest(
            name=name,
            namespace=self.namespace,
            control_plane_namespace=self.control_plane_namespace,
            nodepool=nodepool,
            **kwargs,
        )

    async def create_pool(self, name: str = "workers", **kwargs: Any) -> dict[str, Any]:
        return await self.client.create(
            kinds.VSPHERE_AGENT_POOL, self.pool_manifest(name, **kwargs)
        )

    def nodepool(
        self, name: str = "workers", *, labels: Mapping[str, str] | None = None
    ) -> NodePoolDriver:
        """The driver of NodePool `<namespace>/<name>` (made on first use)."""
        driver = self.nodepools.get(name)
        if driver is None:
            driver = NodePoolDriver(
                client=self.client,
                namespace=self.namespace,
                nodepool=name,
                control_plane_namespace=self.control_plane_namespace,
                cluster_name=self.hosted_cluster,
                labels=dict(labels or self.nodepool_labels(name)),
                journal=self.journal,
                machines=self.machines,
            )
            self.nodepools[name] = driver
        return driver

    # --- observation ---------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        ns, cp = self.namespace, self.control_plane_namespace
        client = self.client
        lists = await asyncio.gather(
            client.list(kinds.VSPHERE_AGENT_POOL, namespace=ns),
            client.list(kinds.VSPHERE_AGENT, namespace=ns),
            client.list(kinds.AGENT, namespace=ns),
            client.list(kinds.AGENT_MACHINE, namespace=cp),
            client.list(MACHINE_V1BETA2, namespace=cp),
            client.list(kinds.INFRA_ENV, namespace=ns),
            client.list(kinds.EVENT, namespace=ns),
        )
        vms = [vm for vm in await self.vcenter.vms(extra_config=True) if self.owns_vm(vm)]
        pools, vas, agents, ams, machines, infraenvs, events = (r.items for r in lists)
        return Snapshot(
            namespace=ns,
            control_plane_namespace=cp,
            pools=pools,
            vsphere_agents=vas,
            agents=agents,
            agent_machines=ams,
            machines=machines,
            infraenvs=infraenvs,
            events=sorted(events, key=_event_time),
            vms=sorted(vms, key=lambda vm: vm.name),
            images={
                image.infraenv: image.sha256
                for image in self.iso_server.current().values()
                if image.namespace == ns
            },
        )

    def owns_vm(self, vm: VmFact) -> bool:
        """A VM made for a pool of this namespace, or one booting this world's ISOs."""
        if vm.extra_config.get(markers.PREFIX + "pool-namespace") == self.namespace:
            return True
        return any(self.iso_server.by_sha256(d) is not None for d in vm.iso_digests)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _started(part: T | None) -> T:
    if part is None:
        raise RuntimeError("the world is not started: use `async with World(...)`")
    return part


def _event_time(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")
