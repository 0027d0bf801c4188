"""A HyperShift NodePool as CAPI renders it: Machine + AgentMachine pairs, and their deletion.

`NodePoolDriver.scale(n)` plays the NodePool/MachineSet controllers for one NodePool
`<namespace>/<name>`, in the hosted control plane namespace:

- scale-up creates, per replica, an AgentMachine (v1beta1: nodePool annotation,
  `spec.agentLabelSelector.matchLabels` = the NodePool's labels) reporting
  `Ready=False, reason NoSuitableAgents`, and a Machine (stored as v1beta2:
  `spec.clusterName`, `spec.bootstrap.dataSecretName`, `spec.infrastructureRef`
  naming the AgentMachine) carrying CAPI's finalizer; the AgentMachine is then owned
  by its Machine;
- scale-down deletes the newest Machines first (their finalizer holds them).

`MachineController` plays CAPI's Machine controller for the whole namespace: a
deleted Machine gets `status.phase: Deleting` and a drain start time, is drained for
`timings.drain` seconds, then its AgentMachine is deleted (the CAPI agent provider's
finalizer holds it until the Agent is unbound) and only once that is gone the
Machine's finalizer is removed. A live Machine's phase mirrors its AgentMachine's
readiness (`Provisioning` -> `Running`). Neither ever touches an Agent.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from agentforge.api import kinds, names
from agentforge.kube.client import KubeClient
from sim.actors.base import SIM_PREFIX, Actor, Journal, Timings, condition, now_rfc3339

__all__ = [
    "CLUSTER_NAME_LABEL",
    "MACHINE_FINALIZER",
    "MACHINE_V1BETA2",
    "SEQUENCE",
    "MachineController",
    "NodePoolDriver",
]

MACHINE_V1BETA2 = kinds.Kind("cluster.x-k8s.io", "v1beta2", "Machine", "machines")
MACHINE_FINALIZER = "machine.cluster.x-k8s.io"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
SEQUENCE = f"{SIM_PREFIX}/sequence"


def _sequence(obj: dict[str, Any]) -> int:
    try:
        return int((obj["metadata"].get("annotations") or {}).get(SEQUENCE, "0"))
    except ValueError:
        return 0


class NodePoolDriver:
    """The replicas knob of one NodePool: creates and deletes Machine + AgentMachine pairs."""

    def __init__(
        self,
        *,
        client: KubeClient,
        namespace: str,
        nodepool: str,
        control_plane_namespace: str,
        cluster_name: str,
        labels: dict[str, str],
        journal: Journal,
        machines: MachineController | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.nodepool = nodepool
        self.control_plane_namespace = control_plane_namespace
        self.cluster_name = cluster_name
        self.labels = dict(labels)
        self.journal = journal
        self.machine_controller = machines
        self._sequence = 0

    @property
    def key(self) -> str:
        """The nodePool annotation value: `<namespace>/<name>`."""
        return f"{self.namespace}/{self.nodepool}"

    def note(self, text: str) -> None:
        self.journal.add(f"np/{self.nodepool}", text)

    # --- reads ---------------------------------------------------------------------------

    def _mine(self, obj: dict[str, Any]) -> bool:
        annotations = obj["metadata"].get("annotations") or {}
        return annotations.get(names.ANNOTATION_NODEPOOL) == self.key

    async def machines(self) -> list[dict[str, Any]]:
        """This NodePool's Machines (deleting ones included), oldest first."""
        listed = await self.client.list(MACHINE_V1BETA2, namespace=self.control_plane_namespace)
        return sorted((m for m in listed.items if self._mine(m)), key=_sequence)

    async def agent_machines(self) -> list[dict[str, Any]]:
        listed = await self.client.list(kinds.AGENT_MACHINE, namespace=self.control_plane_namespace)
        return sorted((m for m in listed.items if self._mine(m)), key=_sequence)

    async def replicas(self) -> int:
        """Machines not being deleted: what the NodePool's replica count currently means."""
        return sum(1 for m in await self.machines() if not m["metadata"].get("deletionTimestamp"))

    # --- scale ---------------------------------------------------------------------------

    async def scale(self, replicas: int) -> list[str]:
        """Create or delete Machine + AgentMachine pairs; return the names touched."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        machines = await self.machines()
        self._sequence = max([self._sequence, *(_sequence(m) for m in machines)])
        alive = [m for m in machines if not m["metadata"].get("deletionTimestamp")]
        touched: list[str] = []
        if replicas > len(alive):
            for _ in range(replicas - len(alive)):
                touched.append(await self._create_pair())
        else:
            for machine in reversed(alive[replicas:]):  # newest first
                name = machine["metadata"]["name"]
                await self.client.delete(
                    MACHINE_V1BETA2, namespace=self.control_plane_namespace, name=name
                )
                touched.append(name)
            if touched:
                self.note(f"{self.key}: scaled to {replicas}; deleting Machines {touched}")
        if self.machine_controller is not None:
            self.machine_controller.kick()
        return touched

    async def _create_pair(self) -> str:
        self._sequence += 1
        name = f"{self.nodepool}-{secrets.token_hex(3)}"
        ns = self.control_plane_namespace
        meta = {
            "name": name,
            "namespace": ns,
            "labels": {CLUSTER_NAME_LABEL: self.cluster_name},
            "annotations": {names.ANNOTATION_NODEPOOL: self.key, SEQUENCE: str(self._sequence)},
        }
        await self.client.create(
            kinds.AGENT_MACHINE,
            {
                "apiVersion": kinds.AGENT_MACHINE.api_version,
                "kind": "AgentMachine",
                "metadata": meta,
                "spec": {"agentLabelSelector": {"matchLabels": dict(self.labels)}},
            },
        )
        await self.client.patch_status(
            kinds.AGENT_MACHINE,
            namespace=ns,
            name=name,
            patch={"status": {"ready": False, "conditions": _waiting_conditions()}},
        )
        machine = await self.client.create(
            MACHINE_V1BETA2,
            {
                "apiVersion": MACHINE_V1BETA2.api_version,
                "kind": "Machine",
                "metadata": {**meta, "finalizers": [MACHINE_FINALIZER]},
                "spec": {
                    "clusterName": self.cluster_name,
                    "bootstrap": {"dataSecretName": f"user-data-{self.nodepool}"},
                    "infrastructureRef": {
                        "apiGroup": kinds.AGENT_MACHINE.group,
                        "kind": "AgentMachine",
                        "name": name,
                    },
                },
            },
        )
        await self.client.patch_status(
            MACHINE_V1BETA2, namespace=ns, name=name, patch={"status": {"phase": "Provisioning"}}
        )
        owner = {
            "apiVersion": MACHINE_V1BETA2.api_version,
            "kind": "Machine",
            "name": name,
            "uid": machine["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        await self.client.patch_merge(
            kinds.AGENT_MACHINE,
            namespace=ns,
            name=name,
            patch={"metadata": {"ownerReferences": [owner]}},
        )
        self.note(f"{self.key}: Machine + AgentMachine {name} created, waiting for an Agent")
        return name


class MachineController(Actor):
    """CAPI's Machine controller for the control plane namespace: phases and deletion."""

    name = "machines"

    def __init__(
        self,
        *,
        client: KubeClient,
        control_plane_namespace: str,
        timings: Timings,
        journal: Journal,
    ) -> None:
        super().__init__(timings=timings, journal=journal)
        self.client = client
        self.control_plane_namespace = control_plane_namespace
        self._drain_started: dict[str, float] = {}

    async def step(self) -> None:
        ns = self.control_plane_namespace
        machines = (await self.client.list(MACHINE_V1BETA2, namespace=ns)).items
        listed = await self.client.list(kinds.AGENT_MACHINE, namespace=ns)
        agent_machines = {m["metadata"]["name"]: m for m in listed.items}
        for machine in machines:
            if machine["metadata"].get("deletionTimestamp"):
                await self._progress_deletion(machine, agent_machines)
            else:
                await self._mirror_phase(machine, agent_machines)

    async def _mirror_phase(
        self, machine: dict[str, Any], agent_machines: dict[str, dict[str, Any]]
    ) -> None:
        name = machine["metadata"]["name"]
        am = agent_machines.get(name)
        ready = am is not None and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (am.get("status") or {}).get("conditions") or []
        )
        phase = "Running" if ready else "Provisioning"
        if (machine.get("status") or {}).get("phase") != phase:
            await self.client.patch_status(
                MACHINE_V1BETA2,
                namespace=self.control_plane_namespace,
                name=name,
                patch={"status": {"phase": phase}},
            )
            if ready:
                self.note(f"Machine {name} Running")

    async def _progress_deletion(
        self, machine: dict[str, Any], agent_machines: dict[str, dict[str, Any]]
    ) -> None:
        meta = machine["metadata"]
        name, uid = meta["name"], meta["uid"]
        ns = self.control_plane_namespace
        if MACHINE_FINALIZER not in (meta.get("finalizers") or []):
            return
        if (machine.get("status") or {}).get("phase") != "Deleting":
            await self.client.patch_status(
                MACHINE_V1BETA2,
                namespace=ns,
                name=name,
                patch={
                    "status": {
                        "phase": "Deleting",
                        "deletion": {"nodeDrainStartTime": now_rfc3339()},
                    }
                },
            )
            self._drain_started[uid] = time.monotonic()
            self.note(f"Machine {name} Deleting: draining the node")
            return
        started = self._drain_started.setdefault(uid, time.monotonic())
        if time.monotonic() - started < self.timings.drain:
            return
        am = agent_machines.get(name)
        if am is not None:
            if not am["metadata"].get("deletionTimestamp"):
                await self.client.delete(kinds.AGENT_MACHINE, namespace=ns, name=name)
                self.note(f"Machine {name} drained: AgentMachine {name} deleted")
            return  # the provider's finalizer holds it until the Agent is unbound
        remaining = [f for f in meta.get("finalizers") or [] if f != MACHINE_FINALIZER]
        await self.client.patch_merge(
            MACHINE_V1BETA2,
            namespace=ns,
            name=name,
            patch={
                "metadata": {"finalizers": remaining, "resourceVersion": meta["resourceVersion"]}
            },
        )
        self._drain_started.pop(uid, None)
        self.note(f"Machine {name} deleted")


def _waiting_conditions() -> list[dict[str, str]]:
    now = now_rfc3339()
    return [
        {
            **condition("Ready", False, "NoSuitableAgents", "No suitable Agents available"),
            "lastTransitionTime": now,
        },
        {
            **condition("AgentReserved", False, "NoSuitableAgents", "No suitable Agents available"),
            "lastTransitionTime": now,
        },
    ]
