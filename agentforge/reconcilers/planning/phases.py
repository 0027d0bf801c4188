"""Owned VM phases (DOMAIN.md section 3, made precise in docs/design/0002).

One VM's phase follows from its VsphereAgent's record (previous phase, reason,
agentRef, machineRef, identity, when it came to exist) and the Agent matched to it:

* no Agent: Provisioning (`AgentPending`, or `VMAdopted`: creation progress is the
  `vm` controller's to report) while the VM is younger than `ORPHAN_GRACE` (the clock
  starts when the VM exists, not when it was requested), then Orphaned
  (DiscoveryTimeout); a VM that had an Agent before is Orphaned (AgentMissing) and
  its references are cleared;
* an unbound Agent: Available, or Released when the VM was Bound or Released before
  (AgentUnbound, MachineDeleting, MachineDeleted, from the recorded Machine: found by
  name, and a Machine of that name with another UID than the recorded one is a
  re-created namesake, so the recorded one is deleted);
* a bound Agent: Bound, or Released (MachineDeleting) while its Machine is deleted.

`lastTransitionTime` moves only when the phase does. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, NamedTuple

from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    HandoverFacts,
    MachineFacts,
    VsphereAgentFacts,
)

ORPHAN_GRACE: Final = timedelta(minutes=30)
"""How long a VM may exist without discovery, and an orphan lingers before clean-up."""

_ONCE_MATCHED: Final = frozenset({VMPhase.AVAILABLE, VMPhase.BOUND, VMPhase.RELEASED})
_ONCE_BOUND: Final = frozenset({VMPhase.BOUND, VMPhase.RELEASED})

# The outcomes a plan decides thousands of times, bound once: an Enum member lookup
# (`VMPhase.BOUND`) is a slow metaclass attribute access on Python 3.11.
_AVAILABLE: Final = VMPhase.AVAILABLE
_RELEASED: Final = VMPhase.RELEASED
_AGENT_AVAILABLE: Final = VMReason.AGENT_AVAILABLE
_BOUND: Final = VMPhase.BOUND
_AGENT_BOUND: Final = VMReason.AGENT_BOUND


class Ref(NamedTuple):
    """A reference to an Agent or Machine (a tuple: thousands are made per plan)."""

    name: str
    uid: str | None = None


class VMRecord(NamedTuple):
    """The planner's part of a VM record (`status.vm.{phase,reason,agentRef,...}` and
    `status.handover`)."""

    vsphere_agent: str
    name: str
    phase: VMPhase
    reason: VMReason
    agent: Ref | None
    machine: Ref | None
    last_transition: datetime
    changed: bool
    """Differs from what the VsphereAgent's status records."""
    handover: HandoverFacts | None = None
    """The `status.handover` record to keep (see `assignment`)."""


@dataclass(slots=True)
class PhaseContext:
    now_exact: datetime
    now: datetime
    """`now_exact` in whole seconds, as status times are."""
    control_plane_namespace: str
    """Where the pool's AgentMachines and Machines (`machines`, `machine_of_am`) live."""
    machines: Mapping[str, MachineFacts]
    machine_of_am: Mapping[str, MachineFacts]
    wake: list[datetime] = field(default_factory=list)


def _provisioning_reason(va: VsphereAgentFacts) -> VMReason:
    """One reason for the whole phase, so the VM's creation progress (the `vm`
    controller's `Ready` condition and `status.creation`) causes no write of ours."""
    return initial(adopted=va.adopted)[1]


def initial(*, adopted: bool) -> tuple[VMPhase, VMReason]:
    """The phase of a VM record before anything is known of its Agent: what the `vm`
    controller writes with the record's first write (its checkpoint), so this
    controller finds nothing to change and writes nothing of its own then."""
    return VMPhase.PROVISIONING, VMReason.VM_ADOPTED if adopted else VMReason.AGENT_PENDING


def _discovery_started(va: VsphereAgentFacts) -> datetime | None:
    """Since when the VM exists (None while it does not): the discovery clock."""
    if not va.vm_exists:
        return None
    moments = [m for m in (va.created_at, va.ready_since) if m is not None]
    return max(moments) if moments else None


def _machine_ref(machine: MachineFacts | None, previous: str | None) -> Ref | None:
    if machine is not None:
        return Ref(machine.name, machine.uid or None)
    return Ref(previous) if previous else None


def _recorded_machine(va: VsphereAgentFacts, ctx: PhaseContext) -> str | None:
    """The recorded Machine's name, unless the record places it outside the control
    plane namespace (then it is not one of the pool's Machines: not looked up)."""
    if va.machine_ref_namespace not in (None, ctx.control_plane_namespace):
        return None
    return va.machine_ref


def _another_machine(machine: MachineFacts, recorded_uid: str | None) -> bool:
    """`machine` has the recorded Machine's name but not its UID: a namesake re-created
    after the recorded one was deleted (a record without a UID proves nothing)."""
    return bool(recorded_uid and machine.uid and machine.uid != recorded_uid)


def _decide(
    va: VsphereAgentFacts, agent: AgentFacts | None, ctx: PhaseContext
) -> tuple[VMPhase, VMReason, Ref | None, Ref | None]:
    """Phase, reason, agentRef and machineRef of one VM."""
    previous = va.phase
    if va.handover is not None and previous is _RELEASED:
        # spare (`status.handover`): Released without ever having been bound, so it
        # counts as what it was before
        previous = _AVAILABLE if va.agent_ref else VMPhase.PROVISIONING
    if agent is None:
        once_matched = bool(va.agent_ref) or previous in _ONCE_MATCHED
        if once_matched or (previous is VMPhase.ORPHANED and va.reason == VMReason.AGENT_MISSING):
            return VMPhase.ORPHANED, VMReason.AGENT_MISSING, None, None
        if previous is VMPhase.ORPHANED and va.reason != VMReason.AGENT_BOUND_ELSEWHERE:
            return VMPhase.ORPHANED, VMReason.DISCOVERY_TIMEOUT, None, None
        started = _discovery_started(va)
        if started is not None:
            deadline = started + ORPHAN_GRACE
            if ctx.now_exact >= deadline:
                return VMPhase.ORPHANED, VMReason.DISCOVERY_TIMEOUT, None, None
            ctx.wake.append(deadline)
        return VMPhase.PROVISIONING, _provisioning_reason(va), None, None

    agent_ref = Ref(agent.name, agent.uid or None)
    if agent.bound:
        am = agent.agent_machine_ref
        where = agent.agent_machine_namespace
        if where is not None and where != ctx.control_plane_namespace:
            am = None  # an AgentMachine of that name in another namespace is not ours
        machine = (ctx.machine_of_am.get(am) or ctx.machines.get(am)) if am else None
        if machine is None:
            return _BOUND, _AGENT_BOUND, agent_ref, _machine_ref(None, _recorded_machine(va, ctx))
        machine_ref = Ref(machine.name, machine.uid or None)
        if machine.deleting:
            return VMPhase.RELEASED, VMReason.MACHINE_DELETING, agent_ref, machine_ref
        return _BOUND, _AGENT_BOUND, agent_ref, machine_ref
    if previous in _ONCE_BOUND:
        recorded = _recorded_machine(va, ctx)
        if not recorded:
            reason = (
                VMReason.MACHINE_DELETED
                if va.reason in (VMReason.MACHINE_DELETING, VMReason.MACHINE_DELETED)
                else VMReason.AGENT_UNBOUND
            )
            return VMPhase.RELEASED, reason, agent_ref, None
        machine = ctx.machines.get(recorded)
        if machine is None or _another_machine(machine, va.machine_ref_uid):
            # gone, or re-created under its name: the Machine the VM served is gone
            return VMPhase.RELEASED, VMReason.MACHINE_DELETED, agent_ref, Ref(recorded)
        current = Ref(machine.name, machine.uid or None)
        if machine.deleting:
            return VMPhase.RELEASED, VMReason.MACHINE_DELETING, agent_ref, current
        return VMPhase.RELEASED, VMReason.AGENT_UNBOUND, agent_ref, current
    return _AVAILABLE, _AGENT_AVAILABLE, agent_ref, None


def record(va: VsphereAgentFacts, agent: AgentFacts | None, ctx: PhaseContext) -> VMRecord:
    """The record of `va`, matched to `agent` (None: no Agent matched)."""
    phase, reason, agent_ref, machine_ref = _decide(va, agent, ctx)
    # `build` inlined (this runs per VM per plan), the record kept as it is
    since = va.last_transition
    if phase is not va.phase or since is None:
        return VMRecord(
            va.name, va.vm_name, phase, reason, agent_ref, machine_ref, ctx.now, True, va.handover
        )
    changed = (
        reason != va.reason
        or (agent_ref.name if agent_ref else None) != va.agent_ref
        or (machine_ref.name if machine_ref else None) != va.machine_ref
    )
    return VMRecord(
        va.name, va.vm_name, phase, reason, agent_ref, machine_ref, since, changed, va.handover
    )


def build(
    va: VsphereAgentFacts,
    phase: VMPhase,
    reason: VMReason,
    agent_ref: Ref | None,
    machine_ref: Ref | None,
    *,
    handover: HandoverFacts | None,
    now: datetime,
) -> VMRecord:
    """A record whose transition time moves only with the phase, and which says whether
    it differs from what `va` records."""
    since = va.last_transition
    if phase is not va.phase or since is None:
        return VMRecord(
            va.name, va.vm_name, phase, reason, agent_ref, machine_ref, now, True, handover
        )
    changed = (
        reason != va.reason
        or (agent_ref.name if agent_ref else None) != va.agent_ref
        or (machine_ref.name if machine_ref else None) != va.machine_ref
        or handover != va.handover
    )
    return VMRecord(
        va.name, va.vm_name, phase, reason, agent_ref, machine_ref, since, changed, handover
    )
