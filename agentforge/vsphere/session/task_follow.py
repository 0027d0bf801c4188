"""Following a task nobody waits for: its end is news for whoever started it.

A controller starts a vCenter task, records its reference and returns; `follow`
registers the task with the session's one `TaskWaiter` (the PropertyCollector long
poll) and, when the task ends, frees its slot in the vCenter's `TaskSlots` and tells
the session's `task_ended` listener (the registry's, which tells the controllers,
which reconcile the object that waits for it). No coroutine waits meanwhile.

Promises:
- registration only: `follow` returns at once (or raises `VsphereError` for a closed
  session, freeing the slot);
- the news comes once per follow, also when the task can no longer be watched (vCenter
  forgot it, the session was closed or its re-login failed): the listener then looks
  at the task by its recorded reference and decides from what vCenter says;
- a task followed without a slot (found running after a restart) is counted in the
  cap too, so new starts make room for it;
- with `vm`, a question the VM raises while the task runs is news too (a CD-ROM
  disconnect blocked by the guest's lock waits for an answer, not for the task).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentforge.vsphere.model import errors
from agentforge.vsphere.tasks.slots import Slot

if TYPE_CHECKING:
    from agentforge.vsphere.session.vcenter_session import Session

__all__ = ["follow"]

log = logging.getLogger(__name__)


def follow(session: Session, task: Any, *, slot: Slot | None = None, vm: Any = None) -> str:
    """Report the end of `task` (see the module doc); returns its moref."""
    moid = str(task._moId)
    token = f"follow:{moid}"
    slots = session.slots
    if slot is not None:
        slot.bind(moid)
    elif not slots.holds(moid):
        slots.adopt(moid)
    where = session.key.netloc

    def ended(values: dict[str, Any] | None, exc: BaseException | None) -> None:
        slots.finished(moid)
        if vm is not None:
            session.waiter.unfollow(str(vm._moId), token=token)
        if exc is not None:
            log.info("vCenter %s: task %s can no longer be watched: %s", where, moid, exc)
        session.task_ended(where, moid)

    def asked(values: dict[str, Any] | None, exc: BaseException | None) -> None:
        if exc is None:  # (the task's own watch reports what went wrong)
            session.task_ended(where, moid)

    try:
        session.waiter.follow(task, token=token, ended=ended)
        if vm is not None:
            session.waiter.follow(vm, token=token, ended=asked, question=True)
    except errors.VsphereError:
        slots.finished(moid)
        raise
    return moid
