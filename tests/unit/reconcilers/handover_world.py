"""A small world for the hand-over properties: CAPI, the VMs and the operator, played forward.

`Model` keeps raw objects as the cache would (through `planner_support.World`) and
plays each party by hand, one step at a time:

* CAPI creates AgentMachines (each with its Machine; a name may come back, and then
  the AgentMachine and its Machine have new UIDs, as the API server gives them),
  deletes them at once or after marking the Machine deleting (a
  MachineHealthCheck remediation, a rollout), unbinds their Agents first, and binds
  an AgentMachine that waits to an approved, unbound Agent carrying every label of
  its selector (the pool labels, and the selection label once pinned);
* `scaleup` pins the selection label into waiting AgentMachines;
* the `vm` controller gives a VsphereAgent its VM (a BIOS UUID) and removes deleted
  VsphereAgents with their unbound Agents (a bound one holding a VM is a violation);
* the Assisted Installer registers an Agent for a VM;
* the `pool` controller runs the planner and applies the plan (Agent patches, the
  pool's labels removed from Agents before their VMs' clean-up, VM records and
  `status.handover`, deletions, hand-overs, creations).

Time only moves when told (`tick`). `removed_at` records when AgentMachines started to
go away, for the bound on spare VMs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agentforge.api import names
from agentforge.api.fields import format_time
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.planning import naming, planner
from agentforge.reconcilers.planning.snapshot import agent_facts
from agentforge.reconcilers.pool import status as pool_status
from agentforge.reconcilers.pool import vsphere_agent_create
from tests.unit.reconcilers.planner_support import (
    CLUSTER,
    CPNS,
    LABELS,
    NS,
    WHERE,
    World,
    agent_machine_obj,
    agent_obj,
    machine_obj,
    merge,
    uuid,
)

JsonObj = dict[str, Any]


@dataclass
class Model:
    policy: str = "Delete"
    wanted_spares: int = 0
    """`spec.spares`."""
    world: World = field(init=False)
    removed_at: list[datetime] = field(default_factory=list)
    """When something happened that frees a VM: an AgentMachine started to go away, an
    AgentMachine was bound to the Agent of a VM made for another, an Orphaned VM's
    Agent registered after all."""
    noticed_at: list[datetime] = field(default_factory=list)
    """... and when the planner first ran after each (a spare's clock starts then)."""
    violations: list[str] = field(default_factory=list)
    plans: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        extra = {"spares": self.wanted_spares} if self.wanted_spares else {}
        self.world = World(cleanupPolicy=self.policy, **extra)

    @property
    def now(self) -> datetime:
        return self.world.now

    @property
    def pool(self) -> VsphereAgentPool:
        return VsphereAgentPool.model_validate(self.world.pool)

    # --- CAPI -------------------------------------------------------------------------------

    def live_agent_machines(self) -> list[str]:
        return sorted(
            n
            for n, am in self.world.agent_machines.items()
            if not am["metadata"].get("deletionTimestamp")
            and not self._machine(n).get("metadata", {}).get("deletionTimestamp")
        )

    def _machine(self, am: str) -> JsonObj:
        return self.world.machines.get(f"m-{am}", {})

    def create_agent_machine(self, name: str | None = None, *, pinned: bool = True) -> str:
        n = next(self._ids)
        name = name or f"am-{n}"
        am = agent_machine_obj(name)
        am["metadata"]["uid"] = f"uid-{name}-{n}"
        # created in this order (the planner serves the oldest waiting AgentMachine first)
        am["metadata"]["creationTimestamp"] = format_time(self.now + timedelta(seconds=n))
        if pinned:
            self.pin_one(am)
        machine = machine_obj(f"m-{name}", infra=name)
        # a re-created namesake is a new object: the API server gives it a new UID
        machine["metadata"]["uid"] = f"uid-machine-m-{name}-{n}"
        self.world.add(am, machine)
        return name

    def delete_agent_machine(self, name: str, *, via_machine: bool) -> None:
        """CAPI takes it away: at once, or first its Machine (remediation, rollout)."""
        if name not in self.world.agent_machines:
            return
        self.removed_at.append(self.now)
        machine = self._machine(name)
        if via_machine and machine:
            machine["metadata"]["deletionTimestamp"] = format_time(self.now)
            return
        self._remove(name)

    def finish_deletions(self) -> None:
        for name in list(self.world.agent_machines):
            if self._machine(name).get("metadata", {}).get("deletionTimestamp"):
                self._remove(name)

    def _remove(self, name: str) -> None:
        for agent in self.world.agents.values():
            labels = agent["metadata"]["labels"]
            if labels.get(names.LABEL_AGENT_MACHINE_REF) == name:
                del labels[names.LABEL_AGENT_MACHINE_REF]
                agent["metadata"].pop("annotations", None)
                agent["spec"].pop("clusterDeploymentName", None)
        del self.world.agent_machines[name]
        self.world.machines.pop(f"m-{name}", None)

    def pin(self) -> None:
        for am in self.world.agent_machines.values():
            self.pin_one(am)

    @staticmethod
    def pin_one(am: JsonObj) -> None:
        selector = am["spec"]["agentLabelSelector"]["matchLabels"]
        selector[names.LABEL_AGENT_MACHINE] = am["metadata"]["name"]

    def bind(self) -> None:
        """CAPI: each waiting AgentMachine, oldest first, takes the first Agent it selects."""
        ams = sorted(
            self.world.agent_machines.values(), key=lambda a: a["metadata"]["creationTimestamp"]
        )
        for am in ams:
            status = am["status"]
            if am["metadata"].get("deletionTimestamp") or status.get("agentRef"):
                continue
            selector = am["spec"]["agentLabelSelector"]["matchLabels"]
            for agent in sorted(self.world.agents.values(), key=lambda a: a["metadata"]["name"]):
                facts = agent_facts(agent)
                labels = agent["metadata"]["labels"]
                if facts.bound or facts.deleting or not facts.approved:
                    continue
                if any(labels.get(k) != v for k, v in selector.items()):
                    continue
                name = am["metadata"]["name"]
                if labels.get(names.LABEL_AGENT_MACHINE, name) != name:
                    self.removed_at.append(self.now)  # it takes another AgentMachine's VM
                labels[names.LABEL_AGENT_MACHINE_REF] = name
                agent["metadata"]["annotations"] = {
                    names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: CPNS
                }
                agent["spec"]["clusterDeploymentName"] = {"name": CLUSTER, "namespace": CPNS}
                status["agentRef"] = {"name": agent["metadata"]["name"], "namespace": NS}
                status["conditions"] = [{"type": "Ready", "status": "True", "reason": "Bound"}]
                break

    # --- the vm controller and the Assisted Installer ---------------------------------------

    def live_vsphere_agents(self) -> list[JsonObj]:
        return [
            va
            for va in self.world.vsphere_agents.values()
            if not va["metadata"].get("deletionTimestamp")
        ]

    def progress(self, index: int) -> None:
        """The next step of one VM: created (its BIOS UUID recorded), then discovered."""
        live = sorted(self.live_vsphere_agents(), key=lambda v: v["metadata"]["name"])
        if not live:
            return
        va = live[index % len(live)]
        vm = va["status"].setdefault("vm", {})
        n = int(va["metadata"]["uid"].rsplit("-", 1)[1])
        if not vm.get("biosUUID"):
            vm["biosUUID"] = uuid(n)
            va["status"]["conditions"] = [
                {"type": "Ready", "status": "True", "reason": "VMReady",
                 "lastTransitionTime": format_time(self.now)}
            ]  # fmt: skip
        elif not any(agent_facts(a).bios_uuid == uuid(n) for a in self.world.agents.values()):
            if vm.get("phase") == "Orphaned":
                self.removed_at.append(self.now)  # discovery came late: the VM is back
            self.world.add(agent_obj(f"agent-{n:04d}", bios_uuid=uuid(n)))

    def progress_all(self) -> None:
        for i in range(len(self.live_vsphere_agents())):
            self.progress(i)
            self.progress(i)

    def finalize(self) -> None:
        """The vm controller: deleted VsphereAgents go, with their VM's unbound Agents."""
        for name, va in list(self.world.vsphere_agents.items()):
            if not va["metadata"].get("deletionTimestamp"):
                continue
            bios_uuid = (va["status"].get("vm") or {}).get("biosUUID")
            tied = [
                a
                for a in self.world.agents.values()
                if bios_uuid and agent_facts(a).bios_uuid == bios_uuid
            ]
            if any(agent_facts(a).bound for a in tied):
                self.violations.append(f"VsphereAgent {name} deleted while its Agent is bound")
                continue
            for agent in tied:
                del self.world.agents[agent["metadata"]["name"]]
            del self.world.vsphere_agents[name]

    # --- the pool controller ---------------------------------------------------------------

    def plan(self) -> planner.Plan:
        plan = self.world.plan()
        self.plans += 1
        self.noticed_at += [self.now] * (len(self.removed_at) - len(self.noticed_at))
        uuids = {
            r.vsphere_agent: (
                self.world.vsphere_agents[r.vsphere_agent]["status"].get("vm") or {}
            ).get("biosUUID")
            for r in plan.vms
        }
        for handover in plan.handovers:
            bound = [
                a
                for a in self.world.agents.values()
                if agent_facts(a).bios_uuid == uuids.get(handover.vsphere_agent)
                and agent_facts(a).bound
            ]
            if bound:
                self.violations.append(f"{handover.vsphere_agent} handed over with a bound Agent")
        for patch in plan.patches:
            merge(self.world.agents[patch.agent], patch.patch)
        for unlabel in plan.unlabels:  # its version precondition holds: nothing ran between
            labels = self.world.agents[unlabel.agent]["metadata"]["labels"]
            for key in unlabel.labels:
                del labels[key]
        for record in plan.vms:
            status = self.world.vsphere_agents[record.vsphere_agent].setdefault("status", {})
            pool_status.apply_vm(status.setdefault("vm", {}), record, where=WHERE)
            pool_status.apply_handover(status, record)
        for deletion in plan.deletions:
            meta = self.world.vsphere_agents[deletion.vsphere_agent]["metadata"]
            meta["deletionTimestamp"] = format_time(self.now)
        for handover in plan.handovers:
            labels = self.world.vsphere_agents[handover.vsphere_agent]["metadata"]["labels"]
            labels[names.LABEL_AGENT_MACHINE] = handover.selection
        for creation in plan.creations:
            self._create(creation)
        for name in plan.spare_creations:
            self._create_spare(name)
        return plan

    def _create_spare(self, name: str) -> None:
        if name in self.world.vsphere_agents:
            self.violations.append(f"warm spare {name} planned under a name that is taken")
            return
        body = vsphere_agent_create.vsphere_agent_object(
            pool=self.pool,
            name=name,
            selection=naming.spare_selection(vsphere_agent=name),
            created_for=names.CreatedFor.SPARE,
        )
        meta = body["metadata"]
        meta["uid"] = f"uid-va-{next(self._ids)}"
        meta["resourceVersion"] = "1"
        meta["creationTimestamp"] = format_time(self.now)
        body["status"] = {}
        self.world.add(body)

    def _create(self, creation: planner.Creation) -> None:
        pool = self.pool
        for name in vsphere_agent_create.candidate_names(
            namespace=NS, pool=pool.metadata.name, agent_machine=creation.agent_machine,
            uid=creation.uid,
        ):  # fmt: skip
            if name in self.world.vsphere_agents:
                continue
            body = vsphere_agent_create.vsphere_agent_object(
                pool=pool, name=name, selection=creation.selection
            )
            meta = body["metadata"]
            meta["uid"] = f"uid-va-{next(self._ids)}"
            meta["resourceVersion"] = "1"
            meta["creationTimestamp"] = format_time(self.now)
            body["status"] = {}
            self.world.add(body)
            return
        self.violations.append(f"no name left for {creation.agent_machine}")

    def tick(self, minutes: float) -> None:
        self.world.now = self.world.now + timedelta(minutes=minutes)

    # --- what the properties look at ------------------------------------------------------

    def warm_spares(self) -> list[JsonObj]:
        """Live warm spares: their selection label is a spare value."""
        return [
            va
            for va in self.live_vsphere_agents()
            if naming.is_spare_selection(va["metadata"]["labels"].get(names.LABEL_AGENT_MACHINE))
        ]

    def spares(self) -> list[JsonObj]:
        return [
            va
            for va in self.live_vsphere_agents()
            if (va["status"].get("vm") or {}).get("phase") == "Released"
            and va["status"].get("handover")
        ]


__all__ = ["LABELS", "Model"]
