"""The pool planner: one snapshot of a pool's world in, everything to do about it out.

Given the pool, its AgentMachines and Machines, the InfraEnv's Agents, the pool's
VsphereAgents, other pools' claims and `now`, `plan` decides (DOMAIN.md section 3,
made precise in docs/design/0002):

* which Agent is which VM (`matching`), never one claimed by another pool or bound
  to another cluster;
* each VM's phase (`phases`): Provisioning, Available, Bound, Released, Orphaned;
* which VM serves which AgentMachine (`assignment`): a VM whose AgentMachine went
  away before it was bound is handed to an AgentMachine that waits without one, and
  only AgentMachines no VM can serve get a new VsphereAgent; the VMs left over are
  spare (Released) for `assignment.HANDOVER_GRACE`;
* the metadata patches that prepare an Available VM's Agent (pool labels, the
  nodepool discriminator, role label, `spec.role`, `spec.hostname` = VM name, the
  selection label of the AgentMachine it serves, `spec.approved`), only the fields
  that differ;
* clean-up (`cleanup`) under `cleanupPolicy: Delete` only, never of a VM whose Agent is bound:
  Released VMs whose Machine is gone, spare VMs `HANDOVER_GRACE` after they became
  spare, Orphaned VMs 30 minutes after they became orphans (such an orphan serves its
  AgentMachine no more in the plan that deletes it: a free VM is handed to it at
  once). Nothing is cleaned up or created while AgentMachines match two pools.
  "Whose Agent is bound" does not trust the bookkeeping: besides the matched Agent,
  any bound Agent of the snapshot that identifies the VM (its BIOS UUID, or its MAC
  with no BIOS UUID saying otherwise; claimed or excluded ones included) defers it. A
  VM whose unbound Agent still carries the pool's selector labels is not deleted yet:
  the plan removes them (`Unlabel`, conditional on the Agent's version) and a later
  plan, seeing them gone, deletes (`cleanup`), so CAPI cannot bind the Agent of a VM
  on its way out;
* warm spares (`spec.spares`, see `assignment`): the spares to create, the surplus
  ones to clean up (under `cleanupPolicy: Delete`, least advanced first), their
  Agents prepared with the spare selection label only (no pool label: no
  AgentMachine selects them), counted apart (`Plan.spares`), never as demand,
  pending VMs or available Agents;
* counts, planned actions, the pool conditions it can decide, and when to look
  again (the earliest orphan or spare deadline).

Deliberate differences from the Go operator: the discovery clock starts when the VM
exists (not when the VsphereAgent was created, so a slow vCenter does not orphan a
VM before it booted); a Released VM keeps its machineRef so a later Machine
deletion is noticed; clean-up waits for the Machine to be gone (never while CAPI's
deletion hooks run) and pauses on ambiguous pools; `plannedActions` is capped at
`MAX_PLANNED_ACTIONS` (a burst of thousands of Agents must not bloat the status).

Pure (import-linter enforces it): no I/O, no clock; O(n log n) in Agents + VMs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from agentforge.api import conditions as api_conditions
from agentforge.api import names
from agentforge.api.conditions import ISOEjectedReason, PoolConditionType
from agentforge.api.meta import NamespacedName
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning import assignment, matching, phases, pool_conditions
from agentforge.reconcilers.planning import cleanup as cleanup_
from agentforge.reconcilers.planning import demand as demand_
from agentforge.reconcilers.planning.assignment import HANDOVER_GRACE, Creation, Handover
from agentforge.reconcilers.planning.cleanup import BoundAgents
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.planning.phases import ORPHAN_GRACE, Ref, VMRecord
from agentforge.reconcilers.planning.planner_actions import (
    MAX_PLANNED_ACTIONS,
    Action,
    AgentPatch,
    Decisions,
    Deferral,
    Deletion,
    Preparation,
    Unlabel,
    actions,
    desired_labels,
    discriminator,
)
from agentforge.reconcilers.planning.pool_conditions import ConditionDecision, Observed
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    AgentMachineFacts,
    Claims,
    InfraEnvFacts,
    MachineFacts,
    VsphereAgentFacts,
)

__all__ = [
    "HANDOVER_GRACE",
    "MAX_PLANNED_ACTIONS",
    "ORPHAN_GRACE",
    "Action",
    "AgentPatch",
    "Creation",
    "Deferral",
    "Deletion",
    "Handover",
    "Plan",
    "Ref",
    "Snapshot",
    "Unlabel",
    "VMRecord",
    "desired_labels",
    "discriminator",
    "plan",
]

_PENDING: Final = frozenset({VMPhase.PROVISIONING, VMPhase.AVAILABLE})
_CLEANUP_CANDIDATES: Final = frozenset({VMPhase.RELEASED, VMPhase.ORPHANED})
_AVAILABLE: Final = VMPhase.AVAILABLE
"""Bound once: an Enum member lookup is slow on Python 3.11, and this one runs per VM."""
_ORPHANED: Final = VMPhase.ORPHANED
"""... and this one too."""


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
class Spares:
    """The pool's warm spares as planned (`status.spares`)."""

    wanted: int = 0
    ready: int = 0
    """Kept warm spares whose Agent registered (Available)."""
    creating: int = 0
    """Kept warm spares without an Agent yet, and the ones this plan creates."""


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
    creations: tuple[Creation, ...] = ()
    """AgentMachines that wait and that no VM of the pool can serve: one VsphereAgent each."""
    handovers: tuple[Handover, ...] = ()
    """VMs whose AgentMachine went away, to serve waiting AgentMachines instead."""
    planned_names: frozenset[str] = frozenset()
    """The VsphereAgents this plan saw (set when it creates): a name among them serves
    no AgentMachine the plan creates for, whatever its labels say."""
    spare_creations: tuple[str, ...] = ()
    """Warm spare VsphereAgents to create (names no VsphereAgent of the pool holds)."""
    spares: Spares = Spares()
    unlabels: tuple[Unlabel, ...] = ()
    """Clean-ups' first step: the pool's labels removed from a VM's unbound Agent (the
    VM is deleted by a later plan that sees them gone)."""

    @property
    def changed_vms(self) -> tuple[VMRecord, ...]:
        return tuple(vm for vm in self.vms if vm.changed)


def _observed(pool: VsphereAgentPool, type_: PoolConditionType) -> Observed | None:
    found = api_conditions.find_condition(pool.status.conditions, type_)
    return Observed(found.status, found.reason, found.message) if found else None


def _assigned(
    va: VsphereAgentFacts, base: VMRecord, outcome: assignment.Outcome, now: datetime
) -> VMRecord:
    """`base` as the assignment left it: spare VMs Released, taken ones Orphaned, and the
    `status.handover` record to keep."""
    name = va.name
    handover = outcome.records.get(name, va.handover)
    spare = outcome.spares.get(name)
    if spare is not None:
        return phases.build(
            va, VMPhase.RELEASED, spare, base.agent, None, handover=handover, now=now
        )
    if name in outcome.taken:
        reason = VMReason.AGENT_BOUND_ELSEWHERE
        return phases.build(va, VMPhase.ORPHANED, reason, None, None, handover=handover, now=now)
    if handover != va.handover:
        return phases.build(
            va, base.phase, base.reason, base.agent, base.machine, handover=handover, now=now
        )
    return base


def plan(snapshot: Snapshot) -> Plan:
    pool = snapshot.pool
    cpns = pool.spec.control_plane_namespace
    ctx = phases.PhaseContext(
        now_exact=snapshot.now,
        now=snapshot.now.replace(microsecond=0),
        control_plane_namespace=cpns,
        machines={m.name: m for m in snapshot.machines},
        machine_of_am={
            m.infrastructure_name: m for m in snapshot.machines if m.infrastructure_name
        },
    )
    demand = demand_.demand(agent_machines=snapshot.agent_machines, machines=snapshot.machines)
    claims = snapshot.claims
    eligible = matching.eligible(
        snapshot.agents,
        hosted_cluster=NamespacedName(cpns, pool.spec.hosted_cluster_ref.name),
        discriminator=discriminator(pool),
        claims=claims,
        shared_names={va.vm_name for va in snapshot.vsphere_agents} if claims else frozenset(),
    )
    # one sort serves matching and the order of `Plan.vms`
    ordered = matching.in_vm_order(snapshot.vsphere_agents)
    matches, _ = matching.assign(ordered, eligible, claimed_names=claims.by_vm_name)

    live: list[VsphereAgentFacts] = []
    retiring: list[VsphereAgentFacts] = []
    bases: list[VMRecord] = []
    record_of = phases.record
    for va in ordered:
        if va.deleting:
            retiring.append(va)
        else:
            live.append(va)
            bases.append(record_of(va, matches.get(va.name), ctx))
    bound_agents = BoundAgents(snapshot.agents)
    cleanup = pool.cleanup_enabled
    going = (
        frozenset(
            va.name
            for va, base in zip(live, bases, strict=True)
            if base.phase is _ORPHANED
            and cleanup_.orphan_goes(
                va,
                base,
                ctx,
                competing=bool(snapshot.competing_pools),
                bound_agents=bound_agents,
            )
        )
        if cleanup
        else frozenset()
    )
    outcome = assignment.assign(
        assignment.World(
            vsphere_agents=live,
            retiring=retiring,
            records=bases,
            matches=matches,
            agent_machines=snapshot.agent_machines,
            machine_of_am=ctx.machine_of_am,
            taken_by=bound_agents.identifying,
            agents_namespace=pool.metadata.namespace,
            control_plane_namespace=cpns,
            now=ctx.now,
            create=not snapshot.competing_pools,
            spares=pool.spec.spares,
            pool_name=pool.metadata.name,
            going=going,
        )
    )
    warm = {va.name for va in outcome.warm}
    surplus = {va.name for va in outcome.surplus}

    records: list[VMRecord] = []
    patches: list[AgentPatch] = []
    deletions: list[Deletion] = []
    deferrals: list[Deferral] = []
    unlabels: list[Unlabel] = []
    ejections: dict[ISOEjectedReason, int] = {}
    pending = 0
    preparation = Preparation.of(pool)
    adjusted = bool(outcome.records or outcome.spares or outcome.taken)  # else as `phases` said
    for va, phased in zip(live, bases, strict=True):
        if va.iso_ejected is not None:
            ejections[va.iso_ejected] = ejections.get(va.iso_ejected, 0) + 1
        agent = matches.get(va.name)
        record = _assigned(va, phased, outcome, ctx.now) if adjusted else phased
        records.append(record)
        phase = record.phase
        if phase in _PENDING and va.name not in warm and va.name not in surplus:
            pending += 1
        if phase is _AVAILABLE and agent is not None and not agent.deleting:
            patch = preparation.patch(va, agent, record.handover)
            if patch is not None:
                patches.append(patch)
        if va.name in surplus:
            reason: str | None = (
                f"surplus warm spare: the pool keeps {pool.spec.spares} (spec.spares)"
                if cleanup
                else None
            )
        elif not cleanup or phase not in _CLEANUP_CANDIDATES:
            continue
        else:
            reason = cleanup_.reason(record, ctx)
        if reason is None:
            continue
        decided_cleanup = cleanup_.decide(
            va,
            record,
            agent,
            reason,
            competing=bool(snapshot.competing_pools),
            bound_agents=bound_agents,
            selector=pool.spec.agent.labels,
        )
        if isinstance(decided_cleanup, Deletion):
            deletions.append(decided_cleanup)
        elif isinstance(decided_cleanup, Unlabel):
            unlabels.append(decided_cleanup)
        else:
            deferrals.append(decided_cleanup)

    counts = _counts(
        snapshot,
        eligible,
        matches,
        retiring=retiring,
        pending=pending,
        creating=len(outcome.creations),
        demand=demand,
        spares=warm | surplus,
    )
    ready_spares = sum(1 for va in outcome.warm if va.name in matches)
    spares = Spares(
        wanted=pool.spec.spares,
        ready=ready_spares,
        creating=len(outcome.warm) - ready_spares + len(outcome.spare_names),
    )
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
    patches.sort(key=lambda p: p.agent)
    return Plan(
        counts=counts,
        vms=tuple(records),
        patches=tuple(patches),
        deletions=tuple(deletions),
        deferrals=tuple(deferrals),
        actions=actions(
            Decisions(
                counts=counts,
                patches=patches,
                deletions=deletions,
                deferrals=deferrals,
                handovers=outcome.handovers,
                spare_creations=outcome.spare_names,
                unlabels=unlabels,
            )
        ),
        conditions=(*decided, ready),
        iso_ejections=ejections,
        wake_at=min(ctx.wake) if ctx.wake else None,
        creations=outcome.creations,
        handovers=outcome.handovers,
        planned_names=(frozenset(va.name for va in ordered) if outcome.creations else frozenset()),
        spare_creations=outcome.spare_names,
        spares=spares,
        unlabels=tuple(unlabels),
    )


def _counts(
    snapshot: Snapshot,
    eligible: Sequence[AgentFacts],
    matches: Mapping[str, AgentFacts],
    *,
    retiring: Sequence[VsphereAgentFacts],
    pending: int,
    creating: int,
    demand: demand_.Demand,
    spares: frozenset[str] | set[str] = frozenset(),
) -> Counts:
    """The counts; `retiring` are the deleting VsphereAgents, `pending` the owned VMs
    Provisioning or Available, `creating` the VsphereAgents this plan creates (pending
    VMs too, once it is applied); the Agents of the warm `spares` count nowhere."""
    # an Agent matched to a deleting VM is held, not counted; one matched to a live VM
    # is owned (an Agent matches at most one VM)
    held = {agent.name for va in retiring if (agent := matches.get(va.name)) is not None}
    held.update(agent.name for name in spares if (agent := matches.get(name)) is not None)
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
    return demand_.counts(
        demand=demand, bound=bound, available=available, pending=pending, creating=creating
    )
