"""The e2e harness's building blocks: operator install, the operator process, world checks.

- `install_operator_rbac(cp)` applies the shipped `config/rbac/*.yaml` (the manifests
  a user deploys, not a rendering of the code) into the control plane and returns the
  operator ServiceAccount's kubeconfig: the operator runs under exactly that least
  privilege, while the test and the actors act as admin.
- `OperatorHarness` is the real operator process (`sim.operator.OperatorProcess`)
  watching the test's two namespaces, with `kill()` (SIGKILL), `restart()` and the
  whole log of every run kept for failure reports; given a `MetricsReader` it reads
  /metrics as Prometheus does (HTTPS, a metrics-reader token).
- `wait_converged(...)` (`Snapshot.converged`) and `vsphere_writes` say, in one
  place, what "the pool has settled at n replicas" and "nothing changed in vSphere"
  mean.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentforge.api import names
from sim.actors import Timings
from sim.actors.vcenter import VmFact
from sim.actors.waiting import consistently, eventually
from sim.controlplane import ControlPlane
from sim.operator import MetricsReader, OperatorProcess
from sim.paths import REPO_ROOT
from sim.vcsim import Vcsim, VcsimControl
from sim.world import Snapshot, World
from sim.world.snapshot import condition_of

__all__ = [
    "E2E_TIMINGS",
    "VSPHERE_WRITES",
    "OperatorHarness",
    "consistently",
    "destroy_vms",
    "eventually",
    "install_operator_rbac",
    "pool_condition_is",
    "vsphere_writes",
    "wait_converged",
]

log = logging.getLogger(__name__)

RBAC_DIR = REPO_ROOT / "config" / "rbac"
E2E_TIMINGS = Timings(tick=0.2, boot=0.4, install_start=0.3, install=1.0, drain=0.3, reclaim=0.5)
CONVERGE_S = 120.0

VSPHERE_WRITES = (
    "CreateVM_Task",
    "CloneVM_Task",
    "ReconfigVM_Task",
    "PowerOnVM_Task",
    "PowerOffVM_Task",
    "Destroy_Task",
    "MakeDirectory",
    "CreateFolder",
    "DeleteDatastoreFile_Task",
    "MoveDatastoreFile_Task",
    "CopyDatastoreFile_Task",
    "AttachTag",
)
"""SOAP methods that change the inventory or a datastore (plus HTTP `PUT /folder`)."""


# --- install ---------------------------------------------------------------------------


def _path(obj: Mapping[str, Any]) -> str:
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    plural = kind.lower() + "s"
    namespace = obj["metadata"].get("namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{plural}/{obj['metadata']['name']}"


def install_operator_rbac(controlplane: ControlPlane) -> Path:
    """Apply `config/rbac` as shipped and return the operator ServiceAccount's kubeconfig."""
    controlplane.create_namespace(names.DEPLOYMENT_NAMESPACE)
    client = controlplane.direct_client()
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj or obj.get("kind") == "Kustomization":
                continue
            client.request(
                "PATCH",
                _path(obj) + "?fieldManager=agentforge-e2e&force=true",
                body=obj,
                content_type="application/apply-patch+yaml",
            )
    return controlplane.serviceaccount_kubeconfig(names.DEPLOYMENT_NAMESPACE, names.SERVICE_ACCOUNT)


# --- the operator process --------------------------------------------------------------


class OperatorHarness:
    """The operator watching one world's namespaces; killable and restartable."""

    def __init__(
        self,
        *,
        kubeconfig: Path,
        namespaces: tuple[str, ...],
        log_path: Path,
        metrics: MetricsReader | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.extra_args = extra_args
        self.log_path = log_path
        self.metrics = metrics
        self.runs = 0
        self.process: OperatorProcess | None = None

    def _args(self) -> list[str]:
        args = ["--max-concurrent-reconciles", "2"]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        return [*args, *self.extra_args]

    async def start(self, *, within: float = 60.0) -> OperatorProcess:
        self.runs += 1
        self.process = OperatorProcess(
            self.kubeconfig,
            *self._args(),
            log_path=self.log_path,
            name=f"operator#{self.runs}",
            metrics=self.metrics,
        ).start()
        await self.process.wait_ready(within=within)
        return self.process

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup, whatever was in flight stays in flight."""
        if self.process is not None:
            self.process.kill()

    async def restart(self, *, within: float = 60.0) -> OperatorProcess:
        """Kill -9 whatever runs, wait for it to be gone, start a fresh process."""
        if self.process is not None and self.process.running():
            self.process.kill()
            await self.process.wait_exit(within=10)
        return await self.start(within=within)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()

    def log_text(self) -> str:
        """Every run's log (the file is appended to across restarts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 20000) -> str:
        return self.log_text()[-chars:]


# --- convergence and vSphere writes ----------------------------------------------------


async def wait_converged(
    world: World, *, pool: str, nodepool: str, replicas: int, within: float = CONVERGE_S
) -> Snapshot:
    key = f"{world.namespace}/{nodepool}"
    return await eventually(
        world.snapshot,
        lambda s: s.converged(pool=pool, nodepool_key=key, replicas=replicas),
        within=within,
        what=f"pool {pool} converged at {replicas} bound replicas",
        interval=0.5,
    )


async def destroy_vms(vcsim: Vcsim, vms: list[VmFact]) -> None:
    """Remove a finished test's VMs from the shared simulator (govc, by moref: names may
    repeat when an operator created a duplicate). A VM already gone is not an error."""
    for vm in vms:
        try:
            await asyncio.to_thread(vcsim.govc, "vm.destroy", f"VirtualMachine:{vm.moref}")
        except RuntimeError as exc:
            log.warning("could not remove VM %s (%s): %s", vm.name, vm.moref, exc)


async def vsphere_writes(control: VcsimControl) -> dict[str, int]:
    """How often each inventory/datastore-changing call was made since the last reset."""
    counters = await control.counters()
    methods = counters.get("methods") or {}
    writes = {m: int(methods.get(m, 0)) for m in VSPHERE_WRITES if methods.get(m)}
    puts = int((counters.get("http") or {}).get("PUT /folder", 0))
    if puts:
        writes["PUT /folder"] = puts
    return writes


def pool_condition_is(
    snap: Snapshot, pool: str, type_: str, status: str, reasons: tuple[str, ...]
) -> bool:
    found = condition_of(snap.pool(pool), type_)
    return found is not None and found.get("status") == status and found.get("reason") in reasons
