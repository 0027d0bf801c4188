"""The `scaleup` and `pool` controllers running in-process against the real control plane.

`running_operator` builds what the app builds (trimmed informers over the pool and
control-plane namespaces, an event recorder, `Deps`) for an identity of its own, so
the fault proxy counts the controllers' requests apart from the test's set-up.
Neither controller ever calls vSphere, so `Deps.vsphere` is an unused, never
logged-in `SessionRegistry` and `Deps.credentials` a stand-in that refuses.
Nobody runs the `vm` controller here: a test plays its part (recording a VM's
identity, removing its finalizer) by hand.

With `vsphere_controllers=True` the operator is whole: `infra` and `vm` (with the ISO ejection
step) run too, under the same identity, with the credentials Secret read as the app
reads it and a vSphere session registry with short retries (the simulator).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentforge import vsphere
from agentforge.api import kinds, names
from agentforge.app import cache_transform
from agentforge.kube import client as kube_client
from agentforge.kube.controller import Controller
from agentforge.kube.events import EventRecorder
from agentforge.kube.informer import Informer
from agentforge.reconcilers.common import records
from agentforge.reconcilers.common.deps import CredentialsSource, Deps
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.infra import reconcile as infra
from agentforge.reconcilers.pool import reconcile as pool
from agentforge.reconcilers.scaleup import reconcile as scaleup
from agentforge.reconcilers.spread import reconcile as spread_rules
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.secret_credentials import CredentialsError, SecretCredentials
from agentforge.wiring import CACHED_KINDS
from sim.actors.waiting import eventually
from sim.cluster_config import cluster_config
from sim.controlplane.controlplane import ControlPlane

IDENTITY = "agent-forge-it"
FAST_VSPHERE = vsphere.SessionOptions(
    retry_attempts=3, retry_initial_seconds=0.01, retry_max_seconds=0.05, wait_max_seconds=15
)
KINDS = CACHED_KINDS  # the kinds the app caches
JsonObj = dict[str, Any]


class NoCredentials:
    """The controllers under test never reach vSphere; any attempt is a test failure."""

    async def get(
        self, *, namespace: str, name: str, for_namespace: str, max_age: float | None = None
    ) -> vsphere.Credentials:
        raise CredentialsError(f"no vSphere in this test (asked for {namespace}/{name})")


@dataclass
class Clock:
    """Wall clock plus an offset a test can move forward."""

    offset: timedelta = field(default_factory=timedelta)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Operator:
    deps: Deps
    clock: Clock
    controllers: list[Controller]


FAST_STATUS_INTERVAL_S = 1.0
"""The pool's routine status pacing in these tests (shipped: 10 s, `status_pacing`)."""


@contextlib.asynccontextmanager
async def running_operator(
    controlplane: ControlPlane,
    *,
    namespaces: list[str],
    vsphere_controllers: bool = False,
    registry: vsphere.SessionRegistry | None = None,
    status_interval: float = FAST_STATUS_INTERVAL_S,
    status_burst_interval: float = FAST_STATUS_INTERVAL_S,
    iso_quiet: float = 0.0,
    first_status_quiet: float = 0.0,
) -> AsyncIterator[Operator]:
    """`registry`: a vSphere session registry the caller owns (and logged in before the
    test body, so its background tasks are not the test's). `status_interval`,
    `status_burst_interval`, `iso_quiet` and `first_status_quiet`: the pool's routine
    status pacing (while VMs are on their way too), a new
    VsphereAgent's quiet wait for its ISO and a new pool's for its checks, short here
    so tests do not wait them out (most run no `infra` controller to report the
    checks); a test that counts writes passes the shipped values."""
    kubeconfig = controlplane.user_kubeconfig(IDENTITY, ["system:masters"])
    cfg = await cluster_config(kubeconfig)
    retry = kube_client.RetryPolicy(attempts=6, initial_backoff=0.02, max_backoff=0.5)
    owned = registry is None
    registry = registry or vsphere.SessionRegistry(
        options=FAST_VSPHERE if vsphere_controllers else None
    )
    async with kube_client.KubeClient(config=cfg, retry=retry) as client:
        credentials: CredentialsSource = (
            SecretCredentials(client=client) if vsphere_controllers else NoCredentials()
        )
        informers = {
            kind: Informer(
                client=client,
                kind=kind,
                namespaces=namespaces,
                transform=cache_transform(kind),
                parse=records.parser(kind),
            )
            for kind in KINDS
        }
        clock = Clock()
        deps = Deps(
            client=client,
            informers=informers,
            events=EventRecorder(client=client, component="agent-forge-it"),
            vsphere=registry,
            credentials=credentials,
            now=clock.now,
        )
        controllers = [
            scaleup.controller(deps),
            pool.controller(
                deps,
                status_interval=status_interval,
                status_burst_interval=status_burst_interval,
                first_status_quiet=first_status_quiet,
            ),
        ]
        if vsphere_controllers:
            controllers += [
                infra.controller(deps, retry_base=0.05),
                vm.controller(
                    deps, ejection=ejection.Ejection(), retry_base=0.05, iso_quiet=iso_quiet
                ),
                ejection.controller(deps, retry_base=0.05),
                spread_rules.controller(deps, retry_base=0.05),
            ]
        async with contextlib.AsyncExitStack() as stack:
            for informer in informers.values():
                await stack.enter_async_context(informer)
            runs = [asyncio.create_task(c.run(), name=f"it-{c.name}") for c in controllers]
            deps.events.start()  # as the app does: its flusher exists before the test body
            try:
                # Workers exist before the test body starts (the task hygiene check
                # counts tasks created during the body).
                await eventually(
                    lambda: all(c.started for c in controllers),
                    what="the controllers' caches to sync",
                )
                for _ in range(3):
                    await asyncio.sleep(0)
                yield Operator(deps=deps, clock=clock, controllers=controllers)
            finally:
                for ctrl in controllers:
                    await ctrl.stop()
                await asyncio.gather(*runs, return_exceptions=True)
                await deps.events.flush()  # as a clean shutdown does
                await deps.events.close()
                if isinstance(credentials, SecretCredentials):
                    await credentials.close()
    if owned:
        await registry.close()


# --- objects -----------------------------------------------------------------------------

POOL = "workers"
NODE_POOL = "workers"
INFRA_ENV = "demo"
CLUSTER = "demo"
LABELS = {"customer": "acme"}


def pool_obj(
    ns: str, cpns: str, *, name: str = POOL, cleanup: str = "Delete", node_pool: str = NODE_POOL
) -> JsonObj:
    return {
        "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
        "kind": "VsphereAgentPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "hostedClusterRef": {"name": CLUSTER},
            "nodePoolRef": {"name": node_pool},
            "infraEnvRef": {"name": INFRA_ENV},
            "controlPlaneNamespace": cpns,
            "vsphere": {
                "credentialsSecretRef": {"name": "vsphere"},
                "datastoreCluster": "dsc1",
                "isoDatastore": "iso-ds",
                "resourcePool": "cluster/Resources",
                "network": "VM Network",
            },
            "template": {},
            "agent": {"labels": dict(LABELS)},
            "cleanupPolicy": cleanup,
        },
    }


def infra_env_obj(ns: str) -> JsonObj:
    return {
        "apiVersion": kinds.INFRA_ENV.api_version,
        "kind": "InfraEnv",
        "metadata": {"name": INFRA_ENV, "namespace": ns},
        "spec": {"pullSecretRef": {"name": "pull-secret"}},
    }


def agent_machine_obj(cpns: str, pool_ns: str, name: str, *, node_pool: str = NODE_POOL) -> JsonObj:
    return {
        "apiVersion": kinds.AGENT_MACHINE.api_version,
        "kind": "AgentMachine",
        "metadata": {
            "name": name,
            "namespace": cpns,
            "annotations": {names.ANNOTATION_NODEPOOL: f"{pool_ns}/{node_pool}"},
        },
        "spec": {"agentLabelSelector": {"matchLabels": dict(LABELS)}},
    }


def machine_obj(cpns: str, pool_ns: str, name: str, *, infra: str) -> JsonObj:
    return {
        "apiVersion": kinds.MACHINE.api_version,
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": cpns,
            "annotations": {names.ANNOTATION_NODEPOOL: f"{pool_ns}/{NODE_POOL}"},
            "finalizers": ["test.agent-forge/hold"],
        },
        "spec": {
            "clusterName": CLUSTER,
            "bootstrap": {"dataSecretName": "bootstrap"},
            "infrastructureRef": {
                "apiVersion": kinds.AGENT_MACHINE.api_version,
                "kind": "AgentMachine",
                "name": infra,
            },
        },
    }


def serial(bios_uuid: str) -> str:
    hex32 = bios_uuid.replace("-", "")
    pairs = [hex32[i : i + 2] for i in range(0, 32, 2)]
    return "VMware-" + " ".join(pairs[:8]) + "-" + " ".join(pairs[8:])


def agent_obj(ns: str, name: str) -> JsonObj:
    return {
        "apiVersion": kinds.AGENT.api_version,
        "kind": "Agent",
        "metadata": {"name": name, "namespace": ns, "labels": {names.LABEL_INFRAENV: INFRA_ENV}},
        "spec": {"approved": False, "role": ""},
    }


SHARED_MAC = "00:50:56:aa:bb:01"
"""The MAC every inventory reports unless told otherwise: MACs repeat across VMs."""


def agent_inventory(bios_uuid: str, hostname: str = "localhost", mac: str = SHARED_MAC) -> JsonObj:
    return {
        "inventory": {
            "hostname": hostname,
            "interfaces": [
                {
                    "macAddress": mac,
                    "flags": [],
                    "ipV4Addresses": [],
                    "ipV6Addresses": [],
                }
            ],
            "systemVendor": {"serialNumber": serial(bios_uuid), "manufacturer": "VMware, Inc."},
        }
    }
