"""Creating a VsphereAgent's VM exactly once, across crashes (0002 "VM lifecycle" 3-6).

1. The pool must have cached its ISO (`status.iso.path`); else `WaitingForISO`.
2. Checkpoint: `status.creation` (VM name, a BIOS UUID chosen now, markers,
   datacenter, folder, ISO, phase `CreateIssued`) and `status.vm.name` are written
   with `update_status` and the stored object returned by the PUT is checked to hold
   exactly this record (the read-back). The mutation refuses to overwrite a record
   or an identity already there, so a stale cache cannot start a second creation.
3. Create with the recorded name and BIOS UUID (`config.uuid`), the pool's hardware,
   placement and tags, the cached ISO as CD-ROM, and the markers. The moment
   `CreateVM_Task` has started, its moref goes into `status.creation.taskRef` (a
   second status write; if it fails, recovery goes by UUID and name). The vSphere
   layer's create is idempotent by name + markers (a `DuplicateName` is answered by
   looking the VM up by name: ours is taken over, anything else is `VMNameConflict`),
   and removes a half-built VM of ours.
4. Record BIOS UUID, MAC, instance UUID and moref; clear the record; Ready=True
   (with the pass's next status write, see `vm_context`).
5. With a record present (a restart, or a failed attempt), vCenter is first asked
   about the recorded task (running -> wait for it), then the VM is looked up by the
   task's result or the recorded UUID, then by name in the recorded folder: ours and
   running -> record; ours and unfinished -> converge; someone else's ->
   `VMNameConflict`, nothing touched; absent -> create, unless a `CreateVM_Task` still
   runs in the folder (then wait: it may be ours) (`vm_decide.resume`).

Failures keep the record (with `attempts` counted) and are retried with the queue's
backoff; every failure sets Ready=False with the reason and a Warning event. Waiting
for a creation in flight is no failure: Ready=False `VMCreating`, checked again soon.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Final

from agentforge import vsphere
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.vsphereagent import CreationPhase, CreationRecord, Ownership
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers import naming, pool_specs, vm_decide
from agentforge.reconcilers.deps import CredentialsError
from agentforge.reconcilers.event_reasons import VmEvent
from agentforge.reconcilers.vm_context import (
    Edit,
    JsonObj,
    VmContext,
    creation_edit,
    identity_edit,
    is_checkpointed,
)

__all__ = ["IN_FLIGHT_RECHECK_S", "ensure_created", "look_up", "vm_name"]

log = logging.getLogger(__name__)

R = VsphereAgentReason
IN_FLIGHT_RECHECK_S: Final = 2.0
"""How soon a creation waiting for a create task in flight is decided again."""


def vm_name(ctx: VmContext) -> str:
    """The recorded name, else the annotation, else the deterministic name (0002 "Names")."""
    name, _ = vm_decide.recorded_identity(ctx.agent)
    if name:
        return name
    assert ctx.pool is not None
    return naming.vm_name(
        name_prefix=ctx.pool.effective_name_prefix(),
        namespace=ctx.agent.metadata.namespace,
        vsphere_agent=ctx.agent.metadata.name,
    )


async def ensure_created(ctx: VmContext) -> Result | None:
    agent, pool = ctx.agent, ctx.pool
    assert pool is not None
    record = agent.status.creation
    if record is None and agent.status.vm is not None and agent.status.vm.bios_uuid:
        if ctx.shows_ready(ok=True, reason=R.VM_READY):
            return None  # steady state: no call to vSphere, no write
        await ctx.ready(
            ok=True,
            reason=R.VM_READY,
            message=f"VM {agent.status.vm.name} exists (BIOS UUID {agent.status.vm.bios_uuid})",
        )
        return None
    if record is None and not pool.status.iso.path:
        await ctx.ready(
            ok=False,
            reason=R.WAITING_FOR_ISO,
            message=(
                f"waiting for VsphereAgentPool {pool.metadata.namespace}/{pool.metadata.name} "
                "to cache the discovery ISO (status.iso.path); see its ISOReady condition"
            ),
        )
        return None
    try:
        hardware = pool_specs.hardware(pool)
        service = await ctx.service()
    except (pool_specs.UnsupportedSpec, CredentialsError) as exc:
        await _failed(ctx, f"cannot create the VM: {exc}")
        return Result(requeue=isinstance(exc, CredentialsError))
    if record is None:
        record = _new_record(ctx)
        stored = await ctx.write(
            _checkpoint(record),
            ctx.ready_edit(
                ok=False,
                reason=R.VM_CREATING,
                message=f"creating VM {record.vm_name} (BIOS UUID {record.bios_uuid})",
            ),
        )
        if not is_checkpointed(stored, record):
            return Result(requeue_after=1.0)  # the cache was behind: decide again on fresh data
        await ctx.event(
            EventType.NORMAL,
            VmEvent.VM_CREATING,
            f"creating VM {record.vm_name} in folder {record.folder} of datacenter "
            f"{record.datacenter} with BIOS UUID {record.bios_uuid}",
        )
        plan = vm_decide.Resume(vm_decide.ResumeStep.CREATE)
    else:
        try:
            plan = await look_up(service, ctx, record)
        except vsphere.VsphereError as exc:
            await _failed(ctx, f"looking up VM {record.vm_name} failed: {exc}", record=record)
            return Result(requeue=True)
    if plan.step is vm_decide.ResumeStep.CONFLICT:
        return await _conflict(ctx, record, plan.vm)
    if plan.step is vm_decide.ResumeStep.WAIT:
        return await _waiting(ctx, record, plan.why)
    if plan.why:
        log.info("%s: %s: %s VM %s", ctx.where, plan.why, plan.step, record.vm_name)
    vm = plan.vm
    if plan.step is not vm_decide.ResumeStep.RECORD:
        request = vsphere.VmRequest(
            name=record.vm_name,
            placement=_placement(ctx, record),
            hardware=hardware,
            iso_file=record.iso_path or pool_specs.iso_backing(pool, pool.status.iso.path or ""),
            markers=vm_decide.record_markers(record),
            tag_ids=tuple(pool.spec.vsphere.vm_tags),
            bios_uuid=record.bios_uuid,
        )
        try:
            vm = await service.create_vm(request=request, on_task=_task_recorder(ctx, record))
        except vsphere.CreationInFlight as exc:
            return await _waiting(ctx, record, str(exc))
        except vsphere.AlreadyExists:
            return await _conflict(ctx, record, None)
        except vsphere.VsphereError as exc:
            await _failed(ctx, f"creating VM {record.vm_name} failed: {exc}", record=record)
            return Result(requeue=True)
    assert vm is not None
    # Recorded with the pass's next write (the ejection step's first condition) or at
    # its end: no read-back is needed, and until it is stored `status.creation` keeps
    # every restart finding this VM by its recorded BIOS UUID.
    ctx.defer(identity_edit(name=vm.name, vm=vm))
    ctx.defer(creation_edit(None))
    await ctx.ready(
        ok=True,
        reason=R.VM_READY,
        message=f"VM {vm.name} created (BIOS UUID {vm.bios_uuid}, MAC {vm.primary_mac})",
    )
    await ctx.event(
        EventType.NORMAL,
        VmEvent.VM_CREATED,
        f"VM {vm.name} is running (BIOS UUID {vm.bios_uuid}, MAC {vm.primary_mac})",
    )
    return None


def _new_record(ctx: VmContext) -> CreationRecord:
    pool = ctx.pool
    assert pool is not None
    assert pool.status.iso.path
    return CreationRecord(
        vm_name=vm_name(ctx),
        bios_uuid=str(uuid.uuid4()),
        ownership=Ownership(
            pool_namespace=pool.metadata.namespace,
            pool_name=pool.metadata.name,
            pool_uid=pool.metadata.uid,
            vsphere_agent=ctx.agent.metadata.name,
        ),
        datacenter=pool.spec.vsphere.datacenter,
        folder=pool.effective_folder(),
        iso_path=pool_specs.iso_backing(pool, pool.status.iso.path),
        phase=CreationPhase.CREATE_ISSUED,
        started_at=ctx.now,
    )


def _checkpoint(record: CreationRecord) -> Edit:
    base = creation_edit(record)

    def edit(obj: JsonObj) -> None:
        status = obj["status"]
        if status.get("creation") or (status.get("vm") or {}).get("biosUUID"):
            return  # recorded by an earlier run: never overwrite; the read-back tells
        base(obj)

    return edit


def _placement(ctx: VmContext, record: CreationRecord) -> vsphere.Placement:
    assert ctx.pool is not None
    return dataclasses.replace(
        pool_specs.placement(ctx.pool), datacenter=record.datacenter, folder=record.folder
    )


def _task_recorder(ctx: VmContext, record: CreationRecord) -> Callable[[str], Awaitable[None]]:
    """The `on_task` of a create: record the started task's moref in `status.creation`."""

    async def record_task(moid: str) -> None:
        try:
            await ctx.write(_task_ref_edit(record, moid))
        except kerrors.KubeError as exc:  # the ref only speeds recovery up: go on waiting
            log.warning(
                "%s: recording create task %s of VM %s failed (a restart looks the VM up by "
                "BIOS UUID and name, and waits for creates in flight): %s",
                ctx.where,
                moid,
                record.vm_name,
                exc,
            )

    return record_task


def _task_ref_edit(record: CreationRecord, moid: str) -> Edit:
    def edit(obj: JsonObj) -> None:
        creation = obj["status"].get("creation")
        if creation and creation.get("biosUUID") == record.bios_uuid:
            creation["taskRef"] = moid  # only into this very record, never another one

    return edit


def _attempt_edit(record: CreationRecord) -> Edit:
    def edit(obj: JsonObj) -> None:
        creation = obj["status"].get("creation")
        if creation and creation.get("biosUUID") == record.bios_uuid:
            creation["attempts"] = int(creation.get("attempts") or 0) + 1

    return edit


async def look_up(
    service: vsphere.VsphereService, ctx: VmContext, record: CreationRecord
) -> vm_decide.Resume:
    """Ask about the recorded task (waiting while it runs), then look the VM up."""
    task: vsphere.TaskFacts | None = None
    task_gone = False
    if record.task_ref:
        try:
            task = await service.task(task_ref=record.task_ref)
            if task.running:
                log.info(
                    "%s: create task %s of VM %s is still running: waiting for it",
                    ctx.where,
                    task.moid,
                    record.vm_name,
                )
                task = await service.wait_for_task(task_ref=record.task_ref)
        except vsphere.NotFound:
            task_gone = True  # forgotten by vCenter: not "absent", look by UUID and name
    if task is not None and task.running:
        return vm_decide.resume(record, by_uuid=None, by_name=None, task=task)
    by_uuid = None
    if task is not None and task.result_moid:
        by_uuid = await service.vm_by_moid(moid=task.result_moid)
    if by_uuid is None:
        by_uuid = await service.vm_by_uuid(datacenter=record.datacenter, bios_uuid=record.bios_uuid)
    by_name = None
    placement = _placement(ctx, record)
    if by_uuid is None:
        by_name = await service.vm_by_name(placement=placement, name=record.vm_name)
    in_flight: list[vsphere.TaskFacts] = []
    if by_uuid is None and by_name is None:
        in_flight = await service.creates_in_flight(placement=placement)
    return vm_decide.resume(
        record,
        by_uuid=by_uuid,
        by_name=by_name,
        task=task,
        task_gone=task_gone,
        creates_in_flight=in_flight,
    )


async def _waiting(ctx: VmContext, record: CreationRecord, why: str) -> Result:
    await ctx.ready(
        ok=False,
        reason=R.VM_CREATING,
        message=f"creating VM {record.vm_name}: waiting, {why}",
    )
    return Result(requeue_after=IN_FLIGHT_RECHECK_S)


async def _conflict(ctx: VmContext, record: CreationRecord, vm: vsphere.VmFacts | None) -> Result:
    who = f"VM {vm.name} (BIOS UUID {vm.bios_uuid})" if vm else f"an object named {record.vm_name}"
    message = (
        f"{who} in folder {record.folder} is not ours (other or no ownership markers); it is "
        f"left alone: rename or remove it, or set annotation vm-name on {ctx.where} "
        "before it creates its VM"
    )
    await ctx.ready(ok=False, reason=R.VM_NAME_CONFLICT, message=message)
    await ctx.event(EventType.WARNING, VmEvent.VM_NAME_CONFLICT, message)
    return Result(requeue=True)


async def _failed(ctx: VmContext, message: str, *, record: CreationRecord | None = None) -> None:
    edits = [ctx.ready_edit(ok=False, reason=R.VM_CREATE_FAILED, message=message)]
    if record is not None:
        edits.append(_attempt_edit(record))  # keeps what else the record holds (taskRef)
    await ctx.write(*edits)
    await ctx.event(EventType.WARNING, VmEvent.VM_CREATE_FAILED, message)
