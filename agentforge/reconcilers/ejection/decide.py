"""Resuming a recorded ISO ejection, pure: the next step from the record and what was seen.

No I/O, no clock: `ejection_run` observes and applies. The rules (the seed's "Discovery
ISO lifecycle"; starting one is `ejection_gate`):

* the record alone decides; the VM must still be ours (our markers, or unmarked with
  the recorded name before anything was issued: then our markers are stamped first)
  and on the recorded vCenter;
* the recorded device must hold exactly the recorded medium, or be empty (done);
  other media is a refusal;
* only a `msg.cdromdisconnect.locked` question seen while our disconnect runs is
  recorded, and only the recorded id is ever answered; any other question, or one
  pending before our disconnect was issued, is a refusal;
* a lock question that vanished without our answer while the medium stayed means a
  person answered (No): that is respected, never re-asked; a disconnect that failed
  after our own Yes is retried as a fresh attempt;
* a refusal touches nothing and keeps the record (reported, retried with backoff); a
  finalizing VsphereAgent drops a record whose disconnect was never issued (nothing
  is in flight) rather than wait for a person;
* a phase this version does not know (another version wrote it) may have anything in
  flight: a running reconfigure is followed and an emptied device still ends the
  operation, but nothing is issued, answered, restarted or dropped (docs/design/0003).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agentforge.api.vsphereagent import ISOEjectionPhase, ISOEjectionRecord
from agentforge.vsphere.model import markers as vmarkers
from agentforge.vsphere.model.facts import (
    Cdrom,
    EjectOutcome,
    EjectState,
    MediumKind,
    Question,
    VmFacts,
)
from agentforge.vsphere.model.markers import OwnershipMarkers, Verdict

__all__ = [
    "Device",
    "Observation",
    "Step",
    "StepKind",
    "device_state",
    "next_step",
    "record_markers",
]

P = ISOEjectionPhase


# --- resuming a record --------------------------------------------------------------------


class Device(enum.Enum):
    """The recorded CD-ROM as last observed."""

    ATTACHED = "holds the recorded ISO"
    EMPTY = "disconnected and empty"
    OTHER = "holds other media"
    GONE = "no longer exists"
    UNKNOWN = "not observed"


def device_state(record: ISOEjectionRecord, cdrom: Cdrom | None) -> Device:
    if cdrom is None:
        return Device.GONE
    if cdrom.is_empty():
        return Device.EMPTY
    if cdrom.kind is MediumKind.ISO and cdrom.backing_file == record.iso_path:
        return Device.ATTACHED
    return Device.OTHER


@dataclass(frozen=True, slots=True)
class Observation:
    """What is known of the recorded VM right now (from its facts or a task outcome)."""

    exists: bool = True
    verdict: Verdict | None = None
    """Its markers against the expected ones (None: not read in this observation)."""
    name_matches: bool = True
    """Its name is the recorded one (what lets an unmarked VM count as ours)."""
    device: Device = Device.UNKNOWN
    medium: str | None = None
    question: Question | None = None
    running: bool | None = None
    """A reconfigure of the VM is running (None: unknown; resume to find out)."""
    ejected: bool = False
    """Our own reconfigure finished: the device is as the eject spec set it."""
    task_id: str | None = None

    @classmethod
    def of_vm(
        cls,
        record: ISOEjectionRecord,
        vm: VmFacts | None,
        *,
        expected: OwnershipMarkers,
    ) -> Observation:
        if vm is None:
            return cls(exists=False)
        found = vm.cdrom(record.device_key)
        return cls(
            verdict=vmarkers.verdict(found=vm.markers, expected=expected),
            name_matches=vm.name == record.vm_name,
            device=device_state(record, found),
            medium=found.backing_file if found else None,
            question=vm.question,
        )

    @classmethod
    def of_outcome(cls, record: ISOEjectionRecord, outcome: EjectOutcome) -> Observation:
        """A task outcome; an EJECTED outcome is only passed here when it is our own task."""
        if outcome.state is EjectState.EJECTED:
            return cls(ejected=True, device=Device.EMPTY, task_id=outcome.task_id)
        if outcome.state is EjectState.QUESTION_PENDING:
            return cls(running=True, question=outcome.question, task_id=outcome.task_id)
        found = outcome.cdrom
        return cls(
            running=False,
            device=device_state(record, found),
            medium=found.backing_file if found else None,
            question=outcome.question,
        )


def record_markers(record: ISOEjectionRecord) -> OwnershipMarkers | None:
    """The markers the record demands (None: a Go operator record, which names none)."""
    o = record.ownership
    if o is None:
        return None
    return OwnershipMarkers(
        pool_namespace=o.pool_namespace,
        pool_name=o.pool_name,
        pool_uid=o.pool_uid,
        vsphere_agent=o.vsphere_agent,
    )


class StepKind(enum.Enum):
    STAMP = "write our markers onto the unmarked VM the record names (UUID and name match)"
    ISSUE = "checkpoint DisconnectIssued (if not yet), then disconnect the CD-ROM"
    FOLLOW = "find the running reconfigure and wait for it or its question"
    RECORD_QUESTION = "checkpoint the lock question's id"
    ANSWER = "answer the recorded lock question Yes"
    WAIT = "the answer is not applied yet: look again shortly"
    RESTART = "the disconnect failed after our Yes: record a fresh attempt"
    DONE = "the recorded medium is no longer attached: clear the record"
    REFUSE = "touch nothing, report, retry with backoff"
    DROP = "the VsphereAgent is finalizing and nothing is in flight: drop the record"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    message: str = ""
    question_id: str | None = None


def _refuse(message: str, *, record: ISOEjectionRecord, finalizing: bool) -> Step:
    """Touch nothing; a finalizing VsphereAgent drops a record nothing was issued for."""
    if finalizing and record.phase is P.RECORDED:
        return Step(StepKind.DROP, f"{message}; the disconnect was never issued")
    return Step(StepKind.REFUSE, f"{message}; nothing was touched")


def next_step(
    record: ISOEjectionRecord, seen: Observation, *, server: str | None, finalizing: bool
) -> Step:
    """The next action on a recorded ejection; REFUSE and DROP carry the message."""
    vm = f"VM {record.vm_name} (BIOS UUID {record.bios_uuid})"
    if not seen.exists:
        if finalizing:
            return Step(StepKind.DROP, f"{vm} no longer exists")
        return Step(
            StepKind.REFUSE,
            f"{vm} not found in datacenter {record.datacenter}; the ejection record is kept",
        )
    unmarked = seen.verdict is Verdict.UNMARKED
    if seen.verdict is Verdict.FOREIGN:
        return _refuse(
            f"{vm} carries another owner's ownership markers", record=record, finalizing=finalizing
        )
    if unmarked and not seen.name_matches:
        return _refuse(
            f"the VM with BIOS UUID {record.bios_uuid} carries no ownership markers and is not "
            f"named {record.vm_name} as recorded",
            record=record,
            finalizing=finalizing,
        )
    if unmarked:
        if record.phase is P.RECORDED:
            return Step(StepKind.STAMP)
        return _refuse(f"{vm} lost its ownership markers", record=record, finalizing=finalizing)
    if record.server and server and record.server != server:
        return _refuse(
            f"the ejection was recorded on vCenter {record.server}, but the pool now uses {server}",
            record=record,
            finalizing=finalizing,
        )
    if seen.ejected or seen.device in (Device.EMPTY, Device.GONE):
        return Step(StepKind.DONE, _done(record, seen, vm=vm))
    if seen.device is Device.OTHER:
        return _refuse(
            f"CD-ROM {record.device_key} of {vm} holds {seen.medium or 'other media'}, not the "
            f"recorded {record.iso_path} (the media changed)",
            record=record,
            finalizing=finalizing,
        )
    if record.known_phase is None:
        return _unknown_phase(record, seen, vm=vm, finalizing=finalizing)
    if seen.question is not None:
        return _with_question(record, seen, seen.question, vm=vm, finalizing=finalizing)
    if record.phase is P.RECORDED:
        return Step(StepKind.ISSUE)
    if seen.running is not False:
        return Step(StepKind.FOLLOW)
    if record.phase is P.DISCONNECT_ISSUED:
        return Step(StepKind.ISSUE)
    if record.phase is P.QUESTION_RECORDED:
        return _refuse(
            f"the lock question {record.question_id} of {vm} is gone but CD-ROM "
            f"{record.device_key} still holds {record.iso_path}: someone else answered it (No?) "
            "or the disconnect failed, and agent-forge does not override a person's answer; to "
            "try again, remove status.isoEjection (kubectl patch vsphereagent <name> "
            "--subresource=status --type=json -p "
            """'[{"op":"remove","path":"/status/isoEjection"}]')""",
            record=record,
            finalizing=finalizing,
        )
    return Step(
        StepKind.RESTART,
        f"the disconnect of CD-ROM {record.device_key} of {vm} failed after its lock question "
        f"{record.question_id} was answered Yes; a fresh attempt starts after a backoff",
    )


def _done(record: ISOEjectionRecord, seen: Observation, *, vm: str) -> str:
    """What the end of an operation saw: our eject, someone else's, or no device at all."""
    device = f"CD-ROM {record.device_key} of {vm}"
    if seen.device is Device.GONE:
        return (
            f"{device} no longer exists (the device was removed from the VM), so "
            f"{record.iso_path} is no longer attached"
        )
    if seen.ejected or record.phase is not P.RECORDED:
        return f"{record.iso_path} was ejected from {device}: the device is disconnected and empty"
    return (
        f"{device} was found disconnected and empty before agent-forge sent its disconnect: "
        f"{record.iso_path} was removed outside agent-forge"
    )


def _unknown_phase(
    record: ISOEjectionRecord, seen: Observation, *, vm: str, finalizing: bool
) -> Step:
    """Another version's phase: observe what runs, act on nothing (the record is kept)."""
    if seen.running is None:
        return Step(StepKind.FOLLOW)
    return _refuse(
        f"the ejection of CD-ROM {record.device_key} of {vm} was recorded in phase "
        f"{record.phase!r}, which this agent-forge version does not know (another version "
        f"wrote it), and the CD-ROM still holds {record.iso_path}: no disconnect is issued and "
        "no question answered for it; let the version that wrote it finish, or remove "
        "status.isoEjection to start over (kubectl patch vsphereagent <name> "
        "--subresource=status --type=json -p "
        """'[{"op":"remove","path":"/status/isoEjection"}]')""",
        record=record,
        finalizing=finalizing,
    )


def _with_question(
    record: ISOEjectionRecord,
    seen: Observation,
    question: Question,
    *,
    vm: str,
    finalizing: bool,
) -> Step:
    """A question is pending: only the lock question of our own disconnect is ours."""
    shown = f"question {question.id} ({', '.join(question.message_ids) or question.text})"

    def refuse(message: str) -> Step:
        return _refuse(message, record=record, finalizing=finalizing)

    if record.phase is P.RECORDED:
        return refuse(
            f"{vm} shows {shown}, which was pending before agent-forge sent its disconnect"
        )
    if not question.is_cdrom_lock:
        return refuse(
            f"{vm} shows {shown}, which is not the CD-ROM lock question; it is left for a "
            "person to answer in vSphere"
        )
    if record.phase is P.DISCONNECT_ISSUED:
        if seen.running is None:
            return Step(StepKind.FOLLOW)
        if seen.running:
            return Step(StepKind.RECORD_QUESTION, question_id=question.id)
        return refuse(f"{vm} shows {shown}, but agent-forge's disconnect is not running")
    if question.id != record.question_id:
        return refuse(f"{vm} shows {shown}, not the recorded question {record.question_id}")
    if record.phase is P.QUESTION_RECORDED:
        return Step(StepKind.ANSWER, question_id=question.id)
    return Step(
        StepKind.WAIT,
        f"{vm} still shows question {question.id}, answered Yes; waiting for the answer to apply",
    )
