"""What the operator knows about a VM, read in one PropertyCollector round trip.

`VM_PATHS` is the whole path set; `parse_vm` turns the raw property dict into a
frozen `VmFacts` (defined, with the other value types, in `model.facts` and
re-exported here) without further requests. The facts cover identity (name, BIOS and
instance UUID, primary MAC), power state, ownership markers, every CD-ROM (device
key, backing file, connection state) and a pending question, which is all that the
reconcilers and the ejection recovery need to decide.

**Tasks** (`read_task`, `creates_in_flight`): what vCenter says about a task we
started earlier, found by its moref. A create's task moref is recorded in status the
moment the task starts, so a restarted operator asks vCenter about that task before
it decides anything (CAPV's pattern). `read_task` returns the task's state, its
result's moref and its typed error (`model.facts.TaskFacts`); a task vCenter no
longer knows (tasks expire) raises `errors.NotFound`, which means "ask again by other
keys", never "the VM is absent" and never success. Nothing here waits: the caller
followed the task when it started it (`Session.follow`) and reads it again when the
news of its end came. `creates_in_flight` lists the `CreateVM_Task`s still queued or
running in a folder (its `recentTask`); vCenter does not tell which VM name such a
task creates, so every one of them counts as possibly ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentforge import identity
from agentforge.vsphere import vmomi
from agentforge.vsphere.model import errors, markers
from agentforge.vsphere.model.facts import (
    CDROM_LOCK_MESSAGE,
    Cdrom,
    Choice,
    MediumKind,
    PowerState,
    Question,
    TaskFacts,
    TaskState,
    VmFacts,
)
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks import waiter as tasks
from agentforge.vsphere.vm import resolve_placement as placement
from agentforge.vsphere.vmomi import PC, Lazy, vim

VM_PATHS = (
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.hardware.device",
    "config.extraConfig",
    "runtime.powerState",
    "runtime.question",
)
_CD: Any = Lazy("vim.vm.device.VirtualCdrom")
CREATE_VM = "Folder.createVm"  # TaskInfo.descriptionId of CreateVM_Task
TASK_PATHS = ("info.state", "info.error", "info.result", "info.descriptionId")


def parse_vm(moid: str, props: Mapping[str, Any]) -> VmFacts:
    devices = list(props.get("config.hardware.device") or [])
    macs = tuple(_macs(devices))
    extra = {str(o.key): str(o.value) for o in props.get("config.extraConfig") or []}
    return VmFacts(
        moid=moid,
        name=str(props.get("name") or ""),
        bios_uuid=_uuid(props.get("config.uuid")),
        instance_uuid=_uuid(props.get("config.instanceUuid")),
        primary_mac=macs[0] if macs else None,
        macs=macs,
        power_state=_power(props.get("runtime.powerState")),
        markers=markers.extract(extra),
        cdroms=tuple(parse_cdrom(d) for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)),
        question=parse_question(props.get("runtime.question")),
    )


def parse_cdrom(device: Any) -> Cdrom:
    backing = device.backing
    if isinstance(backing, vim.vm.device.VirtualCdrom.IsoBackingInfo):
        kind, file_name = MediumKind.ISO, str(backing.fileName or "")
    elif isinstance(backing, (_CD.RemotePassthroughBackingInfo, _CD.RemoteAtapiBackingInfo)):
        kind, file_name = MediumKind.CLIENT, None
    elif isinstance(backing, (_CD.AtapiBackingInfo, _CD.PassthroughBackingInfo)):
        kind, file_name = MediumKind.HOST, None
    else:
        kind, file_name = MediumKind.NONE, None
    conn = device.connectable
    return Cdrom(
        key=int(device.key),
        controller_key=int(device.controllerKey or 0),
        unit_number=int(device.unitNumber or 0),
        kind=kind,
        backing_file=file_name,
        connected=bool(conn.connected) if conn is not None else False,
        start_connected=bool(conn.startConnected) if conn is not None else False,
    )


def parse_question(info: Any) -> Question | None:
    if info is None:
        return None
    choice = getattr(info, "choice", None)
    options = getattr(choice, "choiceInfo", None) or []
    return Question(
        id=str(info.id),
        text=str(info.text or ""),
        message_ids=tuple(str(m.id) for m in getattr(info, "message", None) or []),
        choices=tuple(Choice(key=str(o.key), label=str(o.label or "")) for o in options),
    )


def _macs(devices: list[Any]) -> list[str]:
    nics = sorted(
        (d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)),
        key=lambda d: int(d.key),
    )
    return [identity.require_mac(n.macAddress) for n in nics if n.macAddress]


def _uuid(value: Any) -> str | None:
    if not value:
        return None
    return identity.normalize_uuid(str(value)) or str(value).lower()


def _power(value: Any) -> PowerState:
    try:
        return PowerState(str(value))
    except ValueError:
        return PowerState.UNKNOWN


__all__ = [
    "CDROM_LOCK_MESSAGE",
    "VM_PATHS",
    "Cdrom",
    "Choice",
    "MediumKind",
    "PowerState",
    "Question",
    "VmFacts",
    "parse_cdrom",
    "parse_question",
    "parse_vm",
]


# --- tasks -----------------------------------------------------------------------


def task_ref(session: Session, moid: str) -> Any:
    return vim.Task(moid, session.content.propertyCollector._stub)


async def read_task(session: Session, moid: str) -> TaskFacts:
    """The task's facts; `errors.NotFound` when vCenter no longer knows the task. A task
    the session's waiter saw end costs no request."""
    seen = session.waiter.finished(moid)
    if seen is not None:
        return _parse_task(moid, seen)
    found = await _read_task(session, moid)
    if found is None:
        raise errors.NotFound(f"vCenter no longer knows task {moid}", subject=f"task {moid}")
    return found


async def creates_in_flight(session: Session, where: placement.Placement) -> list[TaskFacts]:
    """The `CreateVM_Task`s still queued or running in the placement's folder."""
    resolved = await placement.resolve(session, where)
    if resolved.folder is None:
        return []
    content = session.content
    recent = PC.ObjectSpec(
        obj=resolved.folder,
        skip=True,
        selectSet=[PC.TraversalSpec(name="recent", type=vim.Folder, path="recentTask", skip=False)],
    )
    fetched = await session.call(
        lambda: vmomi.retrieve(content, objects=[recent], props=[(vim.Task, TASK_PATHS)]),
        subject=f"folder {where.folder}",
        action="list recent tasks of",
    )
    found = [_parse_task(f.moid, f.props) for f in fetched if not vmomi.is_gone(f)]
    return [t for t in found if t.description_id == CREATE_VM and t.running]


async def _read_task(session: Session, moid: str) -> TaskFacts | None:
    content = session.content
    ref = task_ref(session, moid)
    try:
        fetched = await session.call(
            lambda: vmomi.retrieve(
                content, objects=vmomi.object_specs([ref]), props=[(vim.Task, TASK_PATHS)]
            ),
            subject=f"task {moid}",
            action="read",
        )
    except errors.NotFound:
        return None
    found = [_parse_task(f.moid, f.props) for f in fetched if not vmomi.is_gone(f)]
    return found[0] if found else None


def _parse_task(moid: str, values: dict[str, Any]) -> TaskFacts:
    state = TaskState(str(values.get("info.state") or TaskState.QUEUED))
    result_moid = getattr(values.get("info.result"), "_moId", None)
    error: errors.VsphereError | None = None
    if state is TaskState.ERROR:
        try:
            tasks.task_outcome(values, subject=f"task {moid}", action="run")
        except errors.VsphereError as exc:
            error = exc
    return TaskFacts(
        moid=moid,
        state=state,
        description_id=str(values.get("info.descriptionId") or ""),
        result_moid=str(result_moid) if result_moid else None,
        error=error,
    )
