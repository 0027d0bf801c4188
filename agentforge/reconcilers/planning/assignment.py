"""Which VsphereAgent serves which AgentMachine: hand-overs, spares and new ones, pure.

CAPI replaces AgentMachines (a MachineHealthCheck remediation, a rollout, a user
deleting a Machine) while their VMs still boot. A VM made for an AgentMachine that
went away is capacity the pool already paid for, so it serves the next AgentMachine
of the pool that waits for an Agent instead of a new VM (docs/design/0002,
"Hand-over"). One plan decides it all, for the whole pool:

* **Serving.** A VsphereAgent whose Agent is bound to one of the pool's AgentMachines
  serves that one, whatever its label says (the binding is the fact). Otherwise one
  made for an AgentMachine serves its target (`VsphereAgentFacts.target`: the
  hand-over's target while one runs, else its `agent-machine` label) while that
  AgentMachine is there, not being deleted, its Machine not being deleted, not served
  by another VM, and has no Agent or has this VM's. An Orphaned VM keeps its
  AgentMachine until clean-up (as before), and serves nothing from the plan that
  deletes it (`World.going`); one whose Agent is bound elsewhere (another cluster,
  another pool's claim) serves nothing (`taken`).
* **Free** are the others that never had a bound Agent: Provisioning or Available.
  A VM whose Agent is or was bound (Bound, Released after binding) is never free:
  CAPI and clean-up own it.
* **Needy** are the AgentMachines that wait (Ready=False/NoSuitableAgents), have no
  Agent and are served by nothing.
* Needy AgentMachines, oldest first, get free VMs, furthest along first (an Agent
  registered, then a VM that exists, then the rest): a `Handover`. The rest of the
  needy get a new VsphereAgent (`Creation`), unless pools compete for them or a
  VsphereAgent made for them is being deleted (by this plan or before): that one is
  waited for, never duplicated.
* The free VMs left are **spare**: phase Released (`MachineDeleting` while their
  AgentMachine or its Machine is being deleted, `MachineDeleted` once it is gone,
  `AgentMachineServed` when it got another VM's Agent), marked by `status.handover`
  (`fromAgentMachine`, `since`). A spare is handed over like any free VM; under
  `cleanupPolicy: Delete` it is deleted `HANDOVER_GRACE` after it became spare.

So the pool owns at most one unbound VM per AgentMachine without an Agent, plus the
spares of AgentMachines that went away within `HANDOVER_GRACE`, and spares exist
only while no AgentMachine waits without a VM.

**Warm spares** (`spec.spares`, `World.spares`): VsphereAgents made for no
AgentMachine (`CreatedFor.SPARE`, a spare selection label, `naming`) are free VMs
too, handed over like any other (a spare left by an AgentMachine that went away first,
then the warm spare furthest along). The warm spares left keep their phase
(Provisioning or Available, no `status.handover`): `Outcome.warm`, furthest along
first. Fewer than wanted: `Outcome.spare_names` are created (names `naming.spare_name`
no VsphereAgent of the pool holds); more: the least advanced are `Outcome.surplus`.
What is left over is described by `spare_reason` and `spare_names`: a VM left by an
AgentMachine is Released with the reason its AgentMachine gave (`MachineDeleting` while
that AgentMachine or its Machine is being deleted, `MachineDeleted` once it is gone,
`AgentMachineServed` when it is there and got another VM). Warm spares (`spec.spares`)
the pool lacks get names no VsphereAgent of the pool holds (the lowest indices of
`naming.spare_name`), so a plan made twice names the same ones.

Pure: no I/O, no clock. O(VMs + AgentMachines) plus two sorts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from agentforge.api import names
from agentforge.api.meta import NamespacedName
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.planning.phases import VMRecord
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    AgentMachineFacts,
    HandoverFacts,
    MachineFacts,
    VsphereAgentFacts,
)


def spare_names(*, pool: str, held: Container[str], count: int) -> tuple[str, ...]:
    """`count` names for new warm spares of `pool`, the lowest indices not `held`."""
    if count <= 0:
        return ()
    found: list[str] = []
    for index in itertools.count():
        name = naming.spare_name(pool=pool, index=index)
        if name not in held:
            found.append(name)
            if len(found) == count:
                return tuple(found)
    raise AssertionError("unreachable")  # pragma: no cover


def spare_reason(
    va: VsphereAgentFacts,
    *,
    agent_machines: Sequence[AgentMachineFacts],
    machine_of_am: Mapping[str, MachineFacts],
) -> VMReason:
    """MachineDeleting while its AgentMachine or that one's Machine is being deleted,
    MachineDeleted once gone, AgentMachineServed when it is there and has another VM."""
    target = va.target or ""
    am = next((a for a in agent_machines if a.selection == target), None)
    name = am.name if am is not None else target
    machine = machine_of_am.get(name)
    if am is None:
        return VMReason.MACHINE_DELETING if machine is not None else VMReason.MACHINE_DELETED
    if am.deleting or (machine is not None and machine.deleting):
        return VMReason.MACHINE_DELETING
    return VMReason.AGENT_MACHINE_SERVED


HANDOVER_GRACE: Final = timedelta(minutes=5)
"""How long a spare VM waits for an AgentMachine to take it before clean-up: longer
than CAPI needs to replace a remediated or rolled-out Machine (seconds), short
enough that a scale-down frees its VMs soon."""

_FREE_PHASES: Final = frozenset({VMPhase.PROVISIONING, VMPhase.AVAILABLE})
_SELECTION: Final = names.LABEL_AGENT_MACHINE
_ADOPTED: Final = names.CreatedFor.ADOPTED.value


@dataclass(frozen=True, slots=True)
class Creation:
    """Create a VsphereAgent for `agent_machine` (names: `vsphere_agent_create`)."""

    agent_machine: str
    uid: str
    selection: str


@dataclass(frozen=True, slots=True)
class Handover:
    """Give VsphereAgent `vsphere_agent` to `agent_machine`: `status.handover` names it
    (written and read back first), then the selection label moves to `selection`."""

    vsphere_agent: str
    uid: str
    vm: str
    from_: str
    """The selection label value it carries now."""
    agent_machine: str
    selection: str


@dataclass(frozen=True, slots=True)
class Outcome:
    serving: Mapping[str, str]
    """VsphereAgent -> the AgentMachine it serves."""
    handovers: tuple[Handover, ...]
    """Hand-overs to start or to finish (the label still names another AgentMachine)."""
    creations: tuple[Creation, ...]
    spares: Mapping[str, VMReason]
    """VsphereAgent -> the reason of its Released phase."""
    taken: Mapping[str, AgentFacts]
    """VsphereAgent -> the bound Agent of another cluster or pool that is its VM."""
    records: Mapping[str, HandoverFacts | None]
    """VsphereAgent -> its `status.handover` (only where it differs from what it has)."""
    warm: tuple[VsphereAgentFacts, ...] = ()
    """The warm spares kept (serving nothing, not handed over), furthest along first."""
    surplus: tuple[VsphereAgentFacts, ...] = ()
    """Warm spares beyond `World.spares`, least advanced first."""
    spare_names: tuple[str, ...] = ()
    """Warm spares to create (VsphereAgent names)."""


@dataclass(slots=True)
class _State:
    serving: dict[str, str] = field(default_factory=dict)
    served: dict[str, str] = field(default_factory=dict)
    """AgentMachine -> the VsphereAgent serving it."""
    free: list[VsphereAgentFacts] = field(default_factory=list)
    taken: dict[str, AgentFacts] = field(default_factory=dict)

    def take(self, va: VsphereAgentFacts, am: AgentMachineFacts) -> None:
        self.serving[va.name] = am.name
        self.served[am.name] = va.name


@dataclass(frozen=True, slots=True)
class World:
    """The pool's side of the assignment, as the planner saw it."""

    vsphere_agents: Sequence[VsphereAgentFacts]
    """The live (not deleting) VsphereAgents, in the planner's order."""
    retiring: Sequence[VsphereAgentFacts]
    records: Sequence[VMRecord]
    """Each live VsphereAgent's record as `phases` decided it (in `vsphere_agents` order)."""
    matches: Mapping[str, AgentFacts]
    agent_machines: Sequence[AgentMachineFacts]
    machine_of_am: Mapping[str, MachineFacts]
    taken_by: Callable[[VsphereAgentFacts], AgentFacts | None]
    """A bound Agent that is this (unmatched) VM, if any."""
    agents_namespace: str
    control_plane_namespace: str
    now: datetime
    create: bool
    """False while other pools claim the same AgentMachines: nothing new is made."""
    spares: int = 0
    """`spec.spares`: the warm spares to keep."""
    pool_name: str = ""
    going: frozenset[str] = frozenset()
    """Live VsphereAgents this plan deletes (Orphaned past their grace,
    `cleanup.orphan_goes`): they serve nothing, like the `retiring` ones."""


def _accepts(am: AgentMachineFacts, agent: AgentFacts | None, namespace: str) -> bool:
    """`am` has no Agent, or has the VM's (CAPI recorded it before the Agent shows it)."""
    if am.agent is None and am.provider_agent is None:
        return True
    if agent is None:
        return False
    return am.agent == NamespacedName(namespace, agent.name) or am.provider_agent in (
        agent.name,
        agent.uid,
    )


def _progress(
    va: VsphereAgentFacts, matches: Mapping[str, AgentFacts]
) -> tuple[bool, bool, bool, str]:
    """Furthest along first: an Agent registered, then a VM that exists; a VM left by
    an AgentMachine before a warm spare (the one would be cleaned up, the other kept)."""
    return (va.name not in matches, not va.vm_exists, va.warm_spare, va.name)


def assign(world: World) -> Outcome:
    live: dict[str, AgentMachineFacts] = {}  # built when first needed (steady state)
    machine_of_am = world.machine_of_am
    state = _State()
    serving, served = state.serving, state.served
    rest: list[tuple[VsphereAgentFacts, VMRecord]] = []
    matches, cpns = world.matches, world.control_plane_namespace
    with_records: list[VsphereAgentFacts] = []
    for va, record in zip(world.vsphere_agents, world.records, strict=True):
        # the binding decides first (the hot loop: inlined)
        if va.created_for == _ADOPTED or not va.agent_machine:
            continue
        if va.handover is not None:
            with_records.append(va)
        agent = matches.get(va.name)
        if agent is None or not agent.bound:
            rest.append((va, record))
            continue
        where = agent.agent_machine_namespace
        if where is None or where == cpns:
            if not live:
                live = _live(world)
            am = live.get(agent.agent_machine_ref or "")
            if am is not None and am.name not in served:
                serving[va.name] = am.name
                served[am.name] = va.name

    leaving = {name for name, m in machine_of_am.items() if m.deleting}
    if rest:
        by_selection = {
            am.selection: am
            for am in world.agent_machines
            if not am.deleting and am.name not in leaving
        }
        free = state.free
        for va, record in rest:  # the usual case inlined: its own AgentMachine, no Agent
            agent = matches.get(va.name)
            phase = record.phase
            if (
                va.handover is None
                and phase in _FREE_PHASES
                and (agent is not None or not va.vm_exists)  # `taken_by` cannot apply
            ):
                am = by_selection.get(va.agent_machine or "")
                if am is None:
                    free.append(va)
                    continue
                if am.name not in served and am.agent is None and am.provider_agent is None:
                    serving[va.name] = am.name
                    served[am.name] = va.name
                    continue
            _place(va, record, world, by_selection, state)
    needy = [
        am
        for am in world.agent_machines
        if am.waiting
        and not am.has_agent
        and not am.deleting
        and am.name not in served
        and am.name not in leaving
    ]
    return _pair(world, needy, with_records, state, live or (_live(world) if with_records else {}))


def _live(world: World) -> dict[str, AgentMachineFacts]:
    return {am.name: am for am in world.agent_machines if not am.deleting}


def _place(
    va: VsphereAgentFacts,
    record: VMRecord,
    world: World,
    by_selection: Mapping[str, AgentMachineFacts],
    state: _State,
) -> None:
    agent = world.matches.get(va.name)
    if agent is None and va.vm_exists and (holder := world.taken_by(va)) is not None:
        state.taken[va.name] = holder
        return
    if record.phase not in _FREE_PHASES and record.phase is not VMPhase.ORPHANED:
        return  # bound or released after binding: CAPI and clean-up own it
    if va.name in world.going:
        return  # an orphan deleted by this plan: its AgentMachine may get a free VM
    am = by_selection.get(va.target or "")
    handover = va.handover
    if (
        am is not None
        and handover is not None
        and handover.to
        and handover.to_uid
        and am.uid != handover.to_uid
    ):
        am = None  # the target was re-created under its name: another AgentMachine
    if (
        am is not None
        and am.name not in state.served
        and _accepts(am, agent, world.agents_namespace)
    ):
        state.take(va, am)
    elif record.phase is not VMPhase.ORPHANED:
        state.free.append(va)


def _pair(
    world: World,
    waiting: Sequence[AgentMachineFacts],
    with_records: Sequence[VsphereAgentFacts],
    state: _State,
    live: Mapping[str, AgentMachineFacts],
) -> Outcome:
    needy = sorted(waiting, key=lambda am: (am.created, am.name))
    free = sorted(state.free, key=lambda va: _progress(va, world.matches))
    handovers: list[Handover] = []
    records: dict[str, HandoverFacts | None] = {}
    for am, va in zip(needy, free, strict=False):
        state.take(va, am)
        records[va.name] = HandoverFacts(
            from_=va.agent_machine or am.selection,
            to=am.name,
            to_uid=am.uid or None,
            since=world.now,
        )
        handovers.append(
            Handover(va.name, va.uid, va.vm_name, va.agent_machine or "", am.name, am.selection)
        )
    started = {h.vsphere_agent for h in handovers}
    for va in with_records:
        if va.name in state.serving and va.name not in started:
            _finish(
                va,
                world,
                live.get(state.serving[va.name]),
                records=records,
                handovers=handovers,
            )
    creations: tuple[Creation, ...] = ()
    if world.create and len(needy) > len(free):
        going = [va for va in world.vsphere_agents if va.name in world.going]
        waited_for = {va.target for va in (*world.retiring, *going)}
        creations = tuple(
            Creation(am.name, am.uid, am.selection)
            for am in needy[len(free) :]
            if am.selection not in waited_for
        )
    spares: dict[str, VMReason] = {}
    warm: list[VsphereAgentFacts] = []
    for va in free[len(needy) :]:
        if va.warm_spare:
            warm.append(va)
            continue
        spares[va.name] = spare_reason(
            va, agent_machines=world.agent_machines, machine_of_am=world.machine_of_am
        )
        kept = va.handover
        if kept is None or kept.to:
            records[va.name] = HandoverFacts(
                from_=va.agent_machine or "", to=None, to_uid=None, since=world.now
            )
    for name in state.taken:
        records[name] = None
    recorded = {va.name: va.handover for va in with_records}
    wanted = max(0, world.spares)
    return Outcome(
        serving=state.serving,
        handovers=tuple(handovers),
        creations=creations,
        spares=spares,
        taken=state.taken,
        records={k: v for k, v in records.items() if v != recorded.get(k)},
        warm=tuple(warm[:wanted]),
        surplus=tuple(reversed(warm[wanted:])),
        spare_names=_spare_names(world, wanted - len(warm)) if world.create else (),
    )


def _spare_names(world: World, count: int) -> tuple[str, ...]:
    if count <= 0:
        return ()
    held = {va.name for va in world.vsphere_agents} | {va.name for va in world.retiring}
    return spare_names(pool=world.pool_name, held=held, count=count)


def _finish(
    va: VsphereAgentFacts,
    world: World,
    am: AgentMachineFacts | None,
    *,
    records: dict[str, HandoverFacts | None],
    handovers: list[Handover],
) -> None:
    """A serving VsphereAgent: finish a hand-over in flight (move the label), then drop
    the record once the label and the Agent name the AgentMachine; a spare that serves
    again (its AgentMachine came back, or bound it) drops its record."""
    handover = va.handover
    if handover is None:
        return
    target = handover.selection
    if not handover.to or am is None or target != am.selection:
        records[va.name] = None
        return
    if va.agent_machine != target:
        handovers.append(
            Handover(va.name, va.uid, va.vm_name, va.agent_machine or "", am.name, target)
        )
        return
    agent = world.matches.get(va.name)
    if agent is None or agent.bound or agent.labels.get(_SELECTION) == target:
        records[va.name] = None
