"""The pool planner: one snapshot of a pool's world in, everything to do about it out.

Given the pool, its AgentMachines and Machines, the InfraEnv's Agents, the pool's
VsphereAgents, other pools' claims and `now`, `plan` decides (DOMAIN.md section 3,
made precise in docs/design/0002):

* which Agent is which VM (`matching`), never one claimed by another pool;
* each VM's phase (`phases`): Provisioning, Available, Bound, Released, Orphaned;
* the metadata patches that prepare an Available VM's Agent (pool labels, the
  nodepool discriminator, role label, `spec.role`, `spec.hostname` = VM name, the
  selection label, `spec.approved`), only the fields that differ;
* clean-up under `cleanupPolicy: Delete` only, never of a VM whose Agent is bound:
  Released VMs whose Machine is gone, Orphaned VMs 30 minutes after they became
  orphans, and, when no AgentMachine waits or lacks an Agent, Available VMs whose
  AgentMachine is gone. Nothing is cleaned up while AgentMachines match two pools.
  "Whose Agent is bound" does not trust the bookkeeping: besides the matched Agent,
  any bound Agent of the snapshot that identifies the VM (its BIOS UUID, or its MAC
  with no BIOS UUID saying otherwise; claimed or excluded ones included) defers it;
* counts, planned actions, the pool conditions it can decide, and when to look
  again (the earliest orphan deadline).

Deliberate differences from the Go operator: the discovery clock starts when the VM
exists (not when the VsphereAgent was created, so a slow vCenter does not orphan a
VM before it booted); a Released VM keeps its machineRef so a later Machine
deletion is noticed; clean-up waits for the Machine to be gone (never while CAPI's
deletion hooks run) and pauses on ambiguous pools; `plannedActions` is capped at
`MAX_PLANNED_ACTIONS` (a burst of thousands of Agents must not bloat the status).

Pure (import-linter enforces it): no I/O, no clock; O(n log n) in Agents + VMs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Final

from agentforge.api import conditions as api_conditions
from agentforge.api import names
from agentforge.api.conditions import ISOEjectedReason, PoolConditionType
from agentforge.api.meta import NamespacedName
from agentforge.api.pool import PlannedActionType, VsphereAgentPool
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers import demand as demand_
from agentforge.reconcilers import matching, phases, pool_conditions
from agentforge.reconcilers.demand import Counts
from agentforge.reconcilers.phases import ORPHAN_GRACE, Ref, VMRecord
from agentforge.reconcilers.pool_conditions import ConditionDecision, Observed
from agentforge.reconcilers.preparation import (
    AgentPatch,
    Preparation,
    desired_labels,
    discriminator,
)
from agentforge.reconcilers.snapshot import (
    AgentFacts,
    AgentMachineFacts,
    Claims,
    InfraEnvFacts,
    MachineFacts,
    VsphereAgentFacts,
    identifies,
)

__all__ = [
    "MAX_PLANNED_ACTIONS",
    "ORPHAN_GRACE",
    "Action",
    "AgentPatch",
    "Deferral",
    "Deletion",
    "Plan",
    "Ref",
    "Snapshot",
    "VMRecord",
    "desired_labels",
    "discriminator",
    "plan",
]

MAX_PLANNED_ACTIONS: Final = 100
"""`status.plannedActions` lists at most this many actions (the counts say the rest)."""

_PENDING: Final = frozenset({VMPhase.PROVISIONING, VMPhase.AVAILABLE})
_CLEANUP_CANDIDATES: Final = frozenset({VMPhase.RELEASED, VMPhase.ORPHANED, VMPhase.AVAILABLE})
_AVAILABLE: Final = VMPhase.AVAILABLE
"""Bound once: an Enum member lookup is slow on Python 3.11, and this one runs per VM."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    pool: VsphereAgentPool
    agent_machines: Sequence[AgentMachineFacts]
    machines: Sequence[MachineFacts]
    agents: Sequence[AgentFacts]
    """The Agents of the pool's InfraEnv."""
    vsphere_agents: Sequence[VsphereAgentFacts]
    """All VsphereAgents of the pool, deleting ones included."""
    now: datetime
    claims: Claims = field(default_factory=Claims)
    infra_env: InfraEnvFacts | None = None
    competing_pools: Sequence[str] = ()
    """Other pools whose AgentMachines are this pool's (an ambiguous configuration)."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete a VsphereAgent; the `vm` controller then removes its VM and the Agent."""

    vsphere_agent: str
    uid: str
    vm: str
    agent: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Deferral:
    """A clean-up that is due but must wait (reported as a Noop action)."""

    vm: str
    agent: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Action:
    type: PlannedActionType
    name: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    counts: Counts
    vms: tuple[VMRecord, ...]
    patches: tuple[AgentPatch, ...]
    deletions: tuple[Deletion, ...]
    deferrals: tuple[Deferral, ...]
    actions: tuple[Action, ...]
    conditions: tuple[ConditionDecision, ...]
    iso_ejections: Mapping[ISOEjectedReason, int]
    wake_at: datetime | None

    @property
    def changed_vms(self) -> tuple[VMRecord, ...]:
        return tuple(vm for vm in self.vms if vm.changed)


def _cleanup_reason(
    record: VMRecord, va: VsphereAgentFacts, demand: demand_.Demand, ctx: phases.PhaseContext
) -> str | None:
    """Why this VM should go under `cleanupPolicy: Delete`, or None."""
    if record.phase is VMPhase.RELEASED and record.reason is VMReason.MACHINE_DELETED:
        machine = f" {record.machine.name}" if record.machine else ""
        return f"its Machine{machine} was deleted"
    if record.phase is VMPhase.ORPHANED:
        due = record.last_transition + phases.ORPHAN_GRACE
        if ctx.now_exact < due:
            ctx.wake.append(due)
            return None
        if record.reason is VMReason.DISCOVERY_TIMEOUT:
            return "no Agent registered for it within the discovery timeout"
        return "its Agent vanished and did not come back"
    if (
        record.phase is VMPhase.AVAILABLE
        and demand.quiet
        and not va.adopted
        and va.agent_machine
        and va.agent_machine not in demand.present
    ):
        return f"surplus: AgentMachine {va.agent_machine} is gone and no AgentMachine waits"
    return None


def _bound_blocker(agent: AgentFacts) -> str:
    if agent.agent_machine_ref:
        return f"Agent {agent.name} is still bound to AgentMachine {agent.agent_machine_ref}"
    return f"Agent {agent.name} is still assigned to ClusterDeployment {agent.cluster_deployment}"


class _BoundAgents:
    """The snapshot's bound Agents by BIOS UUID and MAC, built on first use (clean-up
    is rare; a pool in steady state never pays for it)."""

    def __init__(self, agents: Sequence[AgentFacts]) -> None:
        self._agents = agents
        self._by_uuid: dict[str, list[AgentFacts]] | None = None
        self._by_mac: dict[str, list[AgentFacts]] = {}

    def _build(self) -> dict[str, list[AgentFacts]]:
        by_uuid: dict[str, list[AgentFacts]] = {}
        for agent in sorted(self._agents, key=attrgetter("name")):
            if not agent.bound:
                continue
            if agent.bios_uuid:
                by_uuid.setdefault(agent.bios_uuid, []).append(agent)
            for mac in agent.macs:
                self._by_mac.setdefault(mac, []).append(agent)
        return by_uuid

    def identifying(self, va: VsphereAgentFacts) -> AgentFacts | None:
        """A bound Agent that is this VM by identity, whatever matched or was recorded."""
        if not (va.bios_uuid or va.mac):
            return None
        if self._by_uuid is None:
            self._by_uuid = self._build()
        if va.bios_uuid and va.bios_uuid in self._by_uuid:
            return self._by_uuid[va.bios_uuid][0]
        for agent in self._by_mac.get(va.mac or "", ()):
            if identifies(bios_uuid=va.bios_uuid, mac=va.mac, agent=agent):
                return agent
        return None


def _observed(pool: VsphereAgentPool, type_: PoolConditionType) -> Observed | None:
    found = api_conditions.find_condition(pool.status.conditions, type_)
    return Observed(found.status, found.reason, found.message) if found else None


def plan(snapshot: Snapshot) -> Plan:
    pool = snapshot.pool
    machines = {m.name: m for m in snapshot.machines}
    ctx = phases.PhaseContext(
        now_exact=snapshot.now,
        now=snapshot.now.replace(microsecond=0),
        control_plane_namespace=pool.spec.control_plane_namespace,
        machines=machines,
        machine_of_am={
            m.infrastructure_name: m for m in snapshot.machines if m.infrastructure_name
        },
    )
    demand = demand_.demand(agent_machines=snapshot.agent_machines, machines=snapshot.machines)
    eligible = matching.eligible(
        snapshot.agents,
        hosted_cluster=NamespacedName(
            pool.spec.control_plane_namespace, pool.spec.hosted_cluster_ref.name
        ),
        discriminator=discriminator(pool),
        claims=snapshot.claims,
    )
    # one sort serves matching and the order of `Plan.vms`
    ordered = matching.in_vm_order(snapshot.vsphere_agents)
    matches, _ = matching.assign(ordered, eligible)

    records: list[VMRecord] = []
    patches: list[AgentPatch] = []
    deletions: list[Deletion] = []
    deferrals: list[Deferral] = []
    retiring: list[VsphereAgentFacts] = []
    ejections: dict[ISOEjectedReason, int] = {}
    pending = 0
    cleanup = pool.cleanup_enabled
    # an Available VM is surplus only while demand is quiet (`_cleanup_reason`)
    candidates = _CLEANUP_CANDIDATES if demand.quiet else _CLEANUP_CANDIDATES - {_AVAILABLE}
    bound_agents = _BoundAgents(snapshot.agents)
    preparation = Preparation.of(pool)
    for va in ordered:
        if va.deleting:
            retiring.append(va)
            continue
        if va.iso_ejected is not None:
            ejections[va.iso_ejected] = ejections.get(va.iso_ejected, 0) + 1
        agent = matches.get(va.name)
        record = phases.record(va, agent, ctx)
        records.append(record)
        phase = record.phase
        if phase in _PENDING:
            pending += 1
        if phase is _AVAILABLE and agent is not None and not agent.deleting:
            patch = preparation.patch(va, agent)
            if patch is not None:
                patches.append(patch)
        if not cleanup or phase not in candidates:
            continue
        reason = _cleanup_reason(record, va, demand, ctx)
        if reason is None:
            continue
        if snapshot.competing_pools:
            deferrals.append(
                Deferral(
                    record.name,
                    record.agent.name if record.agent else None,
                    f"{reason}; clean-up paused while AgentMachines match several pools",
                )
            )
        elif agent is not None and agent.bound:
            deferrals.append(
                Deferral(record.name, agent.name, f"{reason}, but {_bound_blocker(agent)}")
            )
        elif (holder := bound_agents.identifying(va)) is not None:
            deferrals.append(
                Deferral(
                    record.name,
                    holder.name,
                    f"{reason}, but {_bound_blocker(holder)} and reports this VM's "
                    f"{'BIOS UUID' if va.bios_uuid and holder.bios_uuid else 'MAC'}",
                )
            )
        else:
            deletions.append(
                Deletion(va.name, va.uid, record.name, agent.name if agent else None, reason)
            )

    counts = _counts(snapshot, eligible, matches, retiring=retiring, pending=pending, demand=demand)
    decided = (
        pool_conditions.demand_found(
            pool=pool, agent_machines=demand.agent_machines, competing=snapshot.competing_pools
        ),
        pool_conditions.infra_env_available(pool=pool, infra_env=snapshot.infra_env),
        pool_conditions.capacity_satisfied(counts=counts),
    )
    ready = pool_conditions.ready(
        decided=decided,
        vsphere=_observed(pool, PoolConditionType.VSPHERE_READY),
        iso=_observed(pool, PoolConditionType.ISO_READY),
    )
    patches.sort(key=attrgetter("agent"))
    return Plan(
        counts=counts,
        vms=tuple(records),
        patches=tuple(patches),
        deletions=tuple(deletions),
        deferrals=tuple(deferrals),
        actions=_actions(counts, patches, deletions, deferrals),
        conditions=(*decided, ready),
        iso_ejections=ejections,
        wake_at=min(ctx.wake) if ctx.wake else None,
    )


def _counts(
    snapshot: Snapshot,
    eligible: Sequence[AgentFacts],
    matches: Mapping[str, AgentFacts],
    *,
    retiring: Sequence[VsphereAgentFacts],
    pending: int,
    demand: demand_.Demand,
) -> Counts:
    """The counts; `retiring` are the deleting VsphereAgents, `pending` the owned VMs
    Provisioning or Available."""
    # an Agent matched to a deleting VM is held, not counted; one matched to a live VM
    # is owned (an Agent matches at most one VM)
    held = {agent.name for va in retiring if (agent := matches.get(va.name)) is not None}
    matched = {agent.name for agent in matches.values()}
    wanted = [
        (k, v)
        for k, v in snapshot.pool.spec.agent.labels.items()
        if k not in (names.LABEL_NODEPOOL, names.LABEL_NODEPOOL_ROLE)
    ]
    bound = available = 0
    for agent in eligible:
        name = agent.name
        if name in held:
            continue
        if name in matched or (
            not agent.deleting and all(agent.labels.get(k) == v for k, v in wanted)
        ):
            if agent.bound:
                bound += 1
            else:
                available += 1
    return demand_.counts(demand=demand, bound=bound, available=available, pending=pending)


def _actions(
    counts: Counts,
    patches: Sequence[AgentPatch],
    deletions: Sequence[Deletion],
    deferrals: Sequence[Deferral],
) -> tuple[Action, ...]:
    """The planned actions, in a fixed order, at most `MAX_PLANNED_ACTIONS` of them."""
    return tuple(
        itertools.islice(_all_actions(counts, patches, deletions, deferrals), MAX_PLANNED_ACTIONS)
    )


def _all_actions(
    counts: Counts,
    patches: Sequence[AgentPatch],
    deletions: Sequence[Deletion],
    deferrals: Sequence[Deferral],
) -> Iterator[Action]:
    if counts.demand_deficit:
        yield Action(
            PlannedActionType.DEMAND_DEFICIT,
            None,
            f"{counts.agent_machines_without_agent} AgentMachine(s) lack an Agent and "
            f"{counts.pending_owned_vms} owned VM(s) are pending: "
            f"{counts.demand_deficit} more VM(s) needed",
        )
    for p in patches:
        fields = sorted({*p.patch.get("spec", {}), *(("labels",) if "metadata" in p.patch else ())})
        yield Action(
            PlannedActionType.PATCH_AGENT,
            p.agent,
            f"prepare the Agent of VM {p.vm}: set {', '.join(fields)}",
        )
    for d in deletions:
        yield Action(PlannedActionType.DELETE_VM, d.vm, d.reason)
    for d in deletions:
        if d.agent:
            yield Action(
                PlannedActionType.DELETE_AGENT, d.agent, f"the Agent of VM {d.vm}: {d.reason}"
            )
    for f in deferrals:
        yield Action(PlannedActionType.NOOP, f.vm, f"clean-up deferred: {f.reason}")
    if not (counts.demand_deficit or patches or deletions or deferrals):
        waiting = counts.agent_machines_without_agent
        yield Action(
            PlannedActionType.NOOP,
            None,
            f"{counts.pending_owned_vms} owned VM(s) pending for {waiting} AgentMachine(s) "
            "without an Agent: waiting for discovery and binding"
            if waiting
            else "Agent capacity satisfies current AgentMachine demand",
        )
