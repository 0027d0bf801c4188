"""Builders for planner and pool-controller tests: raw objects as the cache holds them.

Every builder returns the raw dict an informer would cache, and `facts(...)` runs the
same extractors the controller uses, so tests exercise extraction too. `apply_plan`
plays the world forward: the Agent patches merged, the pool's labels removed from
the Agents the plan unlabels, the VM records written into the VsphereAgents' status,
deleted VsphereAgents marked as deleting.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from agentforge.api import names
from agentforge.api.fields import format_time
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.planning import planner
from agentforge.reconcilers.planning.snapshot import (
    Claim,
    Claims,
    agent_facts,
    agent_machine_facts,
    infra_env_facts,
    machine_facts,
    vsphere_agent_facts,
)
from agentforge.reconcilers.pool import status as pool_status

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "demo"
CPNS = "clusters-demo"
POOL = "workers"
NODE_POOL = "workers"
INFRA_ENV = "demo"
CLUSTER = "demo"
LABELS = {"customer": "acme"}
WHERE = pool_status.RefNamespaces(agents=NS, machines=CPNS)


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


def uuid(n: int) -> str:
    return f"42{n:06x}-0000-4000-8000-{n:012x}"


def mac(n: int) -> str:
    return f"00:50:56:{(n >> 16) & 0xFF:02x}:{(n >> 8) & 0xFF:02x}:{n & 0xFF:02x}"


def serial(bios_uuid: str) -> str:
    hex32 = bios_uuid.replace("-", "")
    pairs = [hex32[i : i + 2] for i in range(0, 32, 2)]
    return "VMware-" + " ".join(pairs[:8]) + "-" + " ".join(pairs[8:])


def pool_obj(**spec: Any) -> dict[str, Any]:
    agent = {"labels": dict(LABELS), **spec.pop("agent", {})}
    status = spec.pop("status", {})
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgentPool",
        "metadata": {
            "name": spec.pop("name", POOL),
            "namespace": NS,
            "uid": "pool-uid",
            "generation": 1,
            "resourceVersion": "1",
            "finalizers": spec.pop("finalizers", [names.FINALIZER_POOL]),
        },
        "spec": {
            "hostedClusterRef": {"name": CLUSTER},
            "nodePoolRef": {"name": spec.pop("node_pool", NODE_POOL)},
            "infraEnvRef": {"name": INFRA_ENV},
            "controlPlaneNamespace": CPNS,
            "vsphere": {
                "credentialsSecretRef": {"name": "vsphere"},
                "datastoreCluster": "dsc1",
                "isoDatastore": "iso-ds",
                "resourcePool": "cluster/Resources",
                "network": "VM Network",
            },
            "template": {},
            "agent": agent,
            **spec,
        },
        "status": status,
    }


def pool(**spec: Any) -> VsphereAgentPool:
    return VsphereAgentPool.model_validate(pool_obj(**spec))


def agent_machine_obj(
    name: str,
    *,
    waiting: bool = True,
    ready: bool = False,
    agent: str | None = None,
    deleting: bool = False,
    node_pool: str = f"{NS}/{NODE_POOL}",
    pinned: str | None = None,
) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    condition["reason"] = "NoSuitableAgents" if waiting and not ready else "Other"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": CPNS,
        "uid": f"uid-am-{name}",
        "resourceVersion": "1",
        "annotations": {names.ANNOTATION_NODEPOOL: node_pool},
    }
    if deleting:
        meta["deletionTimestamp"] = format_time(ago(minutes=1))
    obj: dict[str, Any] = {
        "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
        "kind": "AgentMachine",
        "metadata": meta,
        "spec": {"agentLabelSelector": {"matchLabels": dict(LABELS)}},
        "status": {"conditions": [condition]},
    }
    if pinned:
        obj["spec"]["agentLabelSelector"]["matchLabels"][names.LABEL_AGENT_MACHINE] = pinned
    if agent:
        obj["status"]["agentRef"] = {"name": agent, "namespace": NS}
    return obj


def machine_obj(name: str, *, deleting: bool = False, infra: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": CPNS,
        "uid": f"uid-machine-{name}",
        "resourceVersion": "1",
        "annotations": {names.ANNOTATION_NODEPOOL: f"{NS}/{NODE_POOL}"},
    }
    if deleting:
        meta["deletionTimestamp"] = format_time(ago(minutes=1))
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": meta,
        "spec": {"infrastructureRef": {"kind": "AgentMachine", "name": infra or name}},
    }


def agent_obj(
    name: str,
    *,
    bios_uuid: str | None = None,
    macs: Iterable[str] = (),
    hostname: str = "",
    spec_hostname: str = "",
    bound_to: str | None = None,
    cluster: str | None = None,
    cluster_namespace: str | None = CPNS,
    bound_in: str | None = None,
    labels: Mapping[str, str] | None = None,
    approved: bool = False,
    role: str = "",
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-agent-{name}",
        "resourceVersion": "1",
        "labels": {names.LABEL_INFRAENV: INFRA_ENV, **(labels or {})},
    }
    if bound_to:
        meta["labels"][names.LABEL_AGENT_MACHINE_REF] = bound_to
        cluster = cluster or CLUSTER
    if bound_in:  # cluster-api-provider-agent's annotation: the AgentMachine's namespace
        meta["annotations"] = {names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: bound_in}
    if deleting:
        meta["deletionTimestamp"] = format_time(ago(minutes=1))
    spec: dict[str, Any] = {"approved": approved, "role": role}
    if spec_hostname:
        spec["hostname"] = spec_hostname
    if cluster:
        ref = {"name": cluster}
        if cluster_namespace is not None:
            ref["namespace"] = cluster_namespace
        spec["clusterDeploymentName"] = ref
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "metadata": meta,
        "spec": spec,
        "status": {
            "inventory": {
                "hostname": hostname,
                "interfaces": [{"macAddress": m} for m in macs],
                "systemVendor": {"serialNumber": serial(bios_uuid) if bios_uuid else "x"},
            }
        },
    }


def vsphere_agent_obj(
    name: str,
    *,
    vm_name: str | None = None,
    bios_uuid: str | None = None,
    mac_address: str | None = None,
    phase: str | None = None,
    reason: str | None = None,
    agent_ref: str | None = None,
    machine_ref: str | None = None,
    transition: datetime | None = None,
    created: datetime | None = None,
    ready_since: datetime | None = None,
    pool_name: str = POOL,
    agent_machine: str | None = "",
    created_for: str = names.CreatedFor.AGENT_MACHINE.value,
    deleting: bool = False,
    creating: bool = False,
    iso_ejected: str | None = None,
) -> dict[str, Any]:
    labels = {names.LABEL_POOL: pool_name, names.LABEL_CREATED_FOR: created_for}
    am = name if agent_machine == "" else agent_machine
    if am:
        labels[names.LABEL_AGENT_MACHINE] = am
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-va-{name}",
        "resourceVersion": "1",
        "creationTimestamp": format_time(created or ago(hours=1)),
        "labels": labels,
        "annotations": {names.ANNOTATION_VM_NAME: vm_name or f"vm-{name}"},
    }
    if deleting:
        meta["deletionTimestamp"] = format_time(ago(minutes=1))
    vm: dict[str, Any] = {"name": vm_name or f"vm-{name}"}
    if bios_uuid:
        vm["biosUUID"] = bios_uuid
    if mac_address:
        vm["macAddress"] = mac_address.replace(":", "-")
    if phase:
        vm["phase"] = phase
        vm["lastTransitionTime"] = format_time(transition or ago(hours=1))
    if reason:
        vm["reason"] = reason
    if agent_ref:
        vm["agentRef"] = {"kind": "Agent", "name": agent_ref, "namespace": NS}
    if machine_ref:
        vm["machineRef"] = {"kind": "Machine", "name": machine_ref, "namespace": CPNS}
    status: dict[str, Any] = {"vm": vm, "conditions": []}
    if ready_since:
        status["conditions"].append(
            {"type": "Ready", "status": "True", "reason": "VMReady", "message": "",
             "lastTransitionTime": format_time(ready_since)}
        )  # fmt: skip
    if iso_ejected:
        status["conditions"].append(
            {"type": "ISOEjected", "status": "False", "reason": iso_ejected, "message": "",
             "lastTransitionTime": format_time(NOW)}
        )  # fmt: skip
    if creating:
        status["creation"] = {"vmName": vm["name"]}
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgent",
        "metadata": meta,
        "spec": {"poolRef": {"name": pool_name}},
        "status": status,
    }


def infra_env_obj(*, url: str | None = "https://example.test/iso") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": []}
    if url:
        status["isoDownloadURL"] = url
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "InfraEnv",
        "metadata": {"name": INFRA_ENV, "namespace": NS, "resourceVersion": "1"},
        "status": status,
    }


class World:
    """Raw objects of one pool's world, turned into a planner snapshot on demand."""

    def __init__(self, **pool_spec: Any) -> None:
        self.pool = pool_obj(**pool_spec)
        self.agent_machines: dict[str, dict[str, Any]] = {}
        self.machines: dict[str, dict[str, Any]] = {}
        self.agents: dict[str, dict[str, Any]] = {}
        self.vsphere_agents: dict[str, dict[str, Any]] = {}
        self.infra_env: dict[str, Any] | None = infra_env_obj()
        self.claims: list[Claim] = []
        self.competing: list[str] = []
        self.now = NOW

    def add(self, *objs: dict[str, Any]) -> World:
        for obj in objs:
            bucket = {
                "AgentMachine": self.agent_machines,
                "Machine": self.machines,
                "Agent": self.agents,
                "VsphereAgent": self.vsphere_agents,
            }[obj["kind"]]
            bucket[obj["metadata"]["name"]] = obj
        return self

    def snapshot(self) -> planner.Snapshot:
        return planner.Snapshot(
            pool=VsphereAgentPool.model_validate(self.pool),
            agent_machines=[agent_machine_facts(o) for o in self.agent_machines.values()],
            machines=[machine_facts(o) for o in self.machines.values()],
            agents=[agent_facts(o) for o in self.agents.values()],
            vsphere_agents=[vsphere_agent_facts(o) for o in self.vsphere_agents.values()],
            now=self.now,
            claims=Claims.of(self.claims),
            infra_env=infra_env_facts(self.infra_env) if self.infra_env else None,
            competing_pools=list(self.competing),
        )

    def plan(self) -> planner.Plan:
        return planner.plan(self.snapshot())

    def apply(self, plan: planner.Plan, *, handovers: bool = False) -> None:
        """The world after the controller applied `plan` (deletions: marked deleting;
        with `handovers`, the hand-overs' selection labels moved too)."""
        for patch in plan.patches:
            merge(self.agents[patch.agent], patch.patch)
        for unlabel in plan.unlabels:
            labels = self.agents[unlabel.agent]["metadata"]["labels"]
            for key in unlabel.labels:
                labels.pop(key, None)
            merge(self.agents[unlabel.agent], {"spec": unlabel.patch["spec"]})
        for record in plan.vms:
            obj = self.vsphere_agents[record.vsphere_agent]
            vm = obj.setdefault("status", {}).setdefault("vm", {})
            pool_status.apply_vm(vm, record, where=WHERE)
            pool_status.apply_handover(obj["status"], record)
        for deletion in plan.deletions:
            meta = self.vsphere_agents[deletion.vsphere_agent]["metadata"]
            meta["deletionTimestamp"] = format_time(self.now)
        for handover in plan.handovers if handovers else ():
            labels = self.vsphere_agents[handover.vsphere_agent]["metadata"]["labels"]
            labels[names.LABEL_AGENT_MACHINE] = handover.selection


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386 merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def by_vm(plan: planner.Plan) -> dict[str, planner.VMRecord]:
    return {r.vsphere_agent: r for r in plan.vms}
