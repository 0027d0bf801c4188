"""Clean-up decisions: why a VM should go, and whether it may go now.

Under `cleanupPolicy: Delete` only (the planner asks only then). A VM should go when
it is Released and its Machine was deleted, a spare nobody took within
`HANDOVER_GRACE`, or Orphaned for `ORPHAN_GRACE` (a deadline still ahead is added to
the phase context's wake-ups instead). It may go only when nothing holds it: while
AgentMachines match several pools every clean-up is paused, and a VM whose Agent is
bound (the matched Agent, or any bound Agent that reports the VM's identity, so the
bookkeeping is not trusted) is deferred with the reason, never deleted.

A VM whose matched Agent is unbound but still carries the pool's selector labels
(`spec.agent.labels`, what the NodePool's AgentMachines select) is not deleted yet:
CAPI could bind that Agent to a waiting AgentMachine before the `vm` controller
finalizes the deletion, which it would then hold (a bound VM is never destroyed), and
that AgentMachine would be served by a VM on its way out. The plan removes those
labels first and unapproves the Agent in the same patch (`Unlabel`, on the version it
saw: the one Agent patch of a clean-up, the `vm` controller's unapproval folded in);
the deletion is decided by a later
plan whose snapshot shows the Agent without them and unbound. So the Agent's labels
are the checkpoint: after a crash between the two steps the next plan, from the
cache, deletes; an Agent bound meanwhile keeps its VM (Bound: capacity of the pool).

**Bound Agents** (`BoundAgents`): which bound Agent is a VM, whatever matched or was
recorded. The clean-up guard ("never the VM of a bound Agent") and the assignment ("a VM whose
Agent is bound elsewhere serves none of our AgentMachines") ask the same question of
the snapshot's Agents: is any bound Agent this VM, by BIOS UUID, or by MAC when no
BIOS UUID says otherwise (`snapshot.identifies`)? Excluded and claimed Agents count
too: binding anywhere is a fact about the VM.

The index is built on first use: a pool in steady state (every VM matched, nothing
to clean up) never pays for it.

Pure: no I/O, no clock (`now` comes from the phase context).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from operator import attrgetter

from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning import phases
from agentforge.reconcilers.planning.assignment import HANDOVER_GRACE
from agentforge.reconcilers.planning.phases import VMRecord
from agentforge.reconcilers.planning.planner_actions import Deferral, Deletion, Unlabel
from agentforge.reconcilers.planning.snapshot import AgentFacts, VsphereAgentFacts, identifies


def blocker(agent: AgentFacts) -> str:
    """What holds `agent`, in words."""
    if agent.agent_machine_ref:
        where = f"{agent.agent_machine_namespace}/" if agent.agent_machine_namespace else ""
        return f"Agent {agent.name} is still bound to AgentMachine {where}{agent.agent_machine_ref}"
    return f"Agent {agent.name} is still assigned to ClusterDeployment {agent.cluster_deployment}"


class BoundAgents:
    """The snapshot's bound Agents by BIOS UUID and MAC."""

    def __init__(self, agents: Sequence[AgentFacts]) -> None:
        self._agents = agents
        self._by_uuid: dict[str, list[AgentFacts]] | None = None
        self._by_mac: dict[str, list[AgentFacts]] = {}

    def _build(self) -> dict[str, list[AgentFacts]]:
        by_uuid: dict[str, list[AgentFacts]] = {}
        for agent in sorted((a for a in self._agents if a.bound), key=attrgetter("name")):
            if agent.bios_uuid:
                by_uuid.setdefault(agent.bios_uuid, []).append(agent)
            for mac in agent.macs:
                self._by_mac.setdefault(mac, []).append(agent)
        return by_uuid

    def identifying(self, va: VsphereAgentFacts) -> AgentFacts | None:
        """A bound Agent that is this VM by identity (the lowest name), or None."""
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


__all__ = ["BoundAgents", "blocker", "decide", "orphan_goes", "reason"]


def reason(record: VMRecord, ctx: phases.PhaseContext) -> str | None:
    """Why this VM should go under `cleanupPolicy: Delete`, or None (a deadline ahead is
    added to `ctx.wake`)."""
    if record.phase is VMPhase.RELEASED and record.handover is not None:
        due = record.handover.since + HANDOVER_GRACE
        if ctx.now_exact < due:
            ctx.wake.append(due)
            return None
        return (
            f"spare: AgentMachine {record.handover.from_} no longer needs it and no "
            f"AgentMachine of the pool took it within {_minutes(HANDOVER_GRACE)}"
        )
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
        if record.reason is VMReason.AGENT_BOUND_ELSEWHERE:
            return "its Agent is bound to another cluster or pool"
        return "its Agent vanished and did not come back"
    return None


def orphan_goes(
    va: VsphereAgentFacts,
    record: VMRecord,
    ctx: phases.PhaseContext,
    *,
    competing: bool,
    bound_agents: BoundAgents,
) -> bool:
    """This Orphaned VM is deleted by this plan (what `reason` and `decide` will say of
    it: its grace is over, clean-up is not paused and no bound Agent reports its
    identity; an orphan has no matched Agent, so there is nothing to unlabel). The
    assignment asks first: such a VM serves its AgentMachine no more, so a free VM can
    be handed to that one in the same plan. Under `cleanupPolicy: Delete` only."""
    return (
        record.phase is VMPhase.ORPHANED
        and not competing
        and ctx.now_exact >= record.last_transition + phases.ORPHAN_GRACE
        and bound_agents.identifying(va) is None
    )


def decide(
    va: VsphereAgentFacts,
    record: VMRecord,
    agent: AgentFacts | None,
    why: str,
    *,
    competing: bool,
    bound_agents: BoundAgents,
    selector: Mapping[str, str],
) -> Deletion | Deferral | Unlabel:
    """Delete the VM for `why`, or defer it: clean-up paused by `competing` pools, or
    its matched Agent bound, or a bound Agent reporting its identity; or, first,
    unlabel its matched Agent while it carries any of the pool's `selector` labels."""
    if competing:
        return Deferral(
            record.name,
            record.agent.name if record.agent else None,
            f"{why}; clean-up paused while AgentMachines match several pools",
        )
    if agent is not None and agent.bound:
        return Deferral(record.name, agent.name, f"{why}, but {blocker(agent)}")
    holder = bound_agents.identifying(va)
    if holder is not None:
        return Deferral(
            record.name,
            holder.name,
            f"{why}, but {blocker(holder)} and reports this VM's "
            f"{'BIOS UUID' if va.bios_uuid and holder.bios_uuid else 'MAC'}",
        )
    if agent is not None:
        held = tuple(sorted(k for k, v in selector.items() if agent.labels.get(k) == v))
        if held:
            return Unlabel(agent.name, record.name, va.name, held, agent.resource_version, why)
    return Deletion(va.name, va.uid, record.name, agent.name if agent else None, why)


def _minutes(delta: timedelta) -> str:
    return f"{int(delta.total_seconds()) // 60} minutes"
