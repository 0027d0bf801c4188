"""How the ISO ejection writes a VsphereAgent's status: record and condition, compare-and-set.

Every write is one `update_status` (fresh GET, PUT with resourceVersion) that changes
only `status.isoEjection` and the `ISOEjected` condition, and only when the record
stored at that moment is exactly the one the caller decided from (`expect`). A
caller working from a stale cache therefore writes nothing and looks again, so two
reconciles can never both advance an operation. `condition_edit` is the condition
alone, with the same compare, as an edit for `StatusWriter.write`: the gate's first
condition rides along with what the pass has pending (one status write per pass).

The object the PUT returns is the object as persisted (after the API server pruned
what the CRD does not declare): it is the read-back of a checkpoint. `Written.stored`
is the record found in it; a checkpoint whose record did not survive means the
VsphereAgent CRD predates the record (the CRDs were not applied with the controller).

`checkpoint` is that write plus its read-back check (raising `Stale` or
`CrdsOutdated`); `failed` reports `EjectionFailed` with a Warning event only when the
condition changes, so a failure that repeats under backoff writes nothing new (each
write would otherwise wake the controller at once and defeat the backoff).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from agentforge.api import conditions, kinds, wire
from agentforge.api.conditions import ISOEjectedReason, VsphereAgentConditionType
from agentforge.api.vsphereagent import ISOEjectionRecord
from agentforge.kube.events import EventType
from agentforge.reconcilers.vm.context import Edit, StatusWriter, VmInputs
from agentforge.vsphere import metrics as vmetrics

__all__ = [
    "CRDS_OUTDATED",
    "KEEP",
    "REFUSED",
    "CrdsOutdated",
    "EjectionEvent",
    "Stale",
    "Written",
    "checkpoint",
    "condition_edit",
    "current_reason",
    "emit",
    "failed",
    "same_record",
    "shows",
    "write",
]

JsonObj = dict[str, Any]
R = ISOEjectedReason


class EjectionEvent(StrEnum):
    """Reasons of the Events about ISO ejection (filterable with --field-selector)."""

    STARTED = "ISOEjectionStarted"
    MARKERS_STAMPED = "ISOEjectionMarkersStamped"
    QUESTION_RECORDED = "ISOLockQuestionRecorded"
    QUESTION_ANSWERED = "ISOLockQuestionAnswered"
    EJECTED = "ISOEjected"
    FAILED = "ISOEjectionFailed"
    CRDS_OUTDATED = "ISOEjectionCRDsOutdated"
    ABANDONED = "ISOEjectionAbandoned"


REFUSED: Final = "refused"
CRDS_OUTDATED: Final = (
    "status.isoEjection was not stored as written: the VsphereAgent CRD in the cluster "
    "predates ISO ejection and prunes its recovery record, so nothing was changed in "
    "vSphere. Update the CRDs together with the controller (kubectl apply -k config/crd, "
    "or make deploy); see docs/upgrade.md"
)


class Stale(Exception):
    """The stored record is not the one this reconcile decided from."""


class CrdsOutdated(Exception):
    """A checkpoint did not survive the write: the CRD lacks the record's fields."""

    def __init__(self, stored: ISOEjectionRecord | None) -> None:
        super().__init__(CRDS_OUTDATED)
        self.stored = stored


class _Keep:
    """Leave `status.isoEjection` as stored."""


KEEP: Final = _Keep()


@dataclass(frozen=True, slots=True)
class Written:
    applied: bool
    """The stored record equalled `expect`, so the edit was applied (or was a no-op)."""
    stored: ISOEjectionRecord | None
    """The record the API server holds after the write."""


def parse(value: object) -> ISOEjectionRecord | None:
    return ISOEjectionRecord.model_validate(value) if isinstance(value, dict) else None


def same_record(a: ISOEjectionRecord | None, b: ISOEjectionRecord | None) -> bool:
    """Equal as the API server would store them (whole-second times, wire spelling)."""
    if a is None or b is None:
        return a is b
    return wire.to_wire(a) == wire.to_wire(b)


def current_reason(inputs: VmInputs) -> ISOEjectedReason | None:
    """The cached ISOEjected reason (None: no condition, or one we do not know)."""
    for condition in inputs.agent.status.conditions:
        if condition.type == VsphereAgentConditionType.ISO_EJECTED:
            try:
                return ISOEjectedReason(condition.reason)
            except ValueError:
                return None
    return None


def shows(inputs: VmInputs, reason: ISOEjectedReason, message: str) -> bool:
    """The cache already shows exactly this condition (so writing it would change nothing)."""
    for condition in inputs.agent.status.conditions:
        if condition.type == VsphereAgentConditionType.ISO_EJECTED:
            return condition.reason == reason and condition.message == message
    return False


async def write(
    inputs: VmInputs,
    writer: StatusWriter,
    *,
    expect: ISOEjectionRecord | None,
    record: ISOEjectionRecord | _Keep | None = KEEP,
    reason: ISOEjectedReason | None = None,
    message: str = "",
) -> Written:
    """Set the record and/or the condition, only if the stored record equals `expect`."""
    uid = inputs.agent.metadata.uid
    generation = inputs.agent.metadata.generation
    now = inputs.now
    applied = False

    def mutate(obj: JsonObj) -> JsonObj | None:
        nonlocal applied
        if (obj.get("metadata") or {}).get("uid") != uid:
            return None
        status = obj.setdefault("status", {})
        if not same_record(parse(status.get("isoEjection")), expect):
            return None
        applied = True
        before = copy.deepcopy(status)
        if isinstance(record, ISOEjectionRecord):
            status["isoEjection"] = wire.to_wire(record)
        elif record is None:
            status.pop("isoEjection", None)
        if reason is not None:
            set_condition(status, reason, message, now=now, generation=generation)
        return obj if status != before else None

    stored = await inputs.deps.client.update_status(
        kinds.VSPHERE_AGENT,
        namespace=inputs.agent.metadata.namespace,
        name=inputs.agent.metadata.name,
        mutate=mutate,
    )
    writer.saw(stored)
    return Written(applied=applied, stored=parse((stored.get("status") or {}).get("isoEjection")))


def condition_edit(
    inputs: VmInputs, *, expect: ISOEjectionRecord | None, reason: ISOEjectedReason, message: str
) -> Edit:
    """`ISOEjected` as a `StatusWriter` edit, set only while the stored record is `expect`:
    `writer.write(condition_edit(...))` carries the pass's pending edits (the Ready
    condition, a new VM's identity) in the same request."""
    generation = inputs.agent.metadata.generation
    now = inputs.now

    def edit(obj: JsonObj) -> None:
        status = obj["status"]
        if same_record(parse(status.get("isoEjection")), expect):
            set_condition(status, reason, message, now=now, generation=generation)

    return edit


def set_condition(
    status: JsonObj, reason: ISOEjectedReason, message: str, *, now: datetime, generation: int
) -> None:
    conditions.set_condition(
        status,
        type=VsphereAgentConditionType.ISO_EJECTED,
        value=conditions.ConditionStatus.TRUE
        if reason is R.EJECTED
        else conditions.ConditionStatus.FALSE,
        reason=reason,
        message=message,
        now=now,
        observed_generation=generation,
    )


async def emit(inputs: VmInputs, type_: EventType, reason: EjectionEvent, message: str) -> None:
    await inputs.deps.events.record(inputs.raw, type=type_, reason=reason, message=message)


async def checkpoint(
    inputs: VmInputs,
    writer: StatusWriter,
    record: ISOEjectionRecord,
    new: ISOEjectionRecord,
    *,
    reason: ISOEjectedReason | None = None,
    message: str = "",
) -> ISOEjectionRecord:
    """Write `new` over `record` and read it back; raises `Stale` or `CrdsOutdated`."""
    written = await write(inputs, writer, expect=record, record=new, reason=reason, message=message)
    if not written.applied:
        raise Stale
    if not same_record(written.stored, new):
        raise CrdsOutdated(written.stored)
    return new


async def failed(
    inputs: VmInputs,
    writer: StatusWriter,
    record: ISOEjectionRecord | None,
    message: str,
    *,
    event: EjectionEvent = EjectionEvent.FAILED,
    result: str | None = REFUSED,
) -> None:
    """EjectionFailed (record kept) and a Warning event when the condition changes.

    Every attempt that ends here without a vSphere call of its own is counted as
    `agent_forge_iso_operations_total{operation="eject", result}` (what the vSphere
    layer counts for the calls it makes), so a refusal that persists keeps the
    failing-ejection alert firing; `result=None` for failures the layer counted.
    """
    if result is not None:
        vmetrics.iso_op("eject", result)
    message = f"{message}; retried with backoff"
    if shows(inputs, ISOEjectedReason.EJECTION_FAILED, message):
        return
    written = await write(
        inputs, writer, expect=record, reason=ISOEjectedReason.EJECTION_FAILED, message=message
    )
    if written.applied:
        await emit(inputs, EventType.WARNING, event, message)
