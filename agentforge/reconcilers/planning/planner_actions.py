"""What a plan does, as `status.plannedActions` shows it (pure).

The planner's decisions (clean-ups, the Agent unlabelling that precedes one, deferred
clean-ups, hand-overs, Agent patches, the demand deficit) become a short, ordered
list of actions: the pool's answer to "what is the operator about to do, and why".
At most `MAX_PLANNED_ACTIONS` are listed (a burst of thousands of Agents must not
bloat the status); the counts say the rest.

**Agent preparation** (`Preparation`, `AgentPatch`): what an Available VM's Agent must
carry so its AgentMachine binds it. DOMAIN.md section 3: the pool's labels, the nodepool
discriminator (the pool's own `agent-forge.containeroo.ch/nodepool` label value, else
the NodePool's name), the role label and `spec.role`, `spec.hostname` = the VM name, the
selection label (the AgentMachine the VM serves: the target of a hand-over as the plan
records it in `status.handover`, else the one it was made for; the VM name for an
adopted VM) and, unless the pool says `approve: false`, `spec.approved=true`. A patch
holds only the fields that differ, so a prepared Agent costs nothing and the patch is
safe to repeat. A patch that names a hand-over's target before its record is stored
waits for that record (`AgentPatch.after_record`, applied by the pool controller's
`apply`).

A warm spare's Agent (its selection is a spare value, `naming.is_spare_selection`)
gets the spare selection label, hostname, role and approval, but none of the pool's
labels: no AgentMachine's selector matches it, pinned or not, so CAPI cannot bind it
before a hand-over prepares it for one AgentMachine.

Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from agentforge.api import names
from agentforge.api.pool import PlannedActionType, VsphereAgentPool
from agentforge.reconcilers.planning.assignment import Handover
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.planning.naming import is_spare_selection
from agentforge.reconcilers.planning.snapshot import AgentFacts, HandoverFacts, VsphereAgentFacts

_SELECTION: Final = names.LABEL_AGENT_MACHINE


class AgentPatch(NamedTuple):
    agent: str
    vm: str
    patch: Mapping[str, Any]
    """An RFC 7386 merge patch holding only the fields that differ."""
    after_record: str | None = None
    """The VsphereAgent whose `status.handover` this plan writes and whose AgentMachine
    the selection label names: apply only once that record is stored (it is the
    checkpoint of the hand-over)."""


def discriminator(pool: VsphereAgentPool) -> str:
    """The `nodepool` label value telling this pool's Agents from other pools' ones."""
    return pool.spec.agent.labels.get(names.LABEL_NODEPOOL) or pool.spec.node_pool_ref.name


def desired_labels(pool: VsphereAgentPool, *, selection: str) -> dict[str, str]:
    labels = dict(pool.spec.agent.labels)
    labels[names.LABEL_NODEPOOL] = discriminator(pool)
    labels[names.LABEL_NODEPOOL_ROLE] = pool.spec.agent.role
    labels[names.LABEL_AGENT_MACHINE] = selection
    return labels


@dataclass(frozen=True, slots=True)
class Preparation:
    """What a prepared Agent of this pool carries, computed once per plan."""

    labels: Mapping[str, str]
    role: str
    approve: bool

    @classmethod
    def of(cls, pool: VsphereAgentPool) -> Preparation:
        base = desired_labels(pool, selection="")
        del base[names.LABEL_AGENT_MACHINE]
        return cls(labels=base, role=pool.spec.agent.role, approve=pool.spec.agent.approve)

    def patch(
        self, va: VsphereAgentFacts, agent: AgentFacts, handover: HandoverFacts | None
    ) -> AgentPatch | None:
        """The patch preparing `agent` for `va`, whose `status.handover` the plan keeps
        (or writes) as `handover`: the selection label follows the plan's decision, so
        the next plan, once this one is applied, finds nothing to patch."""
        have = agent.labels
        vm_name = va.vm_name
        labels: dict[str, str] = {}
        # `va.target` with the plan's record, inlined: this runs per VM per plan
        target = handover.selection if handover is not None and handover.to else va.agent_machine
        selection = target or vm_name
        if not is_spare_selection(selection):
            for key, value in self.labels.items():
                if have.get(key) != value:
                    labels[key] = value
        after = None
        if have.get(_SELECTION) != selection:
            labels[_SELECTION] = selection
            if handover != va.handover:
                after = va.name
        spec: dict[str, Any] = {}
        if agent.role != self.role:
            spec["role"] = self.role
        if agent.spec_hostname != vm_name:
            spec["hostname"] = vm_name
        if self.approve and not agent.approved:
            spec["approved"] = True
        if not labels and not spec:
            return None
        patch: dict[str, Any] = {}
        if labels:
            patch["metadata"] = {"labels": labels}
        if spec:
            patch["spec"] = spec
        return AgentPatch(agent.name, vm_name, patch, after)


MAX_PLANNED_ACTIONS: Final = 100
"""`status.plannedActions` lists at most this many actions (the counts say the rest)."""


@dataclass(frozen=True, slots=True)
class Deletion:
    """Delete a VsphereAgent; the `vm` controller then removes its VM and the Agent."""

    vsphere_agent: str
    uid: str
    vm: str
    agent: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Unlabel:
    """The first step of a clean-up: remove the pool's selector labels (`spec.agent.labels`)
    from the VM's unbound Agent and unapprove it (`spec.approved=false`), in one patch on
    exactly the version the plan saw, so no AgentMachine can bind it while its VM is
    deleted (the `vm` controller, which unapproves a deleted VM's Agent, finds it done).
    The VM is not deleted by this plan: a later one, whose snapshot shows the Agent
    without those labels and still unbound, decides the deletion again (and one that
    shows it bound keeps the VM; one that prepares it again approves it again)."""

    agent: str
    vm: str
    vsphere_agent: str
    labels: tuple[str, ...]
    """The label keys to remove (those the Agent carries with the pool's value)."""
    resource_version: str
    """The Agent's version the plan saw ("" if unknown: then unconditional)."""
    reason: str
    """Why the VM is to be cleaned up."""

    @property
    def patch(self) -> Mapping[str, Any]:
        """The RFC 7386 merge patch; its resourceVersion is a precondition (a 409 when
        the Agent changed, bound by CAPI perhaps, since the plan saw it)."""
        meta: dict[str, Any] = {"labels": dict.fromkeys(self.labels)}
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"metadata": meta, "spec": {"approved": False}}


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
class Decisions:
    counts: Counts
    patches: Sequence[AgentPatch]
    deletions: Sequence[Deletion]
    deferrals: Sequence[Deferral]
    handovers: Sequence[Handover]
    spare_creations: Sequence[str] = ()
    unlabels: Sequence[Unlabel] = ()


def actions(decided: Decisions) -> tuple[Action, ...]:
    """The planned actions, in a fixed order, at most `MAX_PLANNED_ACTIONS` of them."""
    return tuple(itertools.islice(_all(decided), MAX_PLANNED_ACTIONS))


def _all(d: Decisions) -> Iterator[Action]:
    counts = d.counts
    if counts.demand_deficit:
        yield Action(
            PlannedActionType.DEMAND_DEFICIT,
            None,
            f"{counts.agent_machines_without_agent} AgentMachine(s) lack an Agent and "
            f"{counts.pending_owned_vms} owned VM(s) are pending: "
            f"{counts.demand_deficit} more VM(s) needed",
        )
    for h in d.handovers:
        yield Action(
            PlannedActionType.HAND_OVER_VM,
            h.vm,
            f"VsphereAgent {h.vsphere_agent} (made for AgentMachine {h.from_}, which no "
            f"longer needs it) serves AgentMachine {h.agent_machine}",
        )
    for name in d.spare_creations:
        yield Action(
            PlannedActionType.CREATE_SPARE,
            name,
            "create a warm spare VM (spec.spares): booted and discovered before an "
            "AgentMachine needs it",
        )
    for p in d.patches:
        fields = sorted({*p.patch.get("spec", {}), *(("labels",) if "metadata" in p.patch else ())})
        yield Action(
            PlannedActionType.PATCH_AGENT,
            p.agent,
            f"prepare the Agent of VM {p.vm}: set {', '.join(fields)}",
        )
    for u in d.unlabels:
        yield Action(
            PlannedActionType.PATCH_AGENT,
            u.agent,
            f"remove the pool's labels ({', '.join(u.labels)}) from the unbound Agent of VM "
            f"{u.vm} and unapprove it, so no AgentMachine binds it, before the VM is "
            f"deleted: {u.reason}",
        )
    for x in d.deletions:
        yield Action(PlannedActionType.DELETE_VM, x.vm, x.reason)
    for x in d.deletions:
        if x.agent:
            yield Action(
                PlannedActionType.DELETE_AGENT, x.agent, f"the Agent of VM {x.vm}: {x.reason}"
            )
    for f in d.deferrals:
        yield Action(PlannedActionType.NOOP, f.vm, f"clean-up deferred: {f.reason}")
    if not (
        counts.demand_deficit
        or d.handovers
        or d.spare_creations
        or d.patches
        or d.unlabels
        or d.deletions
        or d.deferrals
    ):
        waiting = counts.agent_machines_without_agent
        yield Action(
            PlannedActionType.NOOP,
            None,
            f"{counts.pending_owned_vms} owned VM(s) pending for {waiting} AgentMachine(s) "
            "without an Agent: waiting for discovery and binding"
            if waiting
            else "Agent capacity satisfies current AgentMachine demand",
        )
