"""Creating a VsphereAgent's VM exactly once, across crashes, without waiting on vCenter
(0002 "VM lifecycle" 3-6; docs/design/0005 for the task model).

Each pass does what the record says is next, starts at most one vCenter task, records
it and returns; the task's end wakes the VsphereAgent (`waits.TaskWaits`), and the next
pass reads the outcome from vCenter by the recorded moref. No worker waits on a task.

1. The pool must have cached its ISO (`status.iso.path`); else `WaitingForISO`, said
   once the VsphereAgent has waited `WAITING_FOR_ISO_QUIET_S` (`waits_quietly_for_iso`:
   a new VsphereAgent's first write is then its checkpoint when its pool caches the
   ISO that soon, as when pool and demand come together).
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
   `PowerOnVM_Task` started and *not* recorded: the power-on is idempotent, so no
   status write guards it; its moref, the record's BIOS UUID and the VM's facts are
   noted in the controller's `TaskWaits` (in memory) and the pass ends; our VM running
   -> step 6; absent after a failed task -> `VMCreateFailed` (the failed task's ref is
   dropped, `attempts` counted) and created again after the queue's backoff; someone
   else's -> `VMNameConflict`, nothing touched.
6. Woken by the power-on's end, the pass reads the noted task once
   (`vm_decide.power_on_ended`): succeeded -> the VM's identity (as noted), the record
   cleared and Ready=True, in one write; failed -> `VMCreateFailed` once, and after
   the queue's backoff the VM (kept) is looked up and powered on again; refused as
   already on or busy (`InvalidState`, `TaskInProgress`) or forgotten by vCenter ->
   the VM decides as in step 5 (running -> this step's write; still off -> powered on
   again after the backoff). Three status writes per created VM: the checkpoint, the
   create's moref, this one.

A restart resumes from the record whatever its phase: the recorded task is asked
about first (running -> wait for it), then the VM by the task's result or the
recorded UUID, then by name in the recorded folder; absent by every key -> create,
unless a `CreateVM_Task` still runs in the folder (then wait: it may be ours, a
start whose moref was never recorded). A power-on started before a crash is not in
the record (phase `CreateIssued`, the create's moref): the VM's power state tells
(running -> step 6 with the VM as looked up; off -> powered on again, which a power-on
still in flight answers with `InvalidPowerState` or `TaskInProgress`, read as above).
A record in phase `PowerOnIssued` (written by an earlier version, with the power-on's
moref and the identity) is still read and resumed by that moref; this version writes
none. A VM whose power-on vCenter refused stays recorded and powered off; its power-on
is retried with backoff (it goes with its VsphereAgent). Waiting is no failure:
Ready=False `VMCreating`.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Final, Literal

from agentforge import identity, vsphere
from agentforge.api import kinds
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.vsphereagent import CreationPhase, CreationRecord, Ownership
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm import lookup as vm_lookup
from agentforge.reconcilers.vm import spread_choice as vm_spread
from agentforge.reconcilers.vm.context import (
    Edit,
    JsonObj,
    StatusWriter,
    VcenterApi,
    VmInputs,
    creation_edit,
    identity_edit,
    is_checkpointed,
    placement_edit,
)
from agentforge.secret_credentials import CredentialsError
from agentforge.vsphere import metrics as vmetrics

if TYPE_CHECKING:
    from agentforge.reconcilers.waits import Noted

__all__ = [
    "IN_FLIGHT_RECHECK_S",
    "WAITING_FOR_ISO_QUIET_S",
    "ensure_created",
    "vm_name",
    "waits_quietly_for_iso",
]

log = logging.getLogger(__name__)

R = VsphereAgentReason
P = CreationPhase
IN_FLIGHT_RECHECK_S: Final = 2.0
"""How soon a creation waiting for an unrecorded create in the folder is decided again."""
WAITING_FOR_ISO_QUIET_S: Final = 10.0
"""How long a new VsphereAgent waits for its pool's ISO before its status says so."""
POWER_ON: Final = "power-on"
"""The `TaskWaits` note of a started power-on (no status field records it)."""


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


def waits_quietly_for_iso(
    inputs: VmInputs, quiet: float = WAITING_FOR_ISO_QUIET_S
) -> Result | None:
    """A VsphereAgent with no status yet whose pool has no ISO cached, younger than
    `quiet` seconds: the pass writes nothing and looks again when that time is up
    (the pool's ISO, once cached, wakes it sooner: `_pool_changed`)."""
    agent, pool = inputs.agent, inputs.pool
    if pool is None or pool.status.iso.path or agent.status.creation is not None:
        return None
    created = agent.metadata.creation_timestamp
    if created is None or agent.status.conditions:
        return None
    if agent.status.vm is not None and agent.status.vm.bios_uuid:
        return None  # a VM recorded: never a wait
    left = quiet - (inputs.now - created).total_seconds()
    return Result(requeue_after=left) if left > 0 else None


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
    refused = False
    noted = _power_on_noted(inputs, service, record)
    if noted is not None:
        ended = await _power_on_ended(inputs, writer, service, record, noted)
        if ended is not vm_decide.PowerOnEnd.LOOK_UP:
            return ended
        refused = True
    try:
        task, plan = await vm_lookup.look_up(service, inputs, record)
    except vsphere.VsphereError as exc:
        return await _failed(
            writer, f"looking up VM {record.vm_name} failed: {exc}", record=record, exc=exc
        )
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
        # (the recorded task: a create, or an earlier version's recorded power-on)
        doing = "powering on" if record.phase == P.POWER_ON_ISSUED else "creating"
        return await _task_failed(writer, record, task, doing=doing)
    if refused and plan.step is vm_decide.ResumeStep.FINISH:
        # Our power-on did not succeed (refused as busy or "already on", or forgotten)
        # and the VM is still off: powered on again after the queue's backoff, not at once.
        return Result(requeue=True)
    if plan.step is vm_decide.ResumeStep.CREATE:
        if record.failure_domain and vm_spread.domain_of(pool, record.failure_domain) is None:
            await _failed(writer, vm_lookup.domain_gone(inputs, record), record=record)
            return Result(requeue=True)
        return await _start(inputs, writer, service, record, _request(inputs, record))
    assert plan.vm is not None  # FINISH: our VM exists and does not run yet
    return await _converge(inputs, writer, service, record, _request(inputs, record), vm=plan.vm)


async def _begin(inputs: VmInputs, writer: StatusWriter, service: VcenterApi) -> Result | None:
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
                return await _failed(writer, f"cannot place the VM: {exc}", exc=exc)
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
        if slot.task is None:
            slot.release()


async def _start(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    record: CreationRecord,
    request: vsphere.VmRequest,
    *,
    slot: vsphere.Slot | None = None,
) -> Result | None:
    """Start `CreateVM_Task` and record its moref; the task's end wakes the key."""
    slot = slot or inputs.vcenter.claim_slot(service)
    try:
        started = await service.start_create(request=request, slot=slot)
    except vsphere.CreationInFlight as exc:
        return await _waiting(inputs, writer, record, str(exc))
    except vsphere.AlreadyExists:
        return await _conflict(inputs, writer, record, None)
    except vsphere.VsphereError as exc:
        return await _failed(
            writer, f"creating VM {record.vm_name} failed: {exc}", record=record, exc=exc
        )
    if started.existing is not None:  # our own VM holds the name: take it over
        return await _converge(inputs, writer, service, record, request, vm=started.existing)
    assert started.task is not None
    await _record_task(inputs, writer, record, started.task)
    return inputs.vcenter.wait_task(service, started.task)


async def _converge(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    record: CreationRecord,
    request: vsphere.VmRequest,
    *,
    vm: vsphere.VmFacts,
) -> Result | None:
    """Our VM exists: tags, then the power-on started and noted (no status write)."""
    slot = inputs.vcenter.claim_slot(service)
    try:
        task = await service.converge_vm(request=request, vm_moid=vm.moid, slot=slot)
    except vsphere.VsphereError as exc:
        return await _failed(
            writer, f"powering on VM {record.vm_name} failed: {exc}", record=record, exc=exc
        )
    if task is None:  # it runs already
        return await _done(inputs, writer, record, vm)
    # No status write: a power-on is idempotent and the VM's power state says after a
    # crash whether it happened. The next pass reads its outcome from this note.
    inputs.vcenter.note(service, POWER_ON, task=task, about=record.bios_uuid, vm=vm)
    return inputs.vcenter.wait_task(service, task)


def _power_on_noted(inputs: VmInputs, service: VcenterApi, record: CreationRecord) -> Noted | None:
    """The power-on this process started for this very record (read once)."""
    noted = inputs.vcenter.take_note(service, POWER_ON)
    if noted is None or noted.vm is None:
        return None
    if identity.normalize_uuid(noted.about) != identity.normalize_uuid(record.bios_uuid):
        return None  # another record's (a VsphereAgent made anew under the same name)
    return noted


async def _power_on_ended(
    inputs: VmInputs,
    writer: StatusWriter,
    service: VcenterApi,
    record: CreationRecord,
    noted: Noted,
) -> Result | Literal[vm_decide.PowerOnEnd.LOOK_UP] | None:
    """The noted power-on's outcome: wait, done, failed, or `PowerOnEnd.LOOK_UP` (the VM
    decides: `vm_lookup.look_up`)."""
    assert noted.vm is not None
    if inputs.vcenter.awaiting(service, noted.task):  # woken by something else
        inputs.vcenter.note(service, POWER_ON, task=noted.task, about=noted.about, vm=noted.vm)
        return inputs.vcenter.wait_task(service, noted.task)
    try:
        task: vsphere.TaskFacts | None = await service.task(task_ref=noted.task)
    except vsphere.NotFound:
        task = None  # forgotten by vCenter: never success nor absence, the VM decides
    except vsphere.VsphereError as exc:  # the lookup asks vCenter next, and reports
        log.info("%s: reading power-on task %s failed: %s", inputs.where, noted.task, exc)
        return vm_decide.PowerOnEnd.LOOK_UP
    end = vm_decide.power_on_ended(task)
    if end is vm_decide.PowerOnEnd.WAIT:  # (ended news lost: follow it again)
        inputs.vcenter.note(service, POWER_ON, task=noted.task, about=noted.about, vm=noted.vm)
        await service.follow_task(task_ref=noted.task)
        return inputs.vcenter.wait_task(service, noted.task)
    if end is vm_decide.PowerOnEnd.DONE:
        return await _done(inputs, writer, record, noted.vm)
    if end is vm_decide.PowerOnEnd.FAILED:
        assert task is not None
        return await _task_failed(writer, record, task, doing="powering on")
    log.info(
        "%s: power-on task %s of VM %s: %s; the VM decides",
        inputs.where,
        noted.task,
        record.vm_name,
        task.error if task is not None else "vCenter no longer knows it",
    )
    return vm_decide.PowerOnEnd.LOOK_UP


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
    inputs: VmInputs, writer: StatusWriter, record: CreationRecord, moid: str
) -> None:
    """Checkpoint the started create's moref into this very record (phase
    `CreateIssued`), with what the pass has pending."""

    def edit(obj: JsonObj) -> None:
        creation = obj["status"].get("creation")
        if creation and creation.get("biosUUID") == record.bios_uuid:
            creation["phase"] = P.CREATE_ISSUED.value
            creation["taskRef"] = moid  # only into this very record, never another one

    try:
        await writer.write(edit)
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
    writer: StatusWriter, record: CreationRecord, task: vsphere.TaskFacts, *, doing: str
) -> Result:
    """A task of the creation (`doing`: "creating", "powering on") failed and nothing
    runs: report it once (a recorded task's ref goes with the report; a noted power-on
    was forgotten when read) and try again after the queue's backoff."""
    vmetrics.vm_op("create", vmetrics.result_of(task.error))
    message = f"{doing} VM {record.vm_name} failed: {task.error}"
    edits = [
        writer.ready_edit(ok=False, reason=R.VM_CREATE_FAILED, message=message),
        _failed_attempt_edit(record, drop_task=task.moid == record.task_ref),
    ]
    await writer.write(*edits)
    await writer.event(EventType.WARNING, VmEvent.VM_CREATE_FAILED, message)
    return Result(requeue=True)


async def _failed(
    writer: StatusWriter,
    message: str,
    *,
    record: CreationRecord | None = None,
    exc: Exception | None = None,
) -> Result:
    """Report a failure; the result to return.

    A vCenter that is unavailable (`vsphere.SessionUnavailable`: a login refused or
    deferred, calls failing fast while it does not answer) is not an attempt of this
    VM: `attempts` stays, and the pass comes back when vCenter may be tried again
    (`retry_at`), not with the queue's backoff. Counting it changed the status on every
    pass, and each write's own watch event ran the next pass at once: a black-holed
    vCenter made every VsphereAgent with a record write its status every 2 s."""
    unavailable = isinstance(exc, vsphere.SessionUnavailable)
    edits = [writer.ready_edit(ok=False, reason=R.VM_CREATE_FAILED, message=message)]
    if record is not None and not unavailable:
        edits.append(_failed_attempt_edit(record))  # keeps what else the record holds
    await writer.write(*edits)
    await writer.event(EventType.WARNING, VmEvent.VM_CREATE_FAILED, message)
    if isinstance(exc, vsphere.SessionUnavailable) and exc.retry_at is not None:
        return Result(requeue_after=max((exc.retry_at - writer.now).total_seconds(), 1.0))
    return Result(requeue=True)
