"""Controller read-your-writes: never reconcile from a cached version the controller's
own write has superseded, and never wait for the newer one forever."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge.kube import controller, informer
from agentforge.kube.store import ObjectKey
from sim.actors.waiting import eventually
from tests.unit.kube.fakes import obj

pytestmark = pytest.mark.looptime

KEY = ObjectKey("ns/a")
RECHECK, TIMEOUT = 2.0, 30.0


class CachedSource:
    """An informer stand-in with a store: `deliver` is the watch event of a write."""

    def __init__(self) -> None:
        self.handlers: list[informer.EventHandler] = []
        self.store: dict[ObjectKey, dict[str, Any]] = {}

    def add_handler(self, handler: informer.EventHandler) -> None:
        self.handlers.append(handler)

    async def synced(self) -> None:
        return None

    def get_by_key(self, key: ObjectKey) -> dict[str, Any] | None:
        return self.store.get(key)

    def deliver(self, new: dict[str, Any]) -> None:
        key = ObjectKey(f"{new['metadata']['namespace']}/{new['metadata']['name']}")
        old = self.store.get(key)
        self.store[key] = new
        for h in self.handlers:
            if old is None:
                assert h.on_add is not None
                h.on_add(new)
            else:
                assert h.on_update is not None
                h.on_update(old, new)

    def delete(self, key: ObjectKey) -> None:
        gone = self.store.pop(key)
        for h in self.handlers:
            assert h.on_delete is not None
            h.on_delete(gone)


class Writer:
    """A reconcile that writes its object `writes` times per pass (versions 11, 12, ...)
    and records the cached version each pass started from."""

    def __init__(self, source: CachedSource, *, writes: int = 1) -> None:
        self.source = source
        self.writes = writes
        self.seen: list[str | None] = []
        self.next_version = 11
        self.ctrl: controller.Controller | None = None

    async def __call__(self, key: ObjectKey) -> controller.Result | None:
        cached = self.source.get_by_key(key)
        self.seen.append(None if cached is None else cached["metadata"]["resourceVersion"])
        assert self.ctrl is not None
        for _ in range(self.writes):
            self.ctrl.wrote(key, str(self.next_version))
            self.next_version += 1
        self.writes = 0  # later passes find nothing to do
        return None


async def started(
    *, writes: int = 1
) -> tuple[CachedSource, Writer, controller.Controller, asyncio.Task[None]]:
    source = CachedSource()
    writer = Writer(source, writes=writes)
    ctrl = controller.Controller(
        name="ryw",
        reconcile=writer,
        watches=[controller.Watch(source=source)],
        stale_recheck=RECHECK,
        stale_timeout=TIMEOUT,
    )
    writer.ctrl = ctrl
    task = asyncio.create_task(ctrl.run())
    await asyncio.sleep(0)
    return source, writer, ctrl, task


def looks() -> float:
    """Passes the controller ended with a requeue (here: the stale-cache rechecks)."""
    value = REGISTRY.get_sample_value(
        "agent_forge_reconcile_total", {"controller": "ryw", "result": "requeue_after"}
    )
    return value or 0.0


async def finish(ctrl: controller.Controller, task: asyncio.Task[None]) -> None:
    await ctrl.stop()
    await asyncio.wait_for(task, 5)


async def test_a_key_is_not_reconciled_from_a_version_its_own_write_superseded() -> None:
    source, writer, ctrl, task = await started()
    source.deliver(obj("a", "10"))
    await eventually(lambda: writer.seen == ["10"], what="writer.seen == ['10']")
    before = looks()
    ctrl.enqueue(KEY)  # woken by something else while the cache still shows 10
    await eventually(
        lambda: looks() >= before + 3,
        what="looks() >= before + 3",
        within=4 * RECHECK,
        interval=0.1,
    )
    assert writer.seen == ["10"], "reconciled from a version it had written over"
    source.deliver(obj("a", "11"))  # the watch event of the write
    await eventually(lambda: writer.seen == ["10", "11"], what="writer.seen == ['10', '11']")
    await finish(ctrl, task)


async def test_intermediate_writes_of_a_pass_are_superseded_too() -> None:
    source, writer, ctrl, task = await started(writes=2)  # writes 11, then 12
    source.deliver(obj("a", "10"))
    await eventually(lambda: writer.seen == ["10"], what="writer.seen == ['10']")
    before = looks()
    source.deliver(obj("a", "11"))  # the first write's event: still behind the second
    await eventually(
        lambda: looks() >= before + 2,
        what="looks() >= before + 2",
        within=3 * RECHECK,
        interval=0.1,
    )
    assert writer.seen == ["10"]
    source.deliver(obj("a", "12"))
    await eventually(lambda: writer.seen == ["10", "12"], what="writer.seen == ['10', '12']")
    await finish(ctrl, task)


async def test_a_lost_watch_event_delays_the_key_only_until_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, writer, ctrl, task = await started()
    source.deliver(obj("a", "10"))
    await eventually(lambda: writer.seen == ["10"], what="writer.seen == ['10']")
    loop = asyncio.get_running_loop()
    written = loop.time()
    ctrl.enqueue(KEY)  # the event of version 11 never comes
    with caplog.at_level(logging.WARNING, logger="agentforge.kube.controller"):
        await eventually(
            lambda: len(writer.seen) == 2,
            what="len(writer.seen) == 2",
            within=TIMEOUT + 3 * RECHECK,
            interval=0.5,
        )
    assert writer.seen == ["10", "10"]
    assert loop.time() - written >= TIMEOUT
    assert "ns/a" in caplog.text
    assert "resourceVersion 10" in caplog.text
    await finish(ctrl, task)


async def test_a_key_gone_from_the_cache_is_reconciled_at_once() -> None:
    source, writer, ctrl, task = await started()
    source.deliver(obj("a", "10"))
    await eventually(lambda: writer.seen == ["10"], what="writer.seen == ['10']")
    source.delete(KEY)  # deleted before the write's event: the reconcile cleans up
    await eventually(
        lambda: writer.seen == ["10", None],
        what="writer.seen == ['10', None]",
        within=RECHECK / 2,
        interval=0.01,
    )
    await finish(ctrl, task)


async def test_a_pass_that_writes_nothing_leaves_the_next_one_free() -> None:
    source, writer, ctrl, task = await started(writes=0)
    source.deliver(obj("a", "10"))
    await eventually(lambda: writer.seen == ["10"], what="writer.seen == ['10']")
    ctrl.enqueue(KEY)
    await eventually(
        lambda: writer.seen == ["10", "10"],
        what="writer.seen == ['10', '10']",
        within=RECHECK / 2,
        interval=0.01,
    )
    ctrl.wrote(KEY, "99")  # outside any reconcile of the key: no effect
    ctrl.enqueue(KEY)
    await eventually(
        lambda: len(writer.seen) == 3,
        what="len(writer.seen) == 3",
        within=RECHECK / 2,
        interval=0.01,
    )
    await finish(ctrl, task)
