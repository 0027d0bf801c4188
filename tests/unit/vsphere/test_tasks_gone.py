"""A task reference vCenter no longer knows fails alone; the waiter watches on the rest.
A task's end the long poll missed is read when quiet polls rebuild the view.

vcsim refuses `CreateListView` over a stale reference and returns it from
`ModifyListView`; the fake vCenter here covers what the simulator cannot show: a
`ModifyListView` that refuses the whole list, a task forgotten while watched (found when
the view is rebuilt after a re-login), and a long poll that fails over a forgotten member.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest

from agentforge.vsphere import faults, vmomi
from agentforge.vsphere.model import errors
from agentforge.vsphere.session.vcenter_session import SessionOptions
from agentforge.vsphere.tasks.waiter import TaskWaiter
from agentforge.vsphere.vmomi import vim, vmodl
from sim.actors.waiting import eventually

T = TypeVar("T")


class Server:
    """Tasks by moid and their state; the views and collectors made over them."""

    def __init__(
        self,
        *,
        refuse_modify: bool = False,
        lenient_create: bool = False,
        strict_poll: bool = False,
    ) -> None:
        self.refuse_modify = refuse_modify  # ModifyListView faults instead of returning missing
        self.lenient_create = lenient_create  # CreateListView keeps quiet about missing ones
        self.strict_poll = strict_poll  # WaitForUpdatesEx faults over a missing member
        self.states: dict[str, str] = {}
        self.expired = False
        self.cond = threading.Condition()
        self.calls: Counter[str] = Counter()
        self.views: list[View] = []
        self.collectors: list[Collector] = []

    def lose(self, moid: str, state: str) -> None:
        """Change a task's state as a long poll that missed it: no collector made so far
        reports it (a new one reports the current state)."""
        with self.cond:
            self.states[moid] = state
            for collector in self.collectors:
                collector.reported[moid] = state

    def set(self, moid: str, state: str | None) -> None:
        with self.cond:
            if state is None:
                self.states.pop(moid, None)
            else:
                self.states[moid] = state
            self.cond.notify_all()

    def expire(self) -> None:
        with self.cond:
            self.expired = True
            self.cond.notify_all()

    def missing(self, refs: list[Any]) -> list[Any]:
        return [r for r in refs if r._moId not in self.states]


class View:
    def __init__(self, server: Server, members: list[str]) -> None:
        self.server = server
        self.members = members

    def ModifyListView(self, add: list[Any], remove: list[Any]) -> list[Any]:
        server = self.server
        with server.cond:
            server.calls["ModifyListView"] += 1
            missing = server.missing(add)
            if missing and server.refuse_modify:
                raise vmodl.fault.ManagedObjectNotFound(obj=missing[0])
            gone = {r._moId for r in remove}
            self.members = [m for m in self.members if m not in gone]
            self.members += [r._moId for r in add if r not in missing]
            server.cond.notify_all()
            return missing


class Collector:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.view: View | None = None
        self.reported: dict[str, str] = {}
        self.cancelled = False

    def CreateFilter(self, spec: Any, partialUpdates: bool) -> Any:
        self.view = spec.objectSet[0].obj
        return object()

    def CancelWaitForUpdates(self) -> None:
        with self.server.cond:
            self.cancelled = True
            self.server.cond.notify_all()

    def WaitForUpdatesEx(self, version: str, options: Any) -> Any:
        server, view = self.server, self.view
        assert view is not None
        deadline = time.monotonic() + options.maxWaitSeconds
        with server.cond:
            server.calls["WaitForUpdatesEx"] += 1
            if not version:
                self.reported = {}
            while True:
                if server.expired:
                    raise vim.fault.NotAuthenticated()
                if self.cancelled:
                    self.cancelled = False
                    raise vmodl.fault.RequestCanceled()
                if server.strict_poll and any(m not in server.states for m in view.members):
                    raise vmodl.fault.ManagedObjectNotFound()
                changed = {
                    m: server.states[m]
                    for m in view.members
                    if m in server.states and self.reported.get(m) != server.states[m]
                }
                if changed:
                    self.reported.update(changed)
                    return _update_set(changed)
                if time.monotonic() >= deadline:
                    return None
                server.cond.wait(0.05)


class Root:
    """`content.propertyCollector` and `content.viewManager` in one."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def CreatePropertyCollector(self) -> Collector:
        collector = Collector(self.server)
        self.server.collectors.append(collector)
        return collector

    def CreateListView(self, obj: list[Any]) -> View:
        server = self.server
        with server.cond:
            server.calls["CreateListView"] += 1
            missing = server.missing(obj)
            if missing and not server.lenient_create:
                raise vmodl.fault.ManagedObjectNotFound(obj=missing[0])
            view = View(server, [r._moId for r in obj if r not in missing])
            server.views.append(view)
            return view

    def RetrievePropertiesEx(self, specSet: list[Any], options: Any) -> Any:
        """As vCenter with reportMissingObjectsInResults: a gone object comes back with
        a missingSet and no properties."""
        objects = []
        with self.server.cond:
            self.server.calls["RetrievePropertiesEx"] += 1
            for spec in specSet:
                for obj_spec in spec.objectSet:
                    ref = obj_spec.obj
                    state = self.server.states.get(ref._moId)
                    if state is None:
                        fault = vmodl.fault.ManagedObjectNotFound(obj=ref)
                        missing = [SimpleNamespace(path="", fault=fault)]
                        objects.append(SimpleNamespace(obj=ref, propSet=[], missingSet=missing))
                    else:
                        prop = SimpleNamespace(name="info.state", val=state)
                        objects.append(SimpleNamespace(obj=ref, propSet=[prop], missingSet=[]))
        return SimpleNamespace(objects=objects, token=None)


class FakeSession:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.generation = 1
        self.options = SessionOptions(
            retry_initial_seconds=0.01, retry_max_seconds=0.05, wait_max_seconds=2
        )
        root = Root(server)
        self.content = SimpleNamespace(propertyCollector=root, viewManager=root)

    async def call(self, fn: Callable[[], T], *, subject: str, action: str) -> T:
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:
            raise faults.classify(exc, subject=subject, action=action) from exc

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    def touch(self) -> None:
        pass

    async def relogin(self, *, seen: int) -> None:
        if seen == self.generation:
            self.generation += 1
            self.server.expired = False


def _update_set(changed: dict[str, str]) -> Any:
    objects = [
        SimpleNamespace(
            obj=vim.Task(moid),
            kind="modify",
            changeSet=[SimpleNamespace(name="info.state", op="assign", val=state)],
        )
        for moid, state in changed.items()
    ]
    return SimpleNamespace(version="1", filterSet=[SimpleNamespace(objectSet=objects)])


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Server:
    return Server(**getattr(request, "param", {}))


@pytest.fixture
async def waiter(server: Server, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TaskWaiter]:
    def filter_spec(view: View, wanted: Any) -> Any:  # the fake view is no pyVmomi object
        return SimpleNamespace(objectSet=[SimpleNamespace(obj=view)])

    monkeypatch.setattr(vmomi, "view_filter_spec", filter_spec)
    waiter = TaskWaiter(session=cast(Any, FakeSession(server)))
    waiter.start()
    yield waiter
    await waiter.close()


def wait(waiter: TaskWaiter, moid: str) -> asyncio.Future[Any]:
    return asyncio.ensure_future(
        waiter.wait(vim.Task(moid), subject=f"task {moid}", action="wait for")
    )


async def in_view(server: Server, *moids: str) -> None:
    await eventually(
        lambda: bool(server.views) and set(moids) <= set(server.views[-1].members),
        what=f"{moids} in the view",
        within=2.0,
        interval=0.01,
    )


@pytest.mark.parametrize("server", [{"refuse_modify": True}], indirect=True)
async def test_a_view_change_refused_for_a_stale_task_fails_only_that_task(
    server: Server, waiter: TaskWaiter
) -> None:
    server.set("task-1", "running")
    server.set("task-2", "running")
    first = wait(waiter, "task-1")
    await in_view(server, "task-1")
    second, stale = wait(waiter, "task-2"), wait(waiter, "task-9")  # one ModifyListView
    with pytest.raises(errors.NotFound, match="task task-9") as caught:
        await asyncio.wait_for(stale, timeout=5)
    assert caught.value.subject == "task task-9"
    await in_view(server, "task-1", "task-2")
    server.set("task-1", "success")
    server.set("task-2", "success")
    assert list(await asyncio.wait_for(asyncio.gather(first, second), timeout=5)) == [None, None]


async def test_a_task_forgotten_while_watched_fails_alone_when_the_view_is_rebuilt(
    server: Server, waiter: TaskWaiter
) -> None:
    server.set("task-1", "running")
    server.set("task-2", "running")
    first, second = wait(waiter, "task-1"), wait(waiter, "task-2")
    await in_view(server, "task-1", "task-2")
    server.set("task-2", None)  # vCenter forgot it
    server.expire()  # the re-login rebuilds the view over every task still watched
    with pytest.raises(errors.NotFound, match="task task-2"):
        await asyncio.wait_for(second, timeout=5)
    server.set("task-1", "success")
    assert await asyncio.wait_for(first, timeout=5) is None
    # refused once over both, then built for the task that is still there: no retry storm
    assert [v.members for v in server.views] == [["task-1", "task-2"], ["task-1"]]
    assert server.calls["CreateListView"] == 3


@pytest.mark.parametrize("server", [{"lenient_create": True, "strict_poll": True}], indirect=True)
async def test_a_poll_refused_over_a_forgotten_task_fails_only_that_task(
    server: Server, waiter: TaskWaiter
) -> None:
    server.set("task-1", "running")
    server.set("task-2", "running")
    first, second = wait(waiter, "task-1"), wait(waiter, "task-2")
    await in_view(server, "task-1", "task-2")
    server.set("task-2", None)
    with pytest.raises(errors.NotFound, match="task task-2"):
        await asyncio.wait_for(second, timeout=5)
    server.set("task-1", "success")
    assert await asyncio.wait_for(first, timeout=5) is None


async def test_a_task_end_the_long_poll_missed_is_read_after_quiet_polls(
    server: Server, waiter: TaskWaiter
) -> None:
    server.set("task-1", "running")
    first = wait(waiter, "task-1")
    await in_view(server, "task-1")
    server.lose("task-1", "success")  # never reported by this collector's long polls
    assert await asyncio.wait_for(first, timeout=15) is None  # 2 quiet polls of 2 s, rebuilt
    assert waiter.resyncs == 1
    assert server.calls["CreateListView"] == 2
