"""The VM's deletion as vCenter tasks nobody waits for: power off, then destroy.

`vm_delete` decides *whether* the VM goes (ownership, bound Agents, a creation still
in flight); this module runs the two tasks that make it go, in the task model of
docs/design/0005:

* `start` claims a task slot, starts the next step (the vSphere layer looks the VM
  up by BIOS UUID and checks our markers again first: power off while it is not off,
  else destroy) and ends the pass; the task's end wakes the VsphereAgent. A destroy
  is recorded in `status.deletion` with Ready=False `VMDeleting`, in one write; a
  power-off is only noted in memory (`TaskWaits.note`, as the creation's power-on
  is): it is idempotent, and after a crash the VM's power state says whether it
  happened, so it is no checkpoint (an earlier version's recorded `PowerOffIssued`
  is still read and resumed by its moref);
* `outcome` asks vCenter how the recorded (or noted) task ended: still running ->
  the pass ends (woken when it ends); failed -> `VMDeleteFailed` with a Warning
  event, a recorded task's reference dropped with the report and the step started
  again after the queue's backoff; the destroy succeeded -> the VM is gone (no
  lookup); a power-off that ended, was refused as already off or busy
  (`InvalidState`, `TaskInProgress`), or a task vCenter forgot -> the VM is looked up
  again before anything else (vCenter's word on the VM, not on the task, decides
  what is next);
* `gone`: the VM is no longer there after we started deleting it -> `VMDeleted`.

A crash between a start and its record (or with a power-off only noted) leaves a VM
that is powering off, off, or gone: the next pass looks it up and carries on from
what it finds (powered off again: vCenter refuses that as already off, or runs it
once the first one ended).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from agentforge import identity, vsphere
from agentforge.api import wire
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.vsphereagent import DeletionPhase, DeletionRecord
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.vm.context import Edit, JsonObj, StatusWriter, VcenterApi, VmInputs
from agentforge.vsphere import metrics as vmetrics

if TYPE_CHECKING:
    from agentforge.reconcilers.waits import Noted

__all__ = ["gone", "noted_power_off", "outcome", "start"]

R = VsphereAgentReason
POWER_OFF: Final = "power-off"
"""The `TaskWaits` note of a started power-off (no status field records it)."""


def noted_power_off(
    inputs: VmInputs, service: VcenterApi, *, bios_uuid: str | None
) -> tuple[DeletionRecord, Noted] | None:
    """The power-off this process started for this VM (read once), as the record an
    earlier version wrote for it, and its note."""
    noted = inputs.vcenter.take_note(service, POWER_OFF)
    if noted is None or noted.vm is None:
        return None
    if bios_uuid and identity.normalize_uuid(noted.about) != identity.normalize_uuid(bios_uuid):
        return None  # another VM's (a VsphereAgent made anew under the same name)
    record = DeletionRecord(
        vm_name=noted.vm.name,
        bios_uuid=noted.about,
        phase=DeletionPhase.POWER_OFF_ISSUED,
        task_ref=noted.task,
        started_at=inputs.now,
        attempts=0,
    )
    return record, noted


async def outcome(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    deletion: DeletionRecord,
    *,
    noted: Noted | None = None,
) -> Result | bool:
    """How the recorded task (or the `noted` power-off) ended: the result of waiting
    for it or reporting its failure; True when vCenter says the VM was destroyed; False
    when the VM itself is to be asked (the power-off ended or was refused as already
    off or busy, or vCenter forgot the task)."""
    assert deletion.task_ref is not None

    def wait(task: str) -> Result:  # runs on: its end wakes us (read once: noted again)
        if noted is not None:
            inputs.vcenter.note(service, POWER_OFF, task=task, about=noted.about, vm=noted.vm)
        return inputs.vcenter.wait_task(service, task)

    if inputs.vcenter.awaiting(service, deletion.task_ref):
        return wait(deletion.task_ref)
    try:
        task = await service.task(task_ref=deletion.task_ref)
    except vsphere.NotFound:
        return False  # forgotten by vCenter: the VM itself tells
    if task.running:
        await service.follow_task(task_ref=task.moid)  # (after a restart)
        return wait(task.moid)
    if task.error is None:
        return deletion.phase == DeletionPhase.DESTROY_ISSUED
    if deletion.phase == DeletionPhase.POWER_OFF_ISSUED and isinstance(
        task.error, (vsphere.InvalidState, vsphere.TransientError)
    ):
        return False  # already off, or another task holds it: the VM itself tells
    doing = "powering off" if deletion.phase == DeletionPhase.POWER_OFF_ISSUED else "destroying"
    vmetrics.vm_op("delete", vmetrics.result_of(task.error))
    message = f"{doing} VM {deletion.vm_name} failed: {task.error}; started again with backoff"
    await writer.write(
        writer.ready_edit(ok=False, reason=R.VM_DELETE_FAILED, message=message),
        _failed_edit(deletion),
    )
    await writer.event(EventType.WARNING, VmEvent.VM_DELETE_FAILED, message)
    return Result(requeue=True)


async def start(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    *,
    vm: vsphere.VmFacts,
    datacenter: str,
    markers: vsphere.OwnershipMarkers,
) -> Result | None:
    """Start the VM's next deletion step and record it; None when it is gone already."""
    assert vm.bios_uuid is not None
    slot = inputs.vcenter.claim_slot(service)  # raises TaskSlotPending: woken in the pool's turn
    step = await service.start_delete(
        datacenter=datacenter, bios_uuid=vm.bios_uuid, markers=markers, slot=slot
    )
    if not step.action or step.task is None:
        await _deleted(writer, vm.name, vm.bios_uuid)
        return None
    if step.action == "power off":
        # No status write: a power-off is idempotent and the VM's power state says
        # after a crash whether it happened. The next pass reads its outcome from this note.
        inputs.vcenter.note(service, POWER_OFF, task=step.task, about=vm.bios_uuid, vm=vm)
        return inputs.vcenter.wait_task(service, step.task)
    previous = inputs.agent.status.deletion
    record = DeletionRecord(
        vm_name=vm.name,
        bios_uuid=vm.bios_uuid,
        phase=DeletionPhase.DESTROY_ISSUED,
        task_ref=step.task,
        started_at=inputs.now,
        attempts=previous.attempts if previous is not None else 0,
    )
    await writer.write(
        _record_edit(record),
        writer.ready_edit(
            ok=False,
            reason=R.VM_DELETING,
            message=f"deleting VM {vm.name} (BIOS UUID {vm.bios_uuid}): {step.action} "
            f"task {step.task} started",
        ),
    )
    return inputs.vcenter.wait_task(service, step.task)


async def gone(writer: StatusWriter, deletion: DeletionRecord | None) -> None:
    """The VM is not there (any more): `VMDeleted` when we were deleting it."""
    if deletion is not None:
        await _deleted(writer, deletion.vm_name, deletion.bios_uuid)


async def _deleted(writer: StatusWriter, name: str, bios_uuid: str) -> None:
    vmetrics.vm_op("delete", "success")
    await writer.event(
        EventType.NORMAL, VmEvent.VM_DELETED, f"deleted VM {name} (BIOS UUID {bios_uuid})"
    )


def _record_edit(record: DeletionRecord) -> Edit:
    def edit(obj: JsonObj) -> None:
        obj["status"]["deletion"] = wire.to_wire(record)

    return edit


def _failed_edit(deletion: DeletionRecord) -> Edit:
    def edit(obj: JsonObj) -> None:
        stored = obj["status"].get("deletion")
        if stored and stored.get("taskRef") == deletion.task_ref:
            stored.pop("taskRef", None)  # its outcome is reported: not again
            stored["attempts"] = int(stored.get("attempts") or 0) + 1

    return edit
