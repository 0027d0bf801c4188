"""The task waiter's objects in vCenter: a private PropertyCollector, a ListView, a filter.

`build` creates the collector and its one filter, which reads (through the view) the
task paths of every task and the pending question of every VM in the view; `modify`
adds and removes view members. The view is built over a list of references, and
vCenter judges that list as a whole: `CreateListView` refuses it when one member no
longer exists (ManagedObjectNotFound, naming just one of them), `ModifyListView`
returns the members it could not add (or, on some servers, refuses too). `gone` tells
exactly which references vCenter no longer knows, so the waiter fails only their
watchers, with `errors.NotFound` naming the object, and carries on with the rest.

All calls go through `Session.call` (rate limited, retried while transient, typed).

What the task waiter needs of a session, as a narrow Protocol.

`Session` owns a `TaskWaiter`, and the waiter calls back into its session (calls,
re-login, the login generation, pacing options). Typing those call-backs against
this Protocol instead of `Session` keeps the import graph acyclic: `session` imports
`tasks`, and nothing under `tasks/` imports `session/`.
`Session` satisfies it structurally (mypy checks that where the waiter is built).

One watched object of the task waiter, and who is told when it is done.

A watch is shared by everyone interested in one object (a task, or a VM's pending
question): callers that wait hold a future, callers that do not wait (`follow`) leave
a callback. Both are told once, together: the object's properties when `done` says
so, or the error that ended the watch (the session closed, vCenter forgot the
object). A callback that raises is logged and never stops the others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import tenacity

from agentforge.vsphere import vmomi
from agentforge.vsphere.model import errors
from agentforge.vsphere.vmomi import vim

TASK_PATHS = ("info.state", "info.error", "info.result")
QUESTION_PATH = "runtime.question"
# Errors that may mean "a member of the list is gone": worth asking which one.
MEMBER_FAULTS: tuple[type[errors.VsphereError], ...] = (errors.NotFound, errors.InvalidSpec)


@dataclass(eq=False)
class Collector:
    pc: Any
    view: Any
    generation: int
    version: str = ""


async def build(session: TaskHost, refs: Sequence[Any]) -> Collector:
    """A new collector whose filter watches `refs` (raises as vCenter refused them)."""
    generation = session.generation
    content = session.content
    members = list(refs)

    def create() -> tuple[Any, Any]:
        pc = content.propertyCollector.CreatePropertyCollector()
        try:
            view = content.viewManager.CreateListView(obj=members)
            pc.CreateFilter(
                vmomi.view_filter_spec(
                    view, [(vim.Task, TASK_PATHS), (vim.VirtualMachine, (QUESTION_PATH,))]
                ),
                partialUpdates=True,
            )
        except Exception:
            with contextlib.suppress(Exception):
                pc.DestroyPropertyCollector()  # do not leave one behind per failed attempt
            raise
        return pc, view

    pc, view = await session.call(
        create, subject="task waiter", action="set up property collector for"
    )
    return Collector(pc=pc, view=view, generation=generation)


async def destroy(session: TaskHost, collector: Collector) -> None:
    """Remove a collector and its view from vCenter (best effort: the session's
    objects go with it anyway)."""

    def remove() -> None:
        with contextlib.suppress(Exception):
            collector.pc.DestroyPropertyCollector()
        with contextlib.suppress(Exception):
            collector.view.DestroyView()

    with contextlib.suppress(errors.VsphereError):
        await session.call(remove, subject="task waiter", action="remove the old collector of")


async def modify(
    session: TaskHost, collector: Collector, *, add: Sequence[Any], remove: Sequence[Any]
) -> list[Any]:
    """Change the view's members; returns the references vCenter could not add."""
    adding, removing = list(add), list(remove)
    missing = await session.call(
        lambda: collector.view.ModifyListView(add=adding, remove=removing),
        subject="task list view",
        action="register tasks in",
    )
    return list(missing or [])


async def gone(session: TaskHost, refs: Sequence[Any]) -> list[Any]:
    """The references among `refs` that vCenter no longer knows.

    One read over all of them, reporting missing objects instead of failing; should a
    server refuse that read as a whole, each reference is read on its own.
    """
    unique = list({ref._moId: ref for ref in refs}.values())
    if not unique:
        return []
    try:
        known = await _known(session, unique)
    except errors.NotFound:
        known = set()
        for ref in unique:
            with contextlib.suppress(errors.NotFound):
                known |= await _known(session, [ref])
    return [ref for ref in unique if ref._moId not in known]


async def _known(session: TaskHost, refs: Sequence[Any]) -> set[str]:
    content = session.content
    # A task's state; for other types (VMs) no property: the object's presence is the answer.
    wanted = [(t, ["info.state"] if t is vim.Task else []) for t in dict.fromkeys(map(type, refs))]
    fetched = await session.call(
        lambda: vmomi.retrieve(content, objects=vmomi.object_specs(refs), props=wanted),
        subject=describe(refs[0]) if len(refs) == 1 else "watched tasks",
        action="check",
    )
    return {f.moid for f in fetched if not vmomi.is_gone(f)}


def describe(ref: Any) -> str:
    """`task task-42`, `VM vm-7`: what an error about a watched object names."""
    kinds = ((vim.Task, "task "), (vim.VirtualMachine, "VM "))
    kind = next((name for t, name in kinds if isinstance(ref, t)), "")
    return f"{kind}{ref._moId}"


def gone_error(ref: Any) -> errors.NotFound:
    name = describe(ref)
    return errors.NotFound(
        f"vCenter no longer knows {name} (expired, or a stale reference)", subject=name
    )


T = TypeVar("T")


class TaskPacing(Protocol):
    """The session options the waiter reads (`SessionOptions`)."""

    @property
    def retry_initial_seconds(self) -> float: ...
    @property
    def retry_max_seconds(self) -> float: ...
    @property
    def task_batch_seconds(self) -> float: ...
    @property
    def wait_max_seconds(self) -> int: ...


class TaskWaits(Protocol):
    """The one waiter call `waiter.run_task` makes."""

    async def wait(self, task: Any, *, subject: str, action: str) -> Any: ...


class TaskHost(Protocol):
    """A logged-in vCenter session as the task modules use it."""

    @property
    def generation(self) -> int: ...
    @property
    def content(self) -> Any: ...
    @property
    def options(self) -> TaskPacing: ...
    @property
    def waiter(self) -> TaskWaits: ...

    def retrying(self) -> tenacity.AsyncRetrying: ...
    async def call(self, fn: Callable[[], T], *, subject: str, action: str) -> T: ...
    async def run_blocking(self, fn: Callable[[], T]) -> T: ...
    def touch(self) -> None: ...
    async def relogin(self, *, seen: int) -> None: ...


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
                log.exception("a follower of %s failed", describe(self.ref))


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
