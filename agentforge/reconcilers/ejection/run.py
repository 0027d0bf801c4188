"""Carrying out one recorded ISO ejection, step by step, each step checkpointed first.

`carry_out` runs the operation in `status.isoEjection` as far as it can go in one
reconcile: `ejection_decide.next_step` names the next step from the record and the
latest observation (the VM's facts, or the outcome of the last vSphere call), this
module applies it and observes again. The order of effects is the safety argument:

1. the phase `DisconnectIssued` is checkpointed (and read back) before the CD-ROM
   reconfigure is sent; a restart in that phase first looks for a reconfigure still
   running on the VM and only re-sends one when none is;
2. a CD-lock question seen while our disconnect runs is checkpointed with its id
   before it is answered, and only that id is ever answered (the vSphere layer also
   checks the id and the `msg.cdromdisconnect.locked` message before `AnswerVM`);
3. the record is cleared, with `ISOEjected=True/Ejected`, only once the recorded
   device is observed empty (our own reconfigure finished, or facts read after
   someone else's finished).

Refusals (changed media, another question, not our VM) touch nothing, keep the
record, set `EjectionFailed` and retry with the queue's backoff. No worker waits on
the reconfigure (docs/design/0005): it takes a task slot of the vCenter, and while it
runs without a question the pass ends (its moref checkpointed in the record when we
started it); its end, or a question the VM raises meanwhile, reconciles the
VsphereAgent again (`waits.TaskWaits`), which observes afresh and carries on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final, TypeVar

from agentforge import vsphere
from agentforge.api.conditions import ISOEjectedReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import ISOEjectionPhase, ISOEjectionRecord
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.ejection import decide, gate, status
from agentforge.reconcilers.vm import stamp as vm_stamp
from agentforge.reconcilers.vm.context import StatusWriter, VcenterApi, VmInputs
from agentforge.vsphere import metrics as vmetrics

__all__ = ["Finished", "carry_out", "restarted"]

R = ISOEjectedReason
P = ISOEjectionPhase
S = decide.StepKind
E = status.EjectionEvent
T = TypeVar("T")

MAX_STEPS: Final = 12
TASK_WAIT_SECONDS: Final = 120.0
"""Longest a disconnect may take to start (it is followed, never waited for)."""
POLL_SECONDS: Final = 5.0
"""Look again after this long when a task or an answer is still being applied."""
STALE_SECONDS: Final = 1.0
"""The stored record moved on since the cache saw it: decide again on fresh data."""


@dataclass(frozen=True, slots=True)
class Finished:
    """Where one reconcile left the operation."""

    done: bool
    """The record is cleared (or dropped while finalizing)."""
    result: Result | None = None


@dataclass(slots=True)
class _Op:
    """The operation as far as this reconcile got (what a failure report must name)."""

    record: ISOEjectionRecord
    vm: vsphere.VmFacts | None
    counted: bool = False
    """The vSphere layer counted this disconnect's end (a disconnect that ended within
    its own call); one that ended while followed is counted when observed."""


def restarted(record: ISOEjectionRecord, *, now: datetime) -> ISOEjectionRecord:
    """A fresh attempt at the same VM, device and medium (phase Recorded, one more attempt)."""
    return ISOEjectionRecord.model_validate(
        {
            **record.model_dump(exclude={"phase", "question_id", "task_ref", "started_at"}),
            "phase": P.RECORDED,
            "disconnect_started": False,
            "started_at": now,
            "attempts": record.attempts + 1,
        }
    )


async def _bounded(call: Awaitable[T]) -> T:
    async with asyncio.timeout(TASK_WAIT_SECONDS):
        return await call


async def carry_out(
    inputs: VmInputs,
    writer: StatusWriter,
    *,
    service: VcenterApi,
    pool: VsphereAgentPool,
    record: ISOEjectionRecord,
    vm: vsphere.VmFacts | None,
    finalizing: bool,
) -> Finished:
    """Advance the recorded ejection from the VM's facts `vm` (just read)."""
    op = _Op(record=record, vm=vm)
    try:
        return await _run(inputs, writer, service, pool, op, finalizing=finalizing)
    except status.Stale:
        return Finished(False, Result(requeue_after=STALE_SECONDS))
    except status.CrdsOutdated as exc:
        await status.failed(inputs, writer, exc.stored, status.CRDS_OUTDATED, event=E.CRDS_OUTDATED)
        return Finished(False, Result(requeue=True))
    except TimeoutError:
        message = (
            f"still waiting for the CD-ROM reconfigure of VM {op.record.vm_name} (or its "
            "question); looking again shortly"
        )
        await status.write(
            inputs, writer, expect=op.record, reason=R.EJECTION_IN_PROGRESS, message=message
        )
        return Finished(False, Result(requeue_after=POLL_SECONDS))
    except (vsphere.OwnershipMismatch, vsphere.MediaMismatch, vsphere.QuestionRefused) as exc:
        await status.failed(inputs, writer, op.record, f"refused: {exc}", result=None)
        return Finished(False, Result(requeue=True))
    except vsphere.VsphereError as exc:
        await status.failed(  # the vSphere layer counted the eject or answer that failed
            inputs,
            writer,
            op.record,
            f"ejecting the ISO of VM {op.record.vm_name} failed: {exc}",
            result=None,
        )
        return Finished(False, Result(requeue=True))


async def _run(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    pool: VsphereAgentPool,
    op: _Op,
    *,
    finalizing: bool,
) -> Finished:
    markers = decide.record_markers(op.record) or pool_specs.markers(
        pool, vsphere_agent=inputs.agent.metadata.name
    )
    seen = decide.Observation.of_vm(op.record, op.vm, expected=markers)
    if await vm_stamp.just_stamped(inputs.vcenter, service):  # (the stamp a previous pass started)
        await _stamped(inputs, op.record, markers)
    for _ in range(MAX_STEPS):
        record = op.record
        step = decide.next_step(record, seen, server=service.vcenter, finalizing=finalizing)
        if step.kind is S.DONE:
            if record.task_ref and not op.counted:  # a followed disconnect that ended
                vmetrics.iso_op("eject", vsphere.EjectState.EJECTED.value)
            return await _done(
                inputs, writer, pool, record, op.vm, seen=step.message, finalizing=finalizing
            )
        if step.kind is S.DROP:
            message = (
                f"ejection abandoned because the VsphereAgent is being deleted: {step.message}"
            )
            await status.write(
                inputs,
                writer,
                expect=record,
                record=None,
                reason=R.EJECTION_FAILED,
                message=message,
            )
            await status.emit(inputs, EventType.WARNING, E.ABANDONED, message)
            return Finished(True)
        if step.kind is S.REFUSE:
            await status.failed(inputs, writer, record, step.message)
            return Finished(False, Result(requeue=True))
        if step.kind is S.RESTART:
            fresh = restarted(record, now=inputs.now)
            await status.checkpoint(
                inputs, writer, record, fresh, reason=R.EJECTION_FAILED, message=step.message
            )
            await status.emit(inputs, EventType.WARNING, E.FAILED, step.message)
            return Finished(False, Result(requeue=True))
        if step.kind is S.WAIT:
            await status.write(
                inputs, writer, expect=record, reason=R.EJECTION_IN_PROGRESS, message=step.message
            )
            return Finished(False, Result(requeue_after=POLL_SECONDS))
        if step.kind is S.STAMP:
            stamped = await vm_stamp.ensure_stamped(
                inputs.vcenter,
                service,
                datacenter=record.datacenter,
                bios_uuid=record.bios_uuid,
                markers=markers,
            )
            if isinstance(stamped, Result):  # the stamp runs; its end wakes the key
                return Finished(False, stamped)
            op.vm = stamped
            seen = decide.Observation.of_vm(record, op.vm, expected=markers)
            await _stamped(inputs, record, markers)
        elif step.kind is S.RECORD_QUESTION:
            assert step.question_id is not None
            await _record_question(
                inputs, writer, op, question_id=step.question_id, task=seen.task_id
            )
        else:  # ISSUE, ANSWER, FOLLOW: each ends observing the reconfigure
            if step.kind is S.ISSUE:
                observed = await _issue(inputs, writer, service, op, markers)
            else:
                if step.kind is S.ANSWER:
                    await _answer(inputs, writer, service, op, markers)
                observed = await _follow(inputs, service, op, markers)
            if isinstance(observed, _Running):  # the pass ends; its end wakes the key
                return Finished(False, inputs.vcenter.wait_task(service, observed.task))
            seen = observed
    return Finished(False, Result(requeue_after=POLL_SECONDS))


async def _stamped(
    inputs: VmInputs, record: ISOEjectionRecord, markers: vsphere.OwnershipMarkers
) -> None:
    await status.emit(
        inputs,
        EventType.NORMAL,
        E.MARKERS_STAMPED,
        f"VM {record.vm_name} had no ownership markers; its BIOS UUID and name are the "
        f"recorded ones, so {markers.describe()} was stamped before the ejection",
    )


@dataclass(frozen=True, slots=True)
class _Running:
    """Our reconfigure runs without a question: followed, not waited for."""

    task: str


async def _issue(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    op: _Op,
    markers: vsphere.OwnershipMarkers,
) -> decide.Observation | _Running:
    """Claim a task slot, checkpoint DisconnectIssued (a confirming read when already
    there), then send it; a reconfigure that runs on gets its moref checkpointed."""
    record = op.record
    first = record.phase is P.RECORDED
    slot = inputs.vcenter.claim_slot(service)  # raises TaskSlotPending: woken in the pool's turn
    try:
        op.record = record = await status.checkpoint(
            inputs,
            writer,
            record,
            record.advanced(P.DISCONNECT_ISSUED) if first else record,
            reason=R.EJECTION_IN_PROGRESS,
            message=f"disconnecting CD-ROM {record.device_key} of VM {record.vm_name} "
            f"({record.iso_path})",
        )
        if first:
            reached(CrashPoint.DISCONNECT_RECORDED)
        outcome = await _bounded(
            service.eject_cdrom(
                datacenter=record.datacenter,
                vm_uuid=record.bios_uuid,
                device_key=record.device_key,
                expected_backing=record.iso_path,
                markers=markers,
                slot=slot,
            )
        )
    finally:
        if slot.task is None:
            slot.release()
    if outcome.state is vsphere.EjectState.QUESTION_PENDING:
        reached(CrashPoint.DISCONNECT_ISSUED)
    op.counted = outcome.state is vsphere.EjectState.EJECTED
    if outcome.state is vsphere.EjectState.IN_PROGRESS and outcome.task_id:
        op.record = await status.checkpoint(
            inputs,
            writer,
            record,
            record.advanced(P.DISCONNECT_ISSUED, task_ref=outcome.task_id),
            reason=R.EJECTION_IN_PROGRESS,
            message=f"disconnecting CD-ROM {record.device_key} of VM {record.vm_name} "
            f"({record.iso_path}): task {outcome.task_id} runs",
        )
        return _Running(outcome.task_id)
    return decide.Observation.of_outcome(record, outcome)


async def _record_question(
    inputs: VmInputs, writer: StatusWriter, op: _Op, *, question_id: str, task: str | None
) -> None:
    """Checkpoint the lock question's id (and the task it holds) before anything answers."""
    record = op.record
    op.record = await status.checkpoint(
        inputs,
        writer,
        record,
        record.advanced(P.QUESTION_RECORDED, question_id=question_id, task_ref=task),
        reason=R.EJECTION_IN_PROGRESS,
        message=f"the guest of VM {record.vm_name} locked its CD-ROM door; answering only its "
        f"question {question_id}",
    )
    await status.emit(
        inputs,
        EventType.NORMAL,
        E.QUESTION_RECORDED,
        f"VM {record.vm_name} asks {question_id} (CD-ROM door locked by the guest); recorded "
        "before answering",
    )
    reached(CrashPoint.QUESTION_RECORDED)


async def _answer(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    op: _Op,
    markers: vsphere.OwnershipMarkers,
) -> None:
    """Answer the recorded question Yes (the record confirmed first), then checkpoint it."""
    record = op.record
    assert record.question_id is not None
    await status.checkpoint(inputs, writer, record, record)
    await service.answer_cdrom_lock_question(
        datacenter=record.datacenter,
        vm_uuid=record.bios_uuid,
        question_id=record.question_id,
        markers=markers,
    )
    reached(CrashPoint.ANSWERED)
    op.record = await status.checkpoint(
        inputs,
        writer,
        record,
        record.advanced(P.ANSWERED),
        reason=R.EJECTION_IN_PROGRESS,
        message=f"answered the CD-ROM lock question {record.question_id} of VM "
        f"{record.vm_name}; waiting for the disconnect to finish",
    )
    await status.emit(
        inputs,
        EventType.NORMAL,
        E.QUESTION_ANSWERED,
        f"answered Yes to the CD-ROM lock question {record.question_id} of VM "
        f"{record.vm_name}, the one recorded for its disconnect",
    )


async def _follow(
    inputs: VmInputs, service: VcenterApi, op: _Op, markers: vsphere.OwnershipMarkers
) -> decide.Observation | _Running:
    """Observe a reconfigure running on the VM: its question, or (running on) follow
    it. One that is not provably ours (its task is not the recorded one) ending is
    checked against fresh facts, never trusted."""
    record = op.record
    outcome = await service.resume_eject(
        datacenter=record.datacenter, vm_uuid=record.bios_uuid, device_key=record.device_key
    )
    if outcome.state is vsphere.EjectState.IN_PROGRESS and outcome.task_id:
        return _Running(outcome.task_id)
    if outcome.state is vsphere.EjectState.QUESTION_PENDING and record.phase is P.DISCONNECT_ISSUED:
        reached(CrashPoint.DISCONNECT_ISSUED)  # sent and asked, not recorded yet
    ours = outcome.task_id is None or outcome.task_id == record.task_ref
    if outcome.state is vsphere.EjectState.EJECTED and not ours:
        op.vm = await service.vm_by_uuid(datacenter=record.datacenter, bios_uuid=record.bios_uuid)
        return decide.Observation.of_vm(record, op.vm, expected=markers)
    return decide.Observation.of_outcome(record, outcome)


async def _done(
    inputs: VmInputs,
    writer: StatusWriter,
    pool: VsphereAgentPool,
    record: ISOEjectionRecord,
    vm: vsphere.VmFacts | None,
    *,
    seen: str,
    finalizing: bool,
) -> Finished:
    reached(CrashPoint.EJECTED)
    more = []
    if vm is not None and not finalizing:
        more = [
            c
            for c in gate.candidates(
                vm.cdroms,
                datastore=pool.spec.vsphere.iso_datastore,
                prefix=pool.effective_path_prefix(),
            )
            if c.key != record.device_key
        ]
    message = seen
    reason = R.EJECTED
    result = None
    if more:
        reason, result = R.EJECTION_IN_PROGRESS, Result(requeue_after=STALE_SECONDS)
        message += f"; CD-ROM {more[0].key} holds a discovery ISO too and is ejected next"
    written = await status.write(
        inputs, writer, expect=record, record=None, reason=reason, message=message
    )
    if not written.applied:
        raise status.Stale
    await status.emit(inputs, EventType.NORMAL, E.EJECTED, message)
    return Finished(True, result)


# TEST ONLY: stop the process dead at a chosen ISO ejection step boundary.
#
# The e2e suite proves that an ejection survives `kill -9` at every step boundary. Some
# boundaries (between a status checkpoint and the next vSphere call) are microseconds
# wide and cannot be hit from outside, so the operator offers one opt-in hook:
# `AGENT_FORGE_TEST_CRASH_AT=<point>` makes `reached(point)` end the process with
# `os._exit(137)` (what SIGKILL leaves behind: no drain, no Lease release, no cleanup)
# right after that step.
#
# Off by default: the variable is read from the environment only, is not a setting, is
# never set by `config/` manifests or the container image, and an unknown value does
# nothing. Nothing else in the operator reads it.

log = logging.getLogger(__name__)

CRASH_ENV: Final = "AGENT_FORGE_TEST_CRASH_AT"
CRASH_EXIT_CODE: Final = 137


class CrashPoint(StrEnum):
    """Step boundaries of one ejection, in the order they are passed."""

    RECORDED = "recorded"
    """`status.isoEjection` written and read back; nothing issued in vSphere."""
    DISCONNECT_RECORDED = "disconnect-recorded"
    """Phase DisconnectIssued checkpointed; the reconfigure is not sent yet."""
    DISCONNECT_ISSUED = "disconnect-issued"
    """The reconfigure was sent and the guest's lock question seen, not yet recorded."""
    QUESTION_RECORDED = "question-recorded"
    """The lock question's id checkpointed; not answered yet."""
    ANSWERED = "answered"
    """AnswerVM returned; phase Answered not checkpointed yet."""
    EJECTED = "ejected"
    """The medium is gone; the record is not cleared yet."""


def reached(point: CrashPoint) -> None:
    """Exit the process at once when the test hook names this point; else nothing."""
    if os.environ.get(CRASH_ENV) != point.value:
        return
    log.critical("test crash point reached, exiting", extra={"crash_point": point.value})
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(CRASH_EXIT_CODE)
