"""What a plan does, as `status.plannedActions` shows it (pure).

The planner's decisions (clean-ups, the Agent unlabelling that precedes one, deferred
clean-ups, hand-overs, Agent patches, the demand deficit) become a short, ordered
list of actions: the pool's answer to "what is the operator about to do, and why".
At most `MAX_PLANNED_ACTIONS` are listed (a burst of thousands of Agents must not
bloat the status); the counts say the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentforge.api.pool import PlannedActionType
from agentforge.reconcilers.planning.assignment import Handover
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.planning.preparation import AgentPatch

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
    from the VM's unbound Agent, on exactly the version the plan saw, so no AgentMachine
    of the pool can bind it while its VM is deleted. The VM is not deleted by this plan:
    a later one, whose snapshot shows the Agent without those labels and still unbound,
    decides the deletion again (and one that shows it bound keeps the VM)."""

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
        return {"metadata": meta}


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
            f"{u.vm}, so no AgentMachine binds it, before the VM is deleted: {u.reason}",
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
