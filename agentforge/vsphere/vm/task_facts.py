"""What vCenter says about a task we started earlier, found by its moref.

A create's task moref is recorded in status the moment the task starts, so a restarted
operator asks vCenter about that task before it decides anything (CAPV's pattern).
Promises:
- `read` returns the task's state, its result's moref and its typed error; a task
  vCenter no longer knows (tasks expire) raises `errors.NotFound`, which means "ask
  again by other keys", never "the VM is absent" and never success;
- nothing here waits: the caller followed the task when it started it
  (`task_follow`) and reads it again when the news of its end came;
- `creates_in_flight` lists the `CreateVM_Task`s still queued or running in a folder
  (its `recentTask`). vCenter does not tell which VM name such a task creates, so every
  one of them counts as possibly ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentforge.vsphere import props
from agentforge.vsphere.model import errors
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks import waiter as tasks
from agentforge.vsphere.vm import resolve_placement as placement
from agentforge.vsphere.vmomi import PC, vim

CREATE_VM = "Folder.createVm"  # TaskInfo.descriptionId of CreateVM_Task
PATHS = ("info.state", "info.error", "info.result", "info.descriptionId")


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TaskFacts:
    moid: str
    state: TaskState
    description_id: str = ""
    result_moid: str | None = None
    """The moref of `info.result` when it is a managed object (a created VM)."""
    error: errors.VsphereError | None = None
    """The task's fault, typed as every other error of this layer."""

    @property
    def running(self) -> bool:
        return self.state in (TaskState.QUEUED, TaskState.RUNNING)


def task_ref(session: Session, moid: str) -> Any:
    return vim.Task(moid, session.content.propertyCollector._stub)


async def read(session: Session, moid: str) -> TaskFacts:
    """The task's facts; `errors.NotFound` when vCenter no longer knows the task. A task
    the session's waiter saw end costs no request."""
    seen = session.waiter.finished(moid)
    if seen is not None:
        return _parse(moid, seen)
    found = await _read_one(session, moid)
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
        lambda: props.retrieve(content, objects=[recent], props=[(vim.Task, PATHS)]),
        subject=f"folder {where.folder}",
        action="list recent tasks of",
    )
    found = [_parse(f.moid, f.props) for f in fetched if not props.is_gone(f)]
    return [t for t in found if t.description_id == CREATE_VM and t.running]


async def _read_one(session: Session, moid: str) -> TaskFacts | None:
    content = session.content
    ref = task_ref(session, moid)
    try:
        fetched = await session.call(
            lambda: props.retrieve(
                content, objects=props.object_specs([ref]), props=[(vim.Task, PATHS)]
            ),
            subject=f"task {moid}",
            action="read",
        )
    except errors.NotFound:
        return None
    found = [_parse(f.moid, f.props) for f in fetched if not props.is_gone(f)]
    return found[0] if found else None


def _parse(moid: str, values: dict[str, Any]) -> TaskFacts:
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
