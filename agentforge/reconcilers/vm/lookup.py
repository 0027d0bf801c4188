"""What vCenter says about a recorded creation: its task first, then the VM.

`look_up` is how every pass with a `status.creation` record begins, the creating
one (`vm_create`) and the deleting one (`vm_delete`, which must not delete while a
create may still make the VM): the recorded task is asked about by its moref (a task
this process follows and that has not ended needs no request: its end wakes the
VsphereAgent); while it runs nothing else is asked. The recorded task is the create:
this version notes a power-on in memory, not in status (`vm_create` steps 5-6), and
after a crash the VM's power state tells. A record in phase `PowerOnIssued` (written
by an earlier version, with the VM's identity) whose power-on vCenter reports
successful needs no lookup either. Otherwise the VM is looked up by the task's result
or the recorded BIOS UUID, then by name in the recorded folder, and, when absent by
every key, the `CreateVM_Task`s still running in that folder are listed
(`vm_decide.resume` decides from all that).
"""

from __future__ import annotations

import dataclasses

from agentforge import identity, vsphere
from agentforge.api.vsphereagent import CreationPhase, CreationRecord
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm.context import VcenterApi, VmInputs

__all__ = ["look_up", "placement"]

P = CreationPhase


def placement(inputs: VmInputs, record: CreationRecord) -> vsphere.Placement:
    """The pool's placement (or the recorded failure domain's, on the recorded host), in
    the record's datacenter and folder."""
    pool = inputs.pool
    assert pool is not None
    domain = next(
        (d for d in pool.spec.vsphere.failure_domains if d.name == record.failure_domain), None
    )
    where = (
        pool_specs.domain_placement(pool, domain, host=record.host)
        if record.failure_domain and domain is not None
        else pool_specs.placement(pool)
    )
    return dataclasses.replace(where, datacenter=record.datacenter, folder=record.folder)


def domain_gone(inputs: VmInputs, record: CreationRecord) -> str:
    return (
        f"failure domain {record.failure_domain} recorded for VM {record.vm_name} is no longer "
        f"in spec.vsphere.failureDomains of the pool; put it back, or delete {inputs.where} "
        "to place its VM anew"
    )


def _identity_recorded(inputs: VmInputs, record: CreationRecord) -> bool:
    recorded = inputs.agent.status.vm
    return recorded is not None and identity.normalize_uuid(
        recorded.bios_uuid
    ) == identity.normalize_uuid(record.bios_uuid)


async def look_up(
    service: VcenterApi, inputs: VmInputs, record: CreationRecord
) -> tuple[vsphere.TaskFacts | None, vm_decide.Resume]:
    """Ask about the recorded task, then (unless it runs) look the VM up."""
    task: vsphere.TaskFacts | None = None
    task_gone = False
    if record.task_ref and inputs.vcenter.awaiting(service, record.task_ref):
        task = vsphere.TaskFacts(moid=record.task_ref, state=vsphere.TaskState.RUNNING)
        return task, vm_decide.resume(record, by_uuid=None, by_name=None, task=task)
    if record.task_ref:
        try:
            task = await service.task(task_ref=record.task_ref)
        except vsphere.NotFound:
            task_gone = True  # forgotten by vCenter: not "absent", look by UUID and name
        if task is not None and task.running:
            await service.follow_task(task_ref=record.task_ref)  # (after a restart)
            return task, vm_decide.resume(record, by_uuid=None, by_name=None, task=task)
    if (
        task is not None
        and task.state is vsphere.TaskState.SUCCESS
        and record.phase == P.POWER_ON_ISSUED
        and _identity_recorded(inputs, record)
    ):
        # vCenter says the recorded power-on (an earlier version's record) succeeded: the
        # VM runs, and its identity was recorded with the power-on; no lookup needed.
        return task, vm_decide.Resume(vm_decide.ResumeStep.RECORD)
    by_uuid = None
    if task is not None and task.result_moid:
        by_uuid = await service.vm_by_moid(moid=task.result_moid)
    if by_uuid is None:
        by_uuid = await service.vm_by_uuid(datacenter=record.datacenter, bios_uuid=record.bios_uuid)
    by_name = None
    where = placement(inputs, record)
    if by_uuid is None:
        by_name = await service.vm_by_name(placement=where, name=record.vm_name)
    in_flight: list[vsphere.TaskFacts] = []
    if by_uuid is None and by_name is None:
        in_flight = await service.creates_in_flight(placement=where)
    return task, vm_decide.resume(
        record,
        by_uuid=by_uuid,
        by_name=by_name,
        task=task,
        task_gone=task_gone,
        creates_in_flight=in_flight,
    )
