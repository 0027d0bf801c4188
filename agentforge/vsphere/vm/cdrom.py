"""Ejecting the discovery ISO from one CD-ROM, and the one question we may answer.

Promises (DOMAIN.md section 4, the seed's ejection rules):
- a CD-ROM is touched only when the VM carries our exact markers and the device
  holds exactly the expected backing file; otherwise a typed refusal, nothing sent;
- the eject is a `ReconfigVM_Task` that disconnects the device and clears its
  medium; it is started and followed (`Session.follow`), never waited for: `eject`
  reports it `IN_PROGRESS`, and its end, or a question the VM raises meanwhile, is
  news for the caller;
- `answer_lock_question` answers "0" (Yes) only when the VM's current question has
  the given id and the message `msg.cdromdisconnect.locked`; any other is refused;
- no automatic-answer option is ever set on the VM;
- `resume` (after that news, or a restart) reports the device's state: a
  reconfigure still running on the VM (its `recentTask`) with its pending question
  (`QUESTION_PENDING`, returned with id, message ids and text so the caller can
  checkpoint it before anything answers it), or without one (`IN_PROGRESS`, followed
  again); else the device as it is, so the caller decides from facts, not memory.
"""

from __future__ import annotations

from typing import Any

from agentforge.vsphere import metrics, vmomi
from agentforge.vsphere.model import errors, markers
from agentforge.vsphere.model.facts import EjectOutcome, EjectState
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks.slots import Slot
from agentforge.vsphere.vm import build_specs as specs
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vmomi import PC, vim

RECONFIGURE_IDS = frozenset({"VirtualMachine.reconfigure", "VirtualMachine.reconfigVm"})
YES = "0"


async def eject(
    session: Session,
    *,
    datacenter_name: str,
    bios_uuid: str,
    device_key: int,
    expected_backing: str,
    expected_markers: markers.OwnershipMarkers,
    slot: Slot,
) -> EjectOutcome:
    """Start disconnecting the CD-ROM and follow it (never wait); `slot` is bound to
    the started reconfigure or released."""
    try:
        with metrics.counted("iso", "eject") as counted:
            outcome = await _eject(
                session,
                datacenter_name=datacenter_name,
                bios_uuid=bios_uuid,
                device_key=device_key,
                expected_backing=expected_backing,
                expected_markers=expected_markers,
                slot=slot,
            )
            counted.result = outcome.state.value
            return outcome
    finally:
        if slot.task is None:
            slot.release()


async def _eject(
    session: Session,
    *,
    datacenter_name: str,
    bios_uuid: str,
    device_key: int,
    expected_backing: str,
    expected_markers: markers.OwnershipMarkers,
    slot: Slot,
) -> EjectOutcome:
    got = await _ours(
        session, datacenter_name, bios_uuid, expected_markers, action="eject the CD-ROM of"
    )
    cdrom = got.cdrom(device_key)
    if cdrom is None:
        raise errors.NotFound(
            f"VM {got.name} has no CD-ROM with device key {device_key}", subject=f"VM {got.name}"
        )
    if got.question is not None and got.question.is_cdrom_lock:
        return await resume(
            session,
            datacenter_name=datacenter_name,
            bios_uuid=bios_uuid,
            device_key=device_key,
        )
    if cdrom.kind is not facts.MediumKind.ISO or cdrom.backing_file != expected_backing:
        if cdrom.is_empty():
            return EjectOutcome(EjectState.EJECTED, got.moid, device_key, cdrom=cdrom, already=True)
        raise errors.MediaMismatch(
            f"CD-ROM {device_key} of VM {got.name} holds "
            f"{cdrom.backing_file or cdrom.kind.value}, not {expected_backing}; left attached",
            subject=f"VM {got.name}",
        )
    ref = vms.ref_of(session, got.moid)
    spec = specs.eject_spec(cdrom)
    task = await session.call(
        lambda: ref.ReconfigVM_Task(spec=spec),
        subject=f"VM {got.name}",
        action="disconnect the CD-ROM of",
    )
    session.follow(task, slot=slot, vm=ref)
    return EjectOutcome(EjectState.IN_PROGRESS, ref._moId, device_key, task_id=task._moId)


async def answer_lock_question(
    session: Session,
    *,
    datacenter_name: str,
    bios_uuid: str,
    question_id: str,
    expected_markers: markers.OwnershipMarkers,
) -> None:
    """Answer Yes to the CD-ROM lock question `question_id`, and to nothing else."""
    with metrics.counted("iso", "answer_question"):
        got = await _ours(
            session, datacenter_name, bios_uuid, expected_markers, action="answer a question of"
        )
        question = got.question
        if question is None or question.id != question_id:
            current = f"question {question.id}" if question else "no question"
            raise errors.QuestionRefused(
                f"VM {got.name} shows {current}, not the recorded question {question_id}; "
                "not answering",
                subject=f"VM {got.name}",
            )
        if not question.is_cdrom_lock or YES not in {c.key for c in question.choices}:
            raise errors.QuestionRefused(
                f"VM {got.name} question {question.id} ({', '.join(question.message_ids)}) is not "
                f"the CD-ROM lock question {facts.CDROM_LOCK_MESSAGE}; left for a person",
                subject=f"VM {got.name}",
            )
        ref = vms.ref_of(session, got.moid)
        await session.call(
            lambda: ref.AnswerVM(questionId=question.id, answerChoice=YES),
            subject=f"VM {got.name}",
            action="answer the CD-ROM lock question of",
        )


async def resume(
    session: Session, *, datacenter_name: str, bios_uuid: str, device_key: int
) -> EjectOutcome:
    """The device's state: a reconfigure still running on the VM with its pending
    question, or followed (`IN_PROGRESS`); else the device as it is."""
    got = await vms.facts_by_uuid(session, datacenter_name=datacenter_name, bios_uuid=bios_uuid)
    if got is None:
        raise errors.NotFound(f"VM with BIOS UUID {bios_uuid} not found", subject=bios_uuid)
    ref = vms.ref_of(session, got.moid)
    running = await running_reconfigure(session, ref)
    cdrom = got.cdrom(device_key)
    if running is not None and cdrom is not None:
        if got.question is not None:
            return EjectOutcome(
                EjectState.QUESTION_PENDING,
                got.moid,
                device_key,
                task_id=running._moId,
                question=got.question,
            )
        session.follow(running, vm=ref)
        return EjectOutcome(EjectState.IN_PROGRESS, got.moid, device_key, task_id=running._moId)
    if cdrom is not None and cdrom.is_empty():
        return EjectOutcome(EjectState.EJECTED, got.moid, device_key, cdrom=cdrom)
    return EjectOutcome(
        EjectState.NOT_EJECTED, got.moid, device_key, cdrom=cdrom, question=got.question
    )


async def running_reconfigure(session: Session, ref: Any) -> Any | None:
    """A reconfigure task of this VM that is queued or running, if any (one request)."""
    content = session.content
    spec = PC.ObjectSpec(
        obj=ref,
        skip=True,
        selectSet=[
            PC.TraversalSpec(name="recent", type=vim.VirtualMachine, path="recentTask", skip=False)
        ],
    )
    found = await session.call(
        lambda: vmomi.retrieve(
            content, objects=[spec], props=[(vim.Task, ["info.descriptionId", "info.state"])]
        ),
        subject=f"VM {ref._moId}",
        action="read recent tasks of",
    )
    for item in found:
        if item.props.get("info.descriptionId") in RECONFIGURE_IDS and item.props.get(
            "info.state"
        ) in ("queued", "running"):
            return item.ref
    return None


async def _ours(
    session: Session,
    datacenter_name: str,
    bios_uuid: str,
    expected: markers.OwnershipMarkers,
    *,
    action: str,
) -> facts.VmFacts:
    got = await vms.facts_by_uuid(session, datacenter_name=datacenter_name, bios_uuid=bios_uuid)
    if got is None:
        raise errors.NotFound(
            f"VM with BIOS UUID {bios_uuid} not found in datacenter {datacenter_name}",
            subject=f"VM {bios_uuid}",
        )
    vms.require_ours(got, expected, action=action)
    return got
