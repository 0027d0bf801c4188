"""The plan as status JSON: the pool's status fields and each VsphereAgent's `status.vm`.

Two controllers write each of these objects (0002): the `pool` controller owns the
pool's counts, `ownedVMs`, `plannedActions`, `isoEjections`, `observedGeneration`
and conditions Ready, AgentMachineDemandFound, InfraEnvAvailable and
CapacitySatisfied; on a VsphereAgent it owns `status.vm.{phase, reason, agentRef,
machineRef, lastTransitionTime}` and `status.handover`. The `apply_*` functions set
exactly those fields on a status dict and say whether anything changed, so the
controller can

* check the cached object first and skip the API entirely when nothing would change
  (steady state costs no request), and
* run the same function as the `update_status` mutation on the fresh object, where
  Ready is recomputed from the freshest VsphereReady/ISOReady.

Rendering works on plain dicts (no pydantic on the hot path: a pool may own
thousands of VMs) and produces what the API server returns, so an unchanged status
compares equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from agentforge.api import conditions, kinds
from agentforge.api.conditions import ConditionStatus, ISOEjectedReason, PoolConditionType
from agentforge.api.fields import format_time
from agentforge.api.pool import ISOEjectionCounts
from agentforge.api.vm import VMSource
from agentforge.api.wire import to_wire
from agentforge.reconcilers.planning import pool_conditions
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.planning.phases import Ref, VMRecord
from agentforge.reconcilers.planning.planner import Action, Plan, Spares
from agentforge.reconcilers.planning.pool_conditions import ConditionDecision, Observed

JsonObj = dict[str, Any]

# Fields of status.vm the pool controller owns (the `vm` controller owns the rest).
VM_FIELDS = ("phase", "reason", "agentRef", "machineRef", "lastTransitionTime")


def _ref(ref: Ref | None, *, kind: kinds.Kind, namespace: str, previous: object) -> JsonObj | None:
    if ref is None:
        return None
    if (
        ref.uid is None
        and isinstance(previous, Mapping)
        and previous.get("name") == ref.name
        and previous.get("namespace") == namespace
    ):
        return dict(previous)  # the object is gone; keep what we recorded about it
    out: JsonObj = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "name": ref.name,
        "namespace": namespace,
    }
    if ref.uid:
        out["uid"] = ref.uid
    return out


@dataclass(frozen=True, slots=True)
class RefNamespaces:
    agents: str
    """The pool's namespace (Agents live with the InfraEnv)."""
    machines: str
    """The hosted control plane namespace."""


def apply_vm(vm: JsonObj, record: VMRecord, *, where: RefNamespaces) -> bool:
    """Set the pool's fields of one `status.vm` dict in place; True when it changed."""
    desired: dict[str, Any] = {
        "phase": record.phase.value,
        "reason": record.reason.value,
        "agentRef": _ref(
            record.agent, kind=kinds.AGENT, namespace=where.agents, previous=vm.get("agentRef")
        ),
        "machineRef": _ref(
            record.machine,
            kind=kinds.MACHINE,
            namespace=where.machines,
            previous=vm.get("machineRef"),
        ),
        "lastTransitionTime": _transition_time(vm, record),
    }
    changed = False
    if not vm.get("name"):
        vm["name"] = record.name
        changed = True
    for key, value in desired.items():
        if value is None:
            if key in vm:
                del vm[key]
                changed = True
        elif vm.get(key) != value:
            vm[key] = value
            changed = True
    return changed


def _transition_time(vm: Mapping[str, Any], record: VMRecord) -> str:
    """The recorded time while the phase stays, else the planner's (moved) one."""
    recorded = vm.get("lastTransitionTime")
    if vm.get("phase") == record.phase.value and isinstance(recorded, str) and recorded:
        return recorded
    return format_time(record.last_transition)


def handover_wire(record: VMRecord) -> JsonObj | None:
    """`status.handover` as the planner wants it (None: no record)."""
    handover = record.handover
    if handover is None:
        return None
    out: JsonObj = {"fromAgentMachine": handover.from_}
    if handover.to:
        out["toAgentMachine"] = handover.to
    if handover.to_uid:
        out["toAgentMachineUID"] = handover.to_uid
    out["since"] = format_time(handover.since)
    return out


def apply_handover(status: JsonObj, record: VMRecord) -> bool:
    """Set or drop `status.handover` in place; True when it changed."""
    wanted = handover_wire(record)
    if wanted is None:
        return status.pop("handover", None) is not None
    if status.get("handover") == wanted:
        return False
    status["handover"] = wanted
    return True


def rendered_vm(previous: Mapping[str, Any], record: VMRecord, *, where: RefNamespaces) -> JsonObj:
    """`previous` (a cached `status.vm`) with the planner's fields applied, as a copy."""
    vm = dict(previous)
    apply_vm(vm, record, where=where)
    return vm


def owned_vm_entry(vm: Mapping[str, Any]) -> JsonObj:
    """A `status.ownedVMs[]` entry: the VsphereAgent's record, marked as backed by one."""
    if vm.get("source"):
        return dict(vm)
    return {**vm, "source": VMSource.VSPHERE_AGENT.value}


def action_wire(action: Action) -> JsonObj:
    out: JsonObj = {"type": action.type.value, "reason": action.reason}
    if action.name:
        out["name"] = action.name
    return out


def ejections_wire(counts: Mapping[ISOEjectedReason, int]) -> JsonObj:
    return to_wire(ISOEjectionCounts.from_reasons(r for r, n in counts.items() for _ in range(n)))


def counts_wire(counts: Counts) -> JsonObj:
    return {
        "desiredReplicas": counts.desired_replicas,
        "agentMachines": counts.agent_machines,
        "waitingAgentMachines": counts.waiting_agent_machines,
        "unreadyAgentMachines": counts.unready_agent_machines,
        "agentMachinesWithoutAgent": counts.agent_machines_without_agent,
        "matchingAgents": counts.matching_agents,
        "boundAgents": counts.bound_agents,
        "availableAgents": counts.available_agents,
    }


def spares_wire(spares: Spares) -> JsonObj | None:
    """`status.spares`; None (the field removed, or never written) while the pool keeps
    none and has none: a pool without spares writes exactly what it wrote before."""
    if not (spares.wanted or spares.ready or spares.creating):
        return None
    return {"wanted": spares.wanted, "ready": spares.ready, "creating": spares.creating}


@dataclass(frozen=True, slots=True)
class DesiredPoolStatus:
    """Everything the pool controller writes into a pool's status."""

    generation: int
    fields: Mapping[str, Any]
    conditions: Sequence[ConditionDecision]
    """The conditions decided here; Ready is derived in `apply_pool` unless given."""
    ready: ConditionDecision | None = None
    """A Ready decided by the controller itself (apply failed, deleting)."""


def desired_from_plan(
    plan: Plan,
    *,
    generation: int,
    owned_vms: Sequence[JsonObj],
    ready: ConditionDecision | None = None,
) -> DesiredPoolStatus:
    fields: dict[str, Any] = {
        **counts_wire(plan.counts),
        "ownedVMs": list(owned_vms),
        "plannedActions": [action_wire(a) for a in plan.actions],
        "isoEjections": ejections_wire(plan.iso_ejections),
        "spares": spares_wire(plan.spares),
    }
    decided = [c for c in plan.conditions if c.type != PoolConditionType.READY]
    return DesiredPoolStatus(generation=generation, fields=fields, conditions=decided, ready=ready)


def _observed(status: Mapping[str, Any], type_: PoolConditionType) -> Observed | None:
    found = conditions.get_condition(status, type=type_)
    if found is None:
        return None
    return Observed(
        str(found.get("status", ConditionStatus.UNKNOWN)),
        str(found.get("reason", "")),
        str(found.get("message", "")),
    )


def apply_pool(status: JsonObj, desired: DesiredPoolStatus, *, now: datetime) -> bool:
    """Set the pool controller's fields of a pool status dict in place; True if changed.

    `status["conditions"]` is replaced by a new list (never mutated in place), so a
    shallow copy of a cached status is enough to dry-run this.
    """
    changed = False
    if status.get("observedGeneration") != desired.generation:
        status["observedGeneration"] = desired.generation
        changed = True
    for key, value in desired.fields.items():
        if value is None:
            if key in status:
                del status[key]
                changed = True
        elif status.get(key) != value:
            status[key] = value
            changed = True
    current = [dict(c) for c in status.get("conditions") or () if isinstance(c, Mapping)]
    work: JsonObj = {"conditions": current}
    for decision in (*desired.conditions, _ready(status, desired)):
        changed |= conditions.set_condition(
            work,
            type=decision.type,
            value=decision.status,
            reason=decision.reason,
            message=decision.message,
            now=now,
            observed_generation=desired.generation,
        )
    status["conditions"] = work["conditions"]
    return changed


def pool_would_change(
    status: Mapping[str, Any] | None, desired: DesiredPoolStatus, *, now: datetime
) -> bool:
    """Dry-run `apply_pool` on a cached status without touching it."""
    return apply_pool(dict(status or {}), desired, now=now)


class Change(StrEnum):
    """How a pool's status would change, for `status_pacing`."""

    NONE = "none"
    ROUTINE = "routine"
    """Only what moves with every VM: counts, `ownedVMs`, `plannedActions`,
    `isoEjections`, condition messages (the CapacitySatisfied one quotes counts), and a
    condition's reason while its status stays (CapacitySatisfied False goes from
    DemandDeficit to Provisioning and back with every AgentMachine of a burst that
    CAPI has not marked waiting yet)."""
    TRANSITION = "transition"
    """A condition's status (or a condition appearing or going), or
    `observedGeneration` (a spec change seen): what `lastTransitionTime` marks."""


def _states(status: Mapping[str, Any]) -> dict[str, Any]:
    return {
        str(c.get("type")): c.get("status")
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    }


def _ready(status: Mapping[str, Any], desired: DesiredPoolStatus) -> ConditionDecision:
    return desired.ready or pool_conditions.ready(
        decided=desired.conditions,
        vsphere=_observed(status, PoolConditionType.VSPHERE_READY),
        iso=_observed(status, PoolConditionType.ISO_READY),
    )


def awaits_first_checks(status: Mapping[str, Any] | None, desired: DesiredPoolStatus) -> bool:
    """The pool controller never wrote this status (no `observedGeneration`) and its
    first write would say Ready=Unknown: the `infra` controller's vSphere and ISO
    checks of a new pool are still running."""
    status = status or {}
    return (
        "observedGeneration" not in status
        and _ready(status, desired).status == ConditionStatus.UNKNOWN
    )


def pool_change(
    status: Mapping[str, Any] | None, desired: DesiredPoolStatus, *, now: datetime
) -> Change:
    """Dry-run `apply_pool` on a cached status and say what kind of change it makes."""
    before = dict(status or {})
    after = dict(before)
    if not apply_pool(after, desired, now=now):
        return Change.NONE
    if before.get("observedGeneration") != after.get("observedGeneration") or _states(
        before
    ) != _states(after):
        return Change.TRANSITION
    return Change.ROUTINE
