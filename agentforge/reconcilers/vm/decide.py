"""The `vm` controller's decisions, pure: given what status recorded and what vSphere
reports, what may be done to a VM.

The rules (docs/design/0002, "VM lifecycle"):

* a VM is **ours** when its ownership markers equal the expected ones exactly; an
  **unmarked** VM counts as ours only when its BIOS UUID *and* name equal what status
  recorded (an adopted VM, or one the Go operator made); anything else is not ours
  and nothing destructive or overwriting happens to it;
* with a creation record (the pass after a task ended, or a restart), vCenter is
  first asked about the recorded task (the create; a power-on only in a record an
  earlier version wrote, phase `PowerOnIssued`): still running -> wait for it (the
  pass ends; the task's end wakes the VsphereAgent), nothing else. Then the VM is
  looked up by the task's result (or the recorded BIOS UUID), then by name in the
  recorded folder; ours and running -> record it, ours but not finished (powered off) ->
  finish it through the idempotent create, anything else -> a name conflict, left
  alone. Absent by every key -> create, but only when no `CreateVM_Task` runs in the
  folder: vCenter does not say which name such a task creates, and it may be ours (a
  start whose reference was never recorded, or a task vCenter has since forgotten,
  which is never read as "absent" by itself);
* a power-on this process started and noted (no status field records it,
  `power_on_ended`): succeeded -> record the VM as read before it; refused as already
  done or busy (`InvalidState`, a transient fault such as `TaskInProgress`) or
  forgotten by vCenter -> the VM decides, as above; any other fault -> reported, and
  powered on again after the backoff;
* an adopted VM is stamped only when its name and BIOS UUID match the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from agentforge import identity
from agentforge.api import names
from agentforge.api.vsphereagent import CreationPhase, CreationRecord, VsphereAgent
from agentforge.vsphere.model import markers as vmarkers
from agentforge.vsphere.model.errors import AlreadyExists, InvalidState, TransientError
from agentforge.vsphere.model.facts import PowerState, TaskFacts, TaskState, VmFacts
from agentforge.vsphere.model.markers import OwnershipMarkers, Verdict

__all__ = [
    "AdoptStep",
    "Adoption",
    "Ownership",
    "PowerOnEnd",
    "Resume",
    "ResumeStep",
    "adoption",
    "ownership",
    "power_on_ended",
    "record_markers",
    "recorded_identity",
    "resume",
]


class Ownership(StrEnum):
    OURS = "ours"
    UNMARKED_MATCH = "unmarked, BIOS UUID and name match the record"
    NOT_OURS = "not ours"


def ownership(
    vm: VmFacts,
    *,
    expected: OwnershipMarkers,
    recorded_uuid: str | None,
    recorded_name: str | None,
) -> Ownership:
    verdict = vmarkers.verdict(found=vm.markers, expected=expected)
    if verdict is Verdict.OURS:
        return Ownership.OURS
    if (
        verdict is Verdict.UNMARKED
        and recorded_uuid
        and recorded_name
        and vm.bios_uuid == identity.normalize_uuid(recorded_uuid)
        and vm.name == recorded_name
    ):
        return Ownership.UNMARKED_MATCH
    return Ownership.NOT_OURS


def record_markers(record: CreationRecord) -> OwnershipMarkers:
    o = record.ownership
    return OwnershipMarkers(
        pool_namespace=o.pool_namespace,
        pool_name=o.pool_name,
        pool_uid=o.pool_uid,
        vsphere_agent=o.vsphere_agent,
    )


class ResumeStep(StrEnum):
    CREATE = "create"
    """No VM by UUID or name: create it (same name, same BIOS UUID)."""
    FINISH = "finish"
    """Our VM exists but may be unfinished: run the idempotent create to converge it."""
    RECORD = "record"
    """Our VM exists and runs: record its identity, call nothing."""
    CONFLICT = "conflict"
    """A VM holds our UUID or name but is not ours: leave it alone and report."""
    WAIT = "wait"
    """A create task that may make our VM still runs: create nothing, come back later."""


@dataclass(frozen=True, slots=True)
class Resume:
    step: ResumeStep
    vm: VmFacts | None = None
    why: str = ""
    """What the recorded task and the lookups said (for conditions and logs)."""


def resume(
    record: CreationRecord,
    *,
    by_uuid: VmFacts | None,
    by_name: VmFacts | None,
    task: TaskFacts | None = None,
    task_gone: bool = False,
    creates_in_flight: Sequence[TaskFacts] = (),
) -> Resume:
    """What to do with a recorded creation (see the module doc).

    `task` is the recorded create task as vCenter reports it (None: none recorded, or
    `task_gone`: vCenter no longer knows it); `by_uuid` is the VM the task made, else
    the one with the recorded BIOS UUID; `creates_in_flight` the `CreateVM_Task`s still
    running in the folder (asked only when no VM was found).
    """
    if task is not None and task.running:
        return Resume(
            ResumeStep.WAIT, why=f"{_task_kind(record)} task {task.moid} is still {task.state}"
        )
    found = _found(record, by_uuid=by_uuid, by_name=by_name)
    if found is not None:
        return found
    told = _what_the_task_told(record, task=task, task_gone=task_gone)
    if creates_in_flight:
        running = ", ".join(sorted(t.moid for t in creates_in_flight))
        return Resume(
            ResumeStep.WAIT,
            why=f"{told}; VM {record.vm_name} is not there yet and create task(s) {running} "
            f"still run in folder {record.folder}",
        )
    return Resume(ResumeStep.CREATE, why=f"{told}; no VM {record.vm_name} by UUID or name")


class PowerOnEnd(StrEnum):
    WAIT = "wait"
    """Still running: its end wakes the VsphereAgent."""
    DONE = "done"
    """Succeeded: the VM runs; record it."""
    LOOK_UP = "look up"
    """Refused as already on or busy, or forgotten by vCenter: the VM decides."""
    FAILED = "failed"
    """Failed: report it once; the VM is powered on again after the backoff."""


def power_on_ended(task: TaskFacts | None) -> PowerOnEnd:
    """What a noted power-on's outcome means (`task` None: vCenter forgot it).

    `InvalidState` (`InvalidPowerState`) is what vCenter answers a power-on of a VM that
    runs already; a transient fault (`TaskInProgress`) one that another task holds. Both
    leave a VM whose power state says what is next, as does a forgotten task.
    """
    if task is None:
        return PowerOnEnd.LOOK_UP
    if task.running:
        return PowerOnEnd.WAIT
    if task.error is None:
        return PowerOnEnd.DONE if task.state is TaskState.SUCCESS else PowerOnEnd.LOOK_UP
    if isinstance(task.error, (InvalidState, TransientError)):
        return PowerOnEnd.LOOK_UP
    return PowerOnEnd.FAILED


def _task_kind(record: CreationRecord) -> str:
    return "power-on" if record.phase == CreationPhase.POWER_ON_ISSUED else "create"


def _what_the_task_told(record: CreationRecord, *, task: TaskFacts | None, task_gone: bool) -> str:
    kind = _task_kind(record)
    if task_gone:
        return f"vCenter no longer knows {kind} task {record.task_ref}"
    if task is None:
        return f"no {kind} task was recorded"
    if task.state is TaskState.ERROR:
        if isinstance(task.error, AlreadyExists):  # DuplicateName, holder gone since
            return f"{kind} task {task.moid} found the name taken ({task.error})"
        return f"{kind} task {task.moid} failed ({task.error})"
    return f"{kind} task {task.moid} succeeded but the VM is gone"


def _found(
    record: CreationRecord, *, by_uuid: VmFacts | None, by_name: VmFacts | None
) -> Resume | None:
    expected = record_markers(record)
    if by_uuid is not None:
        if vmarkers.verdict(found=by_uuid.markers, expected=expected) is not Verdict.OURS:
            return Resume(ResumeStep.CONFLICT, by_uuid)
        if by_uuid.name == record.vm_name and by_uuid.power_state is not PowerState.ON:
            return Resume(ResumeStep.FINISH, by_uuid)
        return Resume(ResumeStep.RECORD, by_uuid)
    if by_name is not None:
        if vmarkers.verdict(found=by_name.markers, expected=expected) is Verdict.OURS:
            return Resume(ResumeStep.FINISH, by_name)
        return Resume(ResumeStep.CONFLICT, by_name)
    return None


def recorded_identity(agent: VsphereAgent) -> tuple[str | None, str | None]:
    """(VM name, BIOS UUID) as status recorded them (creation record, vm, annotation)."""
    record = agent.status.creation
    vm = agent.status.vm
    name = (
        (record.vm_name if record else None)
        or (vm.name if vm and vm.name else None)
        or agent.metadata.annotations.get(names.ANNOTATION_VM_NAME)
        or None
    )
    uuid = (vm.bios_uuid if vm and vm.bios_uuid else None) or (record.bios_uuid if record else None)
    return name, identity.normalize_uuid(uuid) if uuid else None


class AdoptStep(StrEnum):
    UNAVAILABLE = "unavailable"
    """No VM matches the name (and UUID): nothing is created, the user is told."""
    MISMATCH = "mismatch"
    """The VM carries another owner's markers: left alone."""
    STAMP = "stamp"
    """Unmarked, name and UUID match the record: write our markers."""
    ADOPTED = "adopted"
    """Already ours: record it."""


@dataclass(frozen=True, slots=True)
class Adoption:
    step: AdoptStep
    message: str


def adoption(
    vm: VmFacts | None,
    *,
    name: str,
    bios_uuid: str | None,
    expected: OwnershipMarkers,
) -> Adoption:
    """What to do with the VM found for an adopted VsphereAgent's record."""
    wanted = f"VM {name}" + (f" (BIOS UUID {bios_uuid})" if bios_uuid else "")
    if vm is None:
        return Adoption(AdoptStep.UNAVAILABLE, f"{wanted} not found")
    if vm.name != name:
        return Adoption(
            AdoptStep.UNAVAILABLE,
            f"the VM with BIOS UUID {vm.bios_uuid} is named {vm.name}, not {name}",
        )
    if bios_uuid and vm.bios_uuid != identity.normalize_uuid(bios_uuid):
        return Adoption(
            AdoptStep.UNAVAILABLE, f"VM {name} has BIOS UUID {vm.bios_uuid}, not {bios_uuid}"
        )
    verdict = vmarkers.verdict(found=vm.markers, expected=expected)
    if verdict is Verdict.OURS:
        return Adoption(AdoptStep.ADOPTED, f"{wanted} carries our ownership markers")
    if verdict is Verdict.UNMARKED:
        return Adoption(AdoptStep.STAMP, f"{wanted} is unmarked; stamping ownership markers")
    return Adoption(
        AdoptStep.MISMATCH,
        f"{wanted} carries another owner's markers ({vmarkers.parse(vm.markers) or 'partial'}); "
        "it is left alone",
    )
