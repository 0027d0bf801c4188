"""Creating a VsphereAgent's VM exactly once, across crashes, without waiting on vCenter
(0002 "VM lifecycle" 3-6; docs/design/0005 for the task model).

Each pass does what the record says is next, starts at most one vCenter task, records
it and returns; the task's end wakes the VsphereAgent (`task_waits`), and the next
pass reads the outcome from vCenter by the recorded moref. No worker waits on a task.

1. The pool must have cached its ISO (`status.iso.path`); else `WaitingForISO`.
2. A task slot of the vCenter is claimed (`--vsphere-max-tasks-in-flight`, shared by
   the pools in turn); none free -> the pass ends, the key is woken when its pool's
   turn comes.
3. Checkpoint: `status.creation` (VM name, a BIOS UUID chosen now, markers,
   datacenter, folder, ISO, phase `CreateIssued`; for a spread pool the failure domain
   and host chosen now by `vm_spread`, also kept in `status.placement`) and
   `status.vm.name` are written
   with `update_status` and the stored object returned by the PUT is checked to hold
   exactly this record (the read-back). The mutation refuses to overwrite a record
   or an identity already there, so a stale cache cannot start a second creation.
4. `CreateVM_Task` is started with the recorded name and BIOS UUID (`config.uuid`),
   the pool's hardware, placement and tags, the cached ISO as CD-ROM, and the
   markers; its moref goes into `status.creation.taskRef` and the pass ends. (A name
   our own VM already holds is taken over: step 5 at once.)
5. Woken, the pass reads the recorded task and looks the VM up (`vm_lookup.look_up`,
   `vm_decide.resume`): still running -> nothing; our VM, not running -> tags, then
   `PowerOnVM_Task` started, recorded with the VM's identity (phase `PowerOnIssued`,
   `taskRef` the power-on), the pass ends; our VM running -> step 6; absent after a
   failed task -> `VMCreateFailed` (the failed task's ref is dropped, `attempts`
   counted) and created again after the queue's backoff; someone else's ->
   `VMNameConflict`, nothing touched.
6. The power-on ended: the record is cleared and Ready=True, in one write (the
   identity was recorded in step 5).

A restart resumes from the record whatever its phase: the recorded task is asked
about first (running -> wait for it), then the VM by the task's result or the
recorded UUID, then by name in the recorded folder; absent by every key -> create,
unless a `CreateVM_Task` still runs in the folder (then wait: it may be ours, a
start whose moref was never recorded). A VM whose power-on vCenter refused stays
recorded and powered off; its power-on is retried with backoff (it goes with its
VsphereAgent). Waiting is no failure: Ready=False `VMCreating`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Final

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.vsphereagent import CreationPhase, CreationRecord, Ownership
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.common.deps import CredentialsError
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.vm import vm_decide, vm_lookup, vm_spread
from agentforge.reconcilers.vm.vm_context import (
    Edit,
    JsonObj,
    StatusWriter,
    VmInputs,
    creation_edit,
    identity_edit,
    is_checkpointed,
    placement_edit,
)
from agentforge.vsphere import metrics as vmetrics

__all__ = ["IN_FLIGHT_RECHECK_S", "ensure_created", "vm_name"]

log = logging.getLogger(__name__)

R = VsphereAgentReason
P = CreationPhase
IN_FLIGHT_RECHECK_S: Final = 2.0
"""How soon a creation waiting for an unrecorded create in the folder is decided again."""


def vm_name(inputs: VmInputs) -> str:
    """The recorded name, else the annotation, else the deterministic name (0002 "Names")."""
    name, _ = vm_decide.recorded_identity(inputs.agent)
    if name:
        return name
    assert inputs.pool is not None
    return naming.vm_name(
        name_prefix=inputs.pool.effective_name_prefix(),
        namespace=inputs.agent.metadata.namespace,
        vsphere_agent=inputs.agent.metadata.name,
    )


async def ensure_created(inputs: VmInputs, writer: StatusWriter) -> Result | None:
    agent, pool = inputs.agent, inputs.pool
    assert pool is not None
    record = agent.status.creation
    if record is None and agent.status.vm is not None and agent.status.vm.bios_uuid:
        if inputs.shows_ready(ok=True, reason=R.VM_READY):
            return None  # steady state: no call to vSphere, no write
        await writer.ready(
            ok=True,
            reason=R.VM_READY,
            message=f"VM {agent.status.vm.name} exists (BIOS UUID {agent.status.vm.bios_uuid})",
        )
        return None
    if record is None and not pool.status.iso.path:
        await writer.ready(
            ok=False,
            reason=R.WAITING_FOR_ISO,
            message=(
                f"waiting for VsphereAgentPool {pool.metadata.namespace}/{pool.metadata.name} "
                "to cache the discovery ISO (status.iso.path); see its ISOReady condition"
            ),
        )
        return None
    try:
        pool_specs.hardware(pool)  # refused before anything is recorded or started
        service = await inputs.vcenter.service()
    except (pool_specs.UnsupportedSpec, CredentialsError) as exc:
        await _failed(writer, f"cannot create the VM: {exc}")
        return Result(requeue=isinstance(exc, CredentialsError))
    if record is None:
        return await _begin(inputs, writer, service)
    try:
        task, plan = await vm_lookup.look_up(service, inputs, record)
    except vsphere.VsphereError as exc:
        await _failed(writer, f"looking up VM {record.vm_name} failed: {exc}", record=record)
        return Result(requeue=True)
    if task is not None and task.running:
        return inputs.vcenter.wait_task(service, task.moid)  # its end wakes this VsphereAgent
    if plan.step is vm_decide.ResumeStep.CONFLICT:
        return await _conflict(inputs, writer, record, plan.vm)
    if plan.step is vm_decide.ResumeStep.WAIT:
        return await _waiting(inputs, writer, record, plan.why)
    if plan.why:
        log.info("%s: %s: %s VM %s", inputs.where, plan.why, plan.step, record.vm_name)
    if plan.step is vm_decide.ResumeStep.RECORD:  # (vm None: the power-on succeeded)
        return await _done(inputs, writer, record, plan.vm)
    taken_by_us = plan.step is vm_decide.ResumeStep.FINISH and isinstance(
        task.error if task else None, vsphere.AlreadyExists
    )
    if task is not None and task.error is not None and not taken_by_us:
        return await _task_failed(writer, record, task)
    if plan.step is vm_decide.ResumeStep.CREATE:
        if record.failure_domain and vm_spread.domain_of(pool, record.failure_domain) is None:
            await _failed(writer, vm_lookup.domain_gone(inputs, record), record=record)
            return Result(requeue=True)
        return await _start(inputs, writer, service, record, _request(inputs, record))
    assert plan.vm is not None  # FINISH: our VM exists and does not run yet
    return await _converge(inputs, writer, service, record, _request(inputs, record), vm=plan.vm)


async def _begin(
    inputs: VmInputs, writer: StatusWriter, service: vsphere.VsphereService
) -> Result | None:
    """Claim a slot, choose the failure domain and host of a spread pool, checkpoint the
    intent (read back), then start the create."""
    pool = inputs.pool
    assert pool is not None
    slot = inputs.vcenter.claim_slot(service)  # raises TaskSlotPending: woken in the pool's turn
    ledger = inputs.spread or vm_spread.SpreadLedger()
    pool_key = vm_spread.pool_key(pool)
    try:
        async with ledger.choosing(pool_key):
            try:
                spot = await vm_spread.place(
                    service, pool, informer=inputs.deps.informer(kinds.VSPHERE_AGENT), ledger=ledger
                )
            except (vm_spread.NoUsableDomain, vsphere.VsphereError) as exc:
                await _failed(writer, f"cannot place the VM: {exc}")
                return Result(requeue=True)
            record = _new_record(inputs, spot)
            if spot is not None:
                ledger.note(pool_key, inputs.agent.metadata.name, spot)
            stored = await writer.write(
                _checkpoint(record),
                writer.ready_edit(
                    ok=False,
                    reason=R.VM_CREATING,
                    message=f"creating VM {record.vm_name} (BIOS UUID {record.bios_uuid})",
                ),
            )
            if not is_checkpointed(stored, record):
                ledger.drop(pool_key, inputs.agent.metadata.name)
                return Result(requeue_after=1.0)  # the cache was behind: decide on fresh data
        await writer.event(
            EventType.NORMAL,
            VmEvent.VM_CREATING,
            f"creating VM {record.vm_name} in folder {record.folder} of datacenter "
            f"{record.datacenter}{spot.describe() if spot else ''} with BIOS UUID "
            f"{record.bios_uuid}",
        )
        return await _start(inputs, writer, service, record, _request(inputs, record), slot=slot)
    finally:  # (bound to the started task, or released by the start)
        if slot is not None and slot.task is None:
            slot.release()


async def _start(
    inputs: VmInputs,
    writer: StatusWriter,
    service: vsphere.VsphereService,
    record: CreationRecord,
    request: vsphere.VmRequest,
    *,
    slot: vsphere.Slot | None = None,
) -> Result | None:
    """Start `CreateVM_Task` and record its moref; the task's end wakes the key."""
    slot = slot or inputs.vcenter.claim_slot(service)
    assert slot is not None, "a VM is created by the vm controller only"
    try:
        started = await service.start_create(request=request, slot=slot)
    except vsphere.CreationInFlight as exc:
        return await _waiting(inputs, writer, record, str(exc))
    except vsphere.AlreadyExists:
        return await _conflict(inputs, writer, record, None)
    except vsphere.VsphereError as exc:
        await _failed(writer, f"creating VM {record.vm_name} failed: {exc}", record=record)
        return Result(requeue=True)
    if started.existing is not None:  # our own VM holds the name: take it over
        return await _converge(inputs, writer, service, record, request, vm=started.existing)
    assert started.task is not None
    await _record_task(inputs, writer, record, P.CREATE_ISSUED, started.task)
    return inputs.vcenter.wait_task(service, started.task)


async def _converge(
    inputs: VmInputs,
    writer: StatusWriter,
    service: vsphere.VsphereService,
    record: CreationRecord,
    request: vsphere.VmRequest,
    *,
    vm: vsphere.VmFacts,
) -> Result | None:
    """Our VM exists: tags, then power on started and recorded with its identity."""
    slot = inputs.vcenter.claim_slot(service)
    assert slot is not None, "a VM is powered on by the vm controller only"
    try:
        task = await service.converge_vm(request=request, vm_moid=vm.moid, slot=slot)
    except vsphere.VsphereError as exc:
        await _failed(writer, f"powering on VM {record.vm_name} failed: {exc}", record=record)
        return Result(requeue=True)
    if task is None:  # it runs already
        return await _done(inputs, writer, record, vm)
    await _record_task(inputs, writer, record, P.POWER_ON_ISSUED, task, vm=vm)
    return inputs.vcenter.wait_task(service, task)


async def _done(
    inputs: VmInputs, writer: StatusWriter, record: CreationRecord, vm: vsphere.VmFacts | None
) -> Result | None:
    """The VM runs: identity recorded (when read now), record cleared, Ready=True."""
    if vm is not None:
        writer.defer(identity_edit(name=vm.name, vm=vm))
    writer.defer(placement_edit(record))
    writer.defer(creation_edit(None))
    recorded = inputs.agent.status.vm
    name = vm.name if vm else record.vm_name
    bios_uuid = vm.bios_uuid if vm else record.bios_uuid
    mac = vm.primary_mac if vm else (recorded.mac_address if recorded else None)
    vmetrics.vm_op("create", "success")
    await writer.ready(
        ok=True,
        reason=R.VM_READY,
        message=f"VM {name} created (BIOS UUID {bios_uuid}, MAC {mac})",
    )
    await writer.event(
        EventType.NORMAL,
        VmEvent.VM_CREATED,
        f"VM {name} is running (BIOS UUID {bios_uuid}, MAC {mac})",
    )
    return None


def _new_record(inputs: VmInputs, spot: vm_spread.Spot | None = None) -> CreationRecord:
    pool = inputs.pool
    assert pool is not None
    assert pool.status.iso.path
    return CreationRecord(
        vm_name=vm_name(inputs),
        bios_uuid=str(uuid.uuid4()),
        ownership=Ownership(
            pool_namespace=pool.metadata.namespace,
            pool_name=pool.metadata.name,
            pool_uid=pool.metadata.uid,
            vsphere_agent=inputs.agent.metadata.name,
        ),
        datacenter=pool.spec.vsphere.datacenter,
        folder=pool.effective_folder(),
        iso_path=pool_specs.iso_backing(pool, pool.status.iso.path),
        phase=CreationPhase.CREATE_ISSUED,
        started_at=inputs.now,
        failure_domain=spot.domain.name if spot else None,
        host=spot.host if spot else None,
    )


def _request(inputs: VmInputs, record: CreationRecord) -> vsphere.VmRequest:
    """The create request: the record's name, UUID, placement and ISO, the pool's
    hardware (checked before the record was made) and tags."""
    pool = inputs.pool
    assert pool is not None
    return vsphere.VmRequest(
        name=record.vm_name,
        placement=vm_lookup.placement(inputs, record),
        hardware=pool_specs.hardware(pool),
        iso_file=record.iso_path or pool_specs.iso_backing(pool, pool.status.iso.path or ""),
        markers=vm_decide.record_markers(record),
        tag_ids=tuple(pool.spec.vsphere.vm_tags),
        bios_uuid=record.bios_uuid,
    )


def _checkpoint(record: CreationRecord) -> Edit:
    base = creation_edit(record)

    def edit(obj: JsonObj) -> None:
        status = obj["status"]
        if status.get("creation") or (status.get("vm") or {}).get("biosUUID"):
            return  # recorded by an earlier run: never overwrite; the read-back tells
        base(obj)

    return edit


async def _record_task(
    inputs: VmInputs,
    writer: StatusWriter,
    record: CreationRecord,
    phase: CreationPhase,
    moid: str,
    *,
    vm: vsphere.VmFacts | None = None,
) -> None:
    """Checkpoint the started task's moref (and, for a power-on, the VM's identity)
    into this very record, with what the pass has pending."""

    def edit(obj: JsonObj) -> None:
        creation = obj["status"].get("creation")
        if creation and creation.get("biosUUID") == record.bios_uuid:
            creation["phase"] = phase.value
            creation["taskRef"] = moid  # only into this very record, never another one

    edits = [edit] if vm is None else [identity_edit(name=vm.name, vm=vm), edit]
    try:
        await writer.write(*edits)
    except kerrors.KubeError as exc:  # the ref speeds recovery up: the lookups still work
        log.warning(
            "%s: recording task %s of VM %s failed (the VM is looked up by BIOS UUID and "
            "name when it ends, and creates in flight are waited for): %s",
            inputs.where,
            moid,
            record.vm_name,
            exc,
        )


def _failed_attempt_edit(record: CreationRecord, *, drop_task: bool = False) -> Edit:
    def edit(obj: JsonObj) -> None:
        creation = obj["status"].get("creation")
        if creation and creation.get("biosUUID") == record.bios_uuid:
            creation["attempts"] = int(creation.get("attempts") or 0) + 1
            if drop_task and creation.get("taskRef") == record.task_ref:
                creation.pop("taskRef", None)  # its outcome is reported: not again

    return edit


async def _waiting(
    inputs: VmInputs, writer: StatusWriter, record: CreationRecord, why: str
) -> Result:
    inputs.vcenter.in_flight = True
    await writer.ready(
        ok=False,
        reason=R.VM_CREATING,
        message=f"creating VM {record.vm_name}: waiting, {why}",
    )
    return Result(requeue_after=IN_FLIGHT_RECHECK_S)


async def _conflict(
    inputs: VmInputs, writer: StatusWriter, record: CreationRecord, vm: vsphere.VmFacts | None
) -> Result:
    who = f"VM {vm.name} (BIOS UUID {vm.bios_uuid})" if vm else f"an object named {record.vm_name}"
    message = (
        f"{who} in folder {record.folder} is not ours (other or no ownership markers); it is "
        f"left alone: rename or remove it, or set annotation vm-name on {inputs.where} "
        "before it creates its VM"
    )
    await writer.ready(ok=False, reason=R.VM_NAME_CONFLICT, message=message)
    await writer.event(EventType.WARNING, VmEvent.VM_NAME_CONFLICT, message)
    return Result(requeue=True)


async def _task_failed(
    writer: StatusWriter, record: CreationRecord, task: vsphere.TaskFacts
) -> Result:
    """The recorded task failed and nothing runs: report it once (the task's ref goes
    with the report) and try again after the queue's backoff."""
    doing = "powering on" if record.phase == P.POWER_ON_ISSUED else "creating"
    vmetrics.vm_op("create", vmetrics.result_of(task.error))
    message = f"{doing} VM {record.vm_name} failed: {task.error}"
    edits = [
        writer.ready_edit(ok=False, reason=R.VM_CREATE_FAILED, message=message),
        _failed_attempt_edit(record, drop_task=True),
    ]
    await writer.write(*edits)
    await writer.event(EventType.WARNING, VmEvent.VM_CREATE_FAILED, message)
    return Result(requeue=True)


async def _failed(
    writer: StatusWriter, message: str, *, record: CreationRecord | None = None
) -> None:
    edits = [writer.ready_edit(ok=False, reason=R.VM_CREATE_FAILED, message=message)]
    if record is not None:
        edits.append(_failed_attempt_edit(record))  # keeps what else the record holds
    await writer.write(*edits)
    await writer.event(EventType.WARNING, VmEvent.VM_CREATE_FAILED, message)
