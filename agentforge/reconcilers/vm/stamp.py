"""Stamping our ownership markers on an unmarked VM, without waiting for the reconfigure.

An unmarked VM whose BIOS UUID and name equal the record (an adopted VM, or one the
Go operator made) gets our markers before anything else is done to it: adoption,
deletion and ISO ejection all need them (the vSphere layer refuses to touch a VM
that is not ours). The stamp is a `ReconfigVM_Task`; as every task of the `vm`
controller it takes a task slot and is started, not waited for (docs/design/0005):

* `ensure_stamped` returns the VM's facts when it is ours already, else starts the
  stamp, notes the task in the controller's `TaskWaits` (no status field records a
  stamp: it is idempotent, and after a restart the VM's markers say whether it
  happened) and returns the result of waiting; the task's end wakes the VsphereAgent;
* the next pass reads the noted task's outcome once: still running -> wait; failed
  -> the typed error is raised for the caller to report (the next attempt, after the
  queue's backoff, starts a fresh stamp); ended -> the VM is read again, and its
  markers decide.
"""

from __future__ import annotations

from agentforge import vsphere
from agentforge.kube.controller import Result
from agentforge.reconcilers.vm.context import VcenterApi, VcenterHandle

__all__ = ["PURPOSE", "ensure_stamped", "just_stamped"]

PURPOSE = "stamp"


async def ensure_stamped(
    vcenter: VcenterHandle,
    service: VcenterApi,
    *,
    datacenter: str,
    bios_uuid: str,
    markers: vsphere.OwnershipMarkers,
) -> vsphere.VmFacts | Result:
    """The VM, ours; or the result of waiting for the stamp that makes it ours."""
    noted = vcenter.waits.noted(vcenter.key, PURPOSE, vcenter=service.vcenter)
    if noted is not None:
        waiting = await _outcome(vcenter, service, noted)
        if waiting is not None:
            return waiting
    slot = vcenter.claim_slot(service)  # raises TaskSlotPending: woken in the pool's turn
    vm, task = await service.start_stamp(
        datacenter=datacenter, bios_uuid=bios_uuid, markers=markers, slot=slot
    )
    if task is None:
        return vm
    vcenter.waits.note(vcenter.key, PURPOSE, vcenter=service.vcenter, task=task)
    return vcenter.wait_task(service, task)


async def just_stamped(vcenter: VcenterHandle, service: VcenterApi) -> bool:
    """A stamp this VsphereAgent started has succeeded since its last pass (read once)."""
    noted = vcenter.waits.noted(vcenter.key, PURPOSE, vcenter=service.vcenter)
    if noted is None:
        return False
    try:
        task = await service.task(task_ref=noted)
    except vsphere.NotFound:
        return False
    if task.state is not vsphere.TaskState.SUCCESS:  # running, or failed: for the stamp step
        vcenter.waits.note(vcenter.key, PURPOSE, vcenter=service.vcenter, task=noted)
        return False
    return True


async def _outcome(vcenter: VcenterHandle, service: VcenterApi, noted: str) -> Result | None:
    try:
        task = await service.task(task_ref=noted)
    except vsphere.NotFound:
        return None  # forgotten: the VM's markers tell
    if task.running:
        vcenter.waits.note(vcenter.key, PURPOSE, vcenter=service.vcenter, task=noted)
        await service.follow_task(task_ref=noted)
        return vcenter.wait_task(service, noted)
    if task.error is not None:
        raise task.error  # the caller reports it; a fresh stamp after the backoff
    return None
