"""Starting a task and reading how it ended: `run_task` and `task_outcome`.

`run_task` starts a vCenter task (restarting it while its fault is transient) and
waits for it through the session's one `tasks.TaskWaiter` (the datastore's file
tasks, which end within a request's time; every VM task is followed instead); `task_outcome` turns a
finished task's `info.state`/`info.error`/`info.result` into its result or its fault,
typed as every other error of this layer. Both are re-exported by `tasks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentforge.vsphere import faults
from agentforge.vsphere.model import errors

if TYPE_CHECKING:
    from agentforge.vsphere.tasks.host import TaskHost


async def run_task(
    session: TaskHost,
    start: Callable[[], Any],
    *,
    subject: str,
    action: str,
) -> Any:
    """Start a task and wait for it; transient task faults restart it (tenacity)."""
    async for attempt in session.retrying():
        with attempt:
            task = await session.call(start, subject=subject, action=action)
            return await session.waiter.wait(task, subject=subject, action=action)
    raise AssertionError("unreachable")  # pragma: no cover


def task_outcome(props: dict[str, Any], *, subject: str, action: str) -> Any:
    """The result of a finished task, or its fault as a typed error."""
    if props.get("info.state") == "success":
        return props.get("info.result")
    fault = props.get("info.error")
    # pyVmomi deserializes LocalizedMethodFault as the fault itself (message in `msg`).
    inner = fault if isinstance(fault, BaseException) else getattr(fault, "fault", None)
    if isinstance(inner, BaseException):
        err = faults.classify(inner, subject=subject, action=action)
        return _raise(err)
    return _raise(errors.TaskFailed(f"{action} {subject} failed without a fault", subject=subject))


def _raise(err: errors.VsphereError) -> Any:
    raise err
