"""The VM's deletion as vCenter tasks nobody waits for: power off, then destroy.

`vm_delete` decides *whether* the VM goes (ownership, bound Agents, a creation still
in flight); this module runs the two tasks that make it go, in the task model of
docs/design/0005:

* `start` claims a task slot, starts the next step (the vSphere layer looks the VM
  up by BIOS UUID and checks our markers again first: power off while it is not off,
  else destroy), records the started task in `status.deletion` with Ready=False
  `VMDeleting`, in one write, and ends the pass; the task's end wakes the
  VsphereAgent;
* `outcome` asks vCenter how the recorded task ended: still running -> the pass
  ends (woken when it ends); failed -> `VMDeleteFailed` with a Warning event, the
  task's reference dropped with the report and the step started again after the
  queue's backoff; the destroy succeeded -> the VM is gone (no lookup); a power-off
  that ended, or a task vCenter forgot -> the VM is looked up again before anything
  else (vCenter's word on the VM, not on the task, decides what is next);
* `gone`: the VM is no longer there after we started deleting it -> `VMDeleted`.

A crash between a start and its record leaves a VM that is powering off, off, or
gone: the next pass looks it up and carries on from what it finds.
"""

from __future__ import annotations

from agentforge import vsphere
from agentforge.api import wire
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.vsphereagent import DeletionPhase, DeletionRecord
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.vm.context import Edit, JsonObj, StatusWriter, VmInputs
from agentforge.vsphere import metrics as vmetrics

__all__ = ["gone", "outcome", "start"]

R = VsphereAgentReason
_PHASES = {"power off": DeletionPhase.POWER_OFF_ISSUED, "destroy": DeletionPhase.DESTROY_ISSUED}


async def outcome(
    inputs: VmInputs,
    writer: StatusWriter,
    service: vsphere.VsphereService,
    deletion: DeletionRecord,
) -> Result | bool:
    """How the recorded task ended: the result of waiting for it or reporting its
    failure; True when vCenter says the VM was destroyed; False when the VM itself is
    to be asked (the power-off ended, or vCenter forgot the task)."""
    assert deletion.task_ref is not None
    if inputs.vcenter.awaiting(service, deletion.task_ref):
        return inputs.vcenter.wait_task(service, deletion.task_ref)  # runs on: its end wakes us
    try:
        task = await service.task(task_ref=deletion.task_ref)
    except vsphere.NotFound:
        return False  # forgotten by vCenter: the VM itself tells
    if task.running:
        await service.follow_task(task_ref=task.moid)  # (after a restart)
        return inputs.vcenter.wait_task(service, task.moid)
    if task.error is None:
        return deletion.phase == DeletionPhase.DESTROY_ISSUED
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
    service: vsphere.VsphereService,
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
    previous = inputs.agent.status.deletion
    record = DeletionRecord(
        vm_name=vm.name,
        bios_uuid=vm.bios_uuid,
        phase=_PHASES[step.action],
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
