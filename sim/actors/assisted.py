"""Assisted Installer: registers an Agent for each VM that boots an InfraEnv's ISO, installs it.

Each tick reads every VM from vCenter in one query, and the InfraEnvs and Agents of
its namespaces, then:

- Registration: a powered-on VM whose CD-ROM holds `<sha256>.iso`, where sha256 is an
  image the image service has served for an InfraEnv (its current one or an older
  version: as with assisted-service, a host booted from an earlier discovery ISO of an
  InfraEnv that still exists registers with it; a name no image has ever had boots
  nothing the service knows), registers (after `timings.boot`)
  an Agent in the InfraEnv's namespace: named by the host id, label
  `infraenvs.agent-install.openshift.io: <infraenv>`, ownerReference to the InfraEnv,
  `spec.approved=false` (unless the InfraEnv auto-approves), the InfraEnv's
  `agentLabels`, and a `status.inventory` with the VM's SMBIOS serial, MACs, hostname,
  CPUs, memory and disks (`inventory.py`), conditions SpecSynced, Connected,
  RequirementsMet, Validated (True), Installed and Bound (False).
- Installation: a bound (`spec.clusterDeploymentName`), approved Agent of a running VM
  reports `Installed=False/InstallationInProgress` after `timings.install_start`, then
  `Installed=True/InstallationCompleted` after `timings.install` more, with host status
  `installed` or, for a fraction (or named VMs), `added-to-existing-cluster`.
- Reclaim: an Agent unbound after being bound is `Bound=False/Unbinding` while it
  reboots into discovery, then available again (`Bound=False/Unbound`, Installed=False).
- A VM that is gone takes its Agent with it (the host stopped reporting); a powered-off
  VM's Agent is `Connected=False`.

Only Agents this actor registered (annotation `registered-by`) are managed. Rule
checks for the tests (`violations`): a VM deleted while its Agent is bound.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentforge.api import kinds, names
from agentforge.kube import errors
from agentforge.kube.client import KubeClient
from sim.actors.base import (
    SIM_PREFIX,
    Actor,
    Journal,
    Timings,
    condition,
    conditions_differ,
    now_rfc3339,
    set_conditions,
)
from sim.actors.capi import is_bound
from sim.actors.inventory import agent_name, inventory
from sim.actors.isoserver import IsoServer
from sim.actors.vcenter import VcenterReader, VmFact

__all__ = ["REGISTERED_BY", "AssistedInstaller", "HostProgress"]

REGISTERED_BY = f"{SIM_PREFIX}/registered-by"
HOST_UUID = f"{SIM_PREFIX}/host-uuid"
"""The BIOS UUID of the registered host (the actor's own bookkeeping, not the operator's)."""
INSTALLED_STATES = ("installed", "added-to-existing-cluster")


@dataclass(slots=True)
class HostProgress:
    """In-memory clocks of one Agent's life (monotonic seconds)."""

    bound_at: float | None = None
    installing_since: float | None = None
    unbound_at: float | None = None


class AssistedInstaller(Actor):
    name = "assisted"

    def __init__(
        self,
        *,
        client: KubeClient,
        vcenter: VcenterReader,
        iso_server: IsoServer,
        namespaces: tuple[str, ...],
        timings: Timings,
        journal: Journal,
        violations: list[str],
    ) -> None:
        super().__init__(timings=timings, journal=journal)
        self.client = client
        self.vcenter = vcenter
        self.iso_server = iso_server
        self.namespaces = namespaces
        self.violations = violations
        self.added_to_existing: set[str] = set()
        """VM or Agent names whose hosts report `added-to-existing-cluster` (not by fraction)."""
        self.installed_only: set[str] = set()
        """VM or Agent names whose hosts report `installed` (not by fraction)."""
        self.last_vms: list[VmFact] = []
        self._first_seen: dict[str, float] = {}
        self._progress: dict[str, HostProgress] = {}

    async def step(self) -> None:
        vms = await self.vcenter.vms()
        self.last_vms = vms
        # Two VMs may share a BIOS UUID (a duplicate someone created): the running one reports.
        by_uuid = {vm.bios_uuid: vm for vm in sorted(vms, key=lambda vm: vm.powered_on)}
        infraenvs: dict[tuple[str, str], dict[str, Any]] = {}
        agents: list[dict[str, Any]] = []
        for ns in self.namespaces:
            for ie in (await self.client.list(kinds.INFRA_ENV, namespace=ns)).items:
                infraenvs[(ns, ie["metadata"]["name"])] = ie
            agents.extend((await self.client.list(kinds.AGENT, namespace=ns)).items)
        mine = [a for a in agents if (a["metadata"].get("annotations") or {}).get(REGISTERED_BY)]
        await self._register(vms, infraenvs, {_key(a) for a in agents})
        for agent in mine:
            vm = by_uuid.get((agent["metadata"].get("annotations") or {}).get(HOST_UUID, ""))
            if vm is None:
                await self._vanish(agent)
            elif not (agent.get("status") or {}).get("inventory"):  # the first report failed
                await self._report_inventory(
                    agent["metadata"]["namespace"], agent["metadata"]["name"], vm, iso_size=0
                )
            else:
                await self._progress_agent(agent, vm)

    # --- registration --------------------------------------------------------------------

    async def _register(
        self,
        vms: Iterable[VmFact],
        infraenvs: dict[tuple[str, str], dict[str, Any]],
        existing: set[str],
    ) -> None:
        now = time.monotonic()
        seen = set()
        for vm in vms:
            if not vm.powered_on:
                continue
            image = next(
                (i for i in map(self.iso_server.by_sha256, vm.iso_digests) if i is not None), None
            )
            if image is None:
                continue
            infraenv = infraenvs.get((image.namespace, image.infraenv))
            if infraenv is None or infraenv["metadata"].get("deletionTimestamp"):
                continue
            name = agent_name(vm.bios_uuid)
            if f"{image.namespace}/{name}" in existing:
                continue
            seen.add(vm.bios_uuid)
            first = self._first_seen.setdefault(vm.bios_uuid, now)
            if now - first >= self.timings.boot:
                await self._create_agent(vm, infraenv, iso_size=image.size)
        for uuid in set(self._first_seen) - seen:
            del self._first_seen[uuid]

    async def _create_agent(self, vm: VmFact, infraenv: dict[str, Any], *, iso_size: int) -> None:
        ie_meta = infraenv["metadata"]
        ns, name = ie_meta["namespace"], agent_name(vm.bios_uuid)
        spec = infraenv.get("spec") or {}
        labels = {**(spec.get("agentLabels") or {}), names.LABEL_INFRAENV: ie_meta["name"]}
        auto_approve = bool((spec.get("agentApproval") or {}).get("autoApprove"))
        body = {
            "apiVersion": kinds.AGENT.api_version,
            "kind": "Agent",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": {REGISTERED_BY: "assisted-installer", HOST_UUID: vm.bios_uuid},
                "ownerReferences": [
                    {
                        "apiVersion": kinds.INFRA_ENV.api_version,
                        "kind": "InfraEnv",
                        "name": ie_meta["name"],
                        "uid": ie_meta["uid"],
                    }
                ],
            },
            "spec": {"approved": auto_approve, "role": "auto-assign"},
        }
        try:
            await self.client.create(kinds.AGENT, body)
        except errors.AlreadyExists:
            return
        await self._report_inventory(ns, name, vm, iso_size=iso_size)
        self.note(f"VM {vm.name} booted the ISO of {ie_meta['name']}: Agent {name[:8]} registered")

    async def _report_inventory(self, ns: str, name: str, vm: VmFact, *, iso_size: int) -> None:
        now = now_rfc3339()
        status = {
            "inventory": inventory(vm, report_time=now, iso_size=iso_size),
            "role": "auto-assign",
            "bootstrap": False,
            "conditions": set_conditions(None, _registered_conditions(), now=now),
            "debugInfo": {"state": "known-unbound", "stateInfo": "Host is ready to be bound"},
            "progress": {},
        }
        await self.client.patch_status(
            kinds.AGENT, namespace=ns, name=name, patch={"status": status}
        )

    # --- life of a registered Agent ------------------------------------------------------

    async def _vanish(self, agent: dict[str, Any]) -> None:
        meta = agent["metadata"]
        if is_bound(agent):
            bound_to = (meta.get("labels") or {}).get(names.LABEL_AGENT_MACHINE_REF)
            self.violations.append(
                f"the VM of Agent {meta['namespace']}/{meta['name']} was deleted while the "
                f"Agent was bound to {bound_to}"
            )
            self.note(f"VIOLATION: VM of bound Agent {meta['name']} deleted")
        if meta.get("deletionTimestamp"):
            return
        try:
            await self.client.delete(kinds.AGENT, namespace=meta["namespace"], name=meta["name"])
        except errors.NotFound:
            return
        self._progress.pop(meta["uid"], None)
        self.note(f"Agent {meta['name'][:8]} stopped reporting (its VM is gone): deleted")

    async def _progress_agent(self, agent: dict[str, Any], vm: VmFact) -> None:
        meta = agent["metadata"]
        progress = self._progress.setdefault(meta["uid"], HostProgress())
        now = time.monotonic()
        bound = is_bound(agent)
        approved = bool((agent.get("spec") or {}).get("approved"))
        if bound and progress.bound_at is None:
            progress.bound_at, progress.unbound_at = now, None
        elif not bound and progress.bound_at is not None:
            progress.bound_at, progress.installing_since, progress.unbound_at = None, None, now
        status = agent.get("status") or {}
        wanted, state, stage = self._desired(
            vm, meta["name"], progress, now, bound=bound, approved=approved
        )
        current_stage = (status.get("progress") or {}).get("currentStage", "")
        if (
            not conditions_differ(status.get("conditions"), wanted)
            and (status.get("debugInfo") or {}).get("state") == state
            and current_stage == stage
        ):
            return
        stamp = now_rfc3339()
        patch = {
            "status": {
                "conditions": set_conditions(status.get("conditions"), wanted, now=stamp),
                "debugInfo": {"state": state, "stateInfo": _STATE_INFO.get(state, state)},
                "progress": {"currentStage": stage, "stageUpdateTime": stamp}
                if stage
                else {"currentStage": None, "stageUpdateTime": None},
            }
        }
        await self.client.patch_status(
            kinds.AGENT, namespace=meta["namespace"], name=meta["name"], patch=patch
        )
        if state != (status.get("debugInfo") or {}).get("state"):
            self.note(f"Agent {meta['name'][:8]} ({vm.name}): {state}")

    def _desired(
        self,
        vm: VmFact,
        agent: str,
        progress: HostProgress,
        now: float,
        *,
        bound: bool,
        approved: bool,
    ) -> tuple[list[dict[str, str]], str, str]:
        """Conditions, host state and install stage for where the host is now."""
        t = self.timings
        base = _registered_conditions()[:4]
        if not vm.powered_on:
            base[1] = condition("Connected", False, "AgentIsDisconnected", "host stopped reporting")
        if bound and progress.bound_at is not None:
            bound_cond = condition("Bound", True, "Bound", "The agent is bound to a cluster")
            can_start = approved and vm.powered_on and now - progress.bound_at >= t.install_start
            if progress.installing_since is None and can_start:
                progress.installing_since = now
            if progress.installing_since is None:
                not_started = condition("Installed", False, "InstallationNotStarted", "")
                return [*base, not_started, bound_cond], "binding", ""
            if now - progress.installing_since < t.install:
                installing = condition(
                    "Installed", False, "InstallationInProgress", "Installation in progress"
                )
                return [*base, installing, bound_cond], "installing", "Writing image to disk"
            state = self._installed_state(vm, agent)
            done = condition("Installed", True, "InstallationCompleted", f"host is {state}")
            return [*base, done, bound_cond], state, "Done"
        reclaiming = progress.unbound_at is not None and now - progress.unbound_at < t.reclaim
        if reclaiming:
            unbinding = condition(
                "Bound", False, "Unbinding", "reclaiming: rebooting into discovery"
            )
            not_started = condition("Installed", False, "InstallationNotStarted", "")
            return [*base, not_started, unbinding], "unbinding", ""
        return [*base, *_registered_conditions()[4:]], "known-unbound", ""

    def _installed_state(self, vm: VmFact, agent: str) -> str:
        if {vm.name, agent} & self.added_to_existing:
            return "added-to-existing-cluster"
        if {vm.name, agent} & self.installed_only:
            return "installed"
        bucket = int(hashlib.sha256(vm.bios_uuid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return (
            "added-to-existing-cluster"
            if bucket < self.timings.added_to_existing_cluster
            else "installed"
        )


_STATE_INFO = {
    "known-unbound": "Host is ready to be bound",
    "binding": "Host is bound to a cluster, waiting for installation",
    "installing": "Installation is in progress",
    "installed": "Done",
    "added-to-existing-cluster": "Host has been added to the existing cluster",
    "unbinding": "Host is rebooting into discovery",
}


def _registered_conditions() -> list[dict[str, str]]:
    return [
        condition("SpecSynced", True, "SyncOK", "The Spec has been successfully applied"),
        condition("Connected", True, "AgentIsConnected", "The agent's connection is healthy"),
        condition(
            "RequirementsMet", True, "AgentIsReady", "The agent is ready to begin installing"
        ),
        condition("Validated", True, "ValidationsPassing", "The agent's validations are passing"),
        condition("Installed", False, "InstallationNotStarted", "Installation not started"),
        condition("Bound", False, "Unbound", "The agent is not bound to any cluster"),
    ]


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
