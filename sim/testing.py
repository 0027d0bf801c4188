"""Test hygiene checks, loaded as a pytest plugin by `tests/conftest.py`.

A test fails when it leaves work running behind it, because leftovers make later
tests flaky in ways that point at the wrong test:

- asyncio tasks: an async test fails when tasks it created are still pending once
  its body returns (after a few loop turns that let cancelled tasks finish). The
  leftovers are cancelled so the next test starts clean, and named in the failure.
- child processes: a test fails (at teardown) when a child of the pytest process
  that appeared after its fixtures were set up is still running once its function
  fixtures are torn down. Processes of session/module fixtures started for the test
  already exist at that point and are not counted, nor are processes a session
  fixture registers with `long_lived` when it (re)starts one mid-test. Leftovers
  get a short grace period to exit, are then killed, and named in the failure.

Both checks are cheap: one `asyncio.all_tasks()` and one process-table walk per test.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

_SETTLE_TURNS = 5  # loop iterations granted to tasks that are finishing
_CANCEL_GRACE_S = 5.0
_PROCESS_GRACE_S = 2.0

ProcessKey = tuple[int, float]  # pid and start (ticks since boot): pids get reused


# --- asyncio tasks -------------------------------------------------------------------


def _describe_task(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()} ({where})"


async def _leftover_tasks(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    me = asyncio.current_task()
    for _ in range(_SETTLE_TURNS):
        pending = [t for t in asyncio.all_tasks() if t is not me and t not in before]
        if not pending:
            return []
        await asyncio.sleep(0)  # one loop turn, not a wait for time to pass
    return [t for t in asyncio.all_tasks() if t is not me and t not in before and not t.done()]


def _checking_tasks(test: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(test)
    async def wrapper(*args: Any, **kwargs: Any) -> None:
        before = asyncio.all_tasks()
        body_failed = True
        try:
            await test(*args, **kwargs)
            body_failed = False
        finally:
            leftovers = await _leftover_tasks(before)
            for task in leftovers:
                task.cancel()
            if leftovers:
                await asyncio.wait(leftovers, timeout=_CANCEL_GRACE_S)
        if leftovers and not body_failed:
            names = ", ".join(_describe_task(t) for t in leftovers)
            pytest.fail(
                f"test left {len(leftovers)} asyncio task(s) running: {names}; "
                "cancel and await every task the test starts",
                pytrace=False,
            )

    return wrapper


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
        original = item.obj
        item.obj = _checking_tasks(original)
        try:
            return (yield)
        finally:
            item.obj = original
    return (yield)


# --- child processes -------------------------------------------------------------------


def _started(process: psutil.Process) -> float:
    """When `process` started, in a form that never moves: clock ticks since boot from
    /proc/<pid>/stat. psutil's `create_time()` is boot time (wall clock) plus those
    ticks, so a step of the wall clock (NTP, a paused VM resumed) shifts it for every
    process at once, and every session process would look new and be killed."""
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
    except OSError:
        return float(process.create_time())  # not Linux: the wall-clock form
    return float(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime


def _children() -> dict[ProcessKey, psutil.Process]:
    found: dict[ProcessKey, psutil.Process] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue  # exited, merely not reaped: nothing is running
            found[(child.pid, _started(child))] = child
        except psutil.NoSuchProcess:
            continue
    return found


def _describe_process(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid}: {' '.join(process.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {process.pid}"


_long_lived: set[int] = set()


def long_lived(pid: int) -> None:
    """Exempt `pid` from the check: a session fixture's process started during a test
    (the shared simulator restarted after it died) is not that test's leftover."""
    _long_lived.add(pid)


@pytest.fixture(autouse=True)
def _no_leftover_child_processes() -> Iterator[None]:
    before = _children()
    yield
    new = [p for key, p in _children().items() if key not in before and p.pid not in _long_lived]
    if not new:
        return
    descriptions = [_describe_process(p) for p in new]
    _, alive = psutil.wait_procs(new, timeout=_PROCESS_GRACE_S)
    if not alive:
        return
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=_PROCESS_GRACE_S)
    pytest.fail(
        f"test left {len(alive)} child process(es) running (killed now): "
        + "; ".join(d for p, d in zip(new, descriptions, strict=True) if p in alive),
        pytrace=False,
    )
