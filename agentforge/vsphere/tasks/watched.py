"""One watched object of the task waiter, and who is told when it is done.

A watch is shared by everyone interested in one object (a task, or a VM's pending
question): callers that wait hold a future, callers that do not wait (`follow`) leave
a callback. Both are told once, together: the object's properties when `done` says
so, or the error that ended the watch (the session closed, vCenter forgot the
object). A callback that raises is logged and never stops the others.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentforge.vsphere.tasks import view as task_view
from agentforge.vsphere.tasks.view import QUESTION_PATH
from agentforge.vsphere.vmomi import vim

__all__ = ["ENDED_KEPT", "Ended", "Seen", "Watch", "has_question", "task_done"]

ENDED_KEPT = 4096
"""Finished tasks remembered after they left the view (their outcome never changes)."""

log = logging.getLogger(__name__)

Ended = Callable[[dict[str, Any] | None, BaseException | None], None]
"""A follower's callback: the object's properties once done, or why it cannot be watched."""


@dataclass(eq=False)
class Watch:
    ref: Any
    done: Callable[[dict[str, Any]], bool]
    terminal: bool  # True for tasks: once done, their properties never change again
    futures: list[asyncio.Future[dict[str, Any]]] = field(default_factory=list)
    followers: dict[str, Ended] = field(default_factory=dict)
    """Callbacks of callers that do not wait (`follow`), by the caller's token."""

    @property
    def wanted(self) -> bool:
        return bool(self.futures or self.followers)

    def resolve(self, values: dict[str, Any]) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_result(dict(values))
        self.futures.clear()
        self._tell(dict(values), None)

    def fail(self, exc: BaseException) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.set_exception(exc)
        self.futures.clear()
        self._tell(None, exc)

    def _tell(self, values: dict[str, Any] | None, exc: BaseException | None) -> None:
        followers, self.followers = self.followers, {}
        for ended in followers.values():
            try:
                ended(values, exc)
            except Exception:
                log.exception("a follower of %s failed", task_view.describe(self.ref))


class Seen:
    """What the long poll reported: the last properties of each object in the view,
    the tasks seen finished while still in it, and the last `ENDED_KEPT` finished
    tasks (so reading a task's outcome after its end costs no request)."""

    def __init__(self) -> None:
        self.props: dict[str, dict[str, Any]] = {}
        self.finished: dict[str, dict[str, Any]] = {}
        self._ended: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    def apply(self, updates: Any) -> list[tuple[str, dict[str, Any]]]:
        """Fold one `WaitForUpdatesEx` answer in; the objects that changed, with their
        properties now (objects that left the view are forgotten, not returned)."""
        changed: list[tuple[str, dict[str, Any]]] = []
        for filter_update in updates.filterSet or []:
            for obj_update in filter_update.objectSet or []:
                key = obj_update.obj._moId
                if obj_update.kind == "leave":  # left the view (we removed it, or it is gone)
                    self.props.pop(key, None)
                    continue
                values = self.props.setdefault(key, {})
                for change in obj_update.changeSet or []:
                    values[change.name] = None if change.op == "remove" else change.val
                if task_done(values) and isinstance(obj_update.obj, vim.Task):
                    self.finished[key] = dict(values)
                    self._ended[key] = dict(values)
                    while len(self._ended) > ENDED_KEPT:
                        self._ended.popitem(last=False)
                changed.append((key, values))
        return changed

    def ended_task(self, moid: str) -> dict[str, Any] | None:
        found = self.finished.get(moid) or self._ended.get(moid)
        return dict(found) if found is not None else None


def task_done(props: dict[str, Any]) -> bool:
    return props.get("info.state") in ("success", "error")


def has_question(props: dict[str, Any]) -> bool:
    return props.get(QUESTION_PATH) is not None
