"""Controller rules: events map to keys, sync before work, retries, drain, metrics."""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge.kube import controller, informer
from agentforge.kube.store import ObjectKey
from sim.actors.waiting import eventually
from tests.unit.kube.fakes import obj

pytestmark = pytest.mark.looptime


class FakeSource:
    """An informer stand-in: tests push add/update/delete and decide when it syncs."""

    def __init__(self, *, synced: bool = True) -> None:
        self.handlers: list[informer.EventHandler] = []
        self._synced = asyncio.Event()
        if synced:
            self._synced.set()

    def add_handler(self, handler: informer.EventHandler) -> None:
        self.handlers.append(handler)

    async def synced(self) -> None:
        await self._synced.wait()

    def sync(self) -> None:
        self._synced.set()

    def add(self, o: dict[str, Any]) -> None:
        for h in self.handlers:
            assert h.on_add is not None
            h.on_add(o)

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        for h in self.handlers:
            assert h.on_update is not None
            h.on_update(old, new)

    def delete(self, o: dict[str, Any]) -> None:
        for h in self.handlers:
            assert h.on_delete is not None
            h.on_delete(o)


class Reconciler:
    def __init__(self) -> None:
        self.calls: list[tuple[ObjectKey, float]] = []
        self.fail: collections.Counter[str] = collections.Counter()
        self.results: dict[str, controller.Result] = {}
        self.delay = 0.0
        self.running: set[str] = set()
        self.max_running = 0
        self.overlap = False

    async def __call__(self, key: ObjectKey) -> controller.Result | None:
        if key in self.running:
            self.overlap = True
        self.running.add(key)
        self.max_running = max(self.max_running, len(self.running))
        self.calls.append((key, asyncio.get_running_loop().time()))
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail[key] > 0:
                self.fail[key] -= 1
                raise RuntimeError(f"boom on {key}")
            return self.results.get(key)
        finally:
            self.running.discard(key)

    def keys(self) -> list[str]:
        return [k for k, _ in self.calls]


def pool_of(o: dict[str, Any]) -> list[ObjectKey]:
    pool = o["metadata"].get("labels", {}).get("pool")
    return [ObjectKey(f"{o['metadata']['namespace']}/{pool}")] if pool else []


async def run(ctrl: controller.Controller) -> asyncio.Task[None]:
    task = asyncio.create_task(ctrl.run())
    await asyncio.sleep(0)
    return task


async def finish(ctrl: controller.Controller, task: asyncio.Task[None]) -> None:
    await ctrl.stop()
    await asyncio.wait_for(task, 5)


async def test_events_are_mapped_to_keys_and_each_key_is_reconciled() -> None:
    pools, agents = FakeSource(), FakeSource()
    rec = Reconciler()
    ctrl = controller.Controller(
        name="map-test",
        reconcile=rec,
        watches=[controller.Watch(source=pools), controller.Watch(source=agents, map=pool_of)],
    )
    task = await run(ctrl)
    pools.add(obj("p1", "1"))
    agents.add(obj("agent-x", "1", metadata={"labels": {"pool": "p2"}}))
    agents.add(obj("agent-y", "1"))  # no pool: maps to nothing
    await eventually(lambda: len(rec.calls) == 2, what="len(rec.calls) == 2")
    await finish(ctrl, task)
    assert sorted(rec.keys()) == ["ns/p1", "ns/p2"]


async def test_an_update_enqueues_the_keys_of_both_old_and_new_objects() -> None:
    agents = FakeSource()
    rec = Reconciler()
    ctrl = controller.Controller(
        name="old-new", reconcile=rec, watches=[controller.Watch(source=agents, map=pool_of)]
    )
    task = await run(ctrl)
    agents.update(
        obj("a", "1", metadata={"labels": {"pool": "old"}}),
        obj("a", "2", metadata={"labels": {"pool": "new"}}),
    )
    await eventually(lambda: len(rec.calls) == 2, what="len(rec.calls) == 2")
    await finish(ctrl, task)
    assert sorted(rec.keys()) == ["ns/new", "ns/old"]


async def test_a_predicate_filters_updates() -> None:
    src = FakeSource()
    rec = Reconciler()

    def generation_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
        return bool(old["metadata"].get("generation") != new["metadata"].get("generation"))

    ctrl = controller.Controller(
        name="predicate",
        reconcile=rec,
        watches=[controller.Watch(source=src, predicate=generation_changed)],
    )
    task = await run(ctrl)
    src.update(obj("a", "1", metadata={"generation": 1}), obj("a", "2", metadata={"generation": 1}))
    src.update(obj("b", "1", metadata={"generation": 1}), obj("b", "2", metadata={"generation": 2}))
    await eventually(lambda: len(rec.calls) == 1, what="len(rec.calls) == 1")
    await asyncio.sleep(1)
    await finish(ctrl, task)
    assert rec.keys() == ["ns/b"]


async def test_workers_start_only_after_every_source_synced_and_early_events_wait() -> None:
    first, second = FakeSource(synced=False), FakeSource(synced=False)
    rec = Reconciler()
    ctrl = controller.Controller(
        name="sync-first",
        reconcile=rec,
        watches=[controller.Watch(source=first), controller.Watch(source=second)],
    )
    task = await run(ctrl)
    first.add(obj("a", "1"))
    first.sync()
    await asyncio.sleep(5)
    assert rec.calls == []
    assert not ctrl.started
    second.sync()
    await eventually(lambda: len(rec.calls) == 1, what="len(rec.calls) == 1")
    assert ctrl.started
    await finish(ctrl, task)


async def test_a_failing_reconcile_is_retried_with_growing_backoff_and_success_forgets() -> None:
    src = FakeSource()
    rec = Reconciler()
    rec.fail["ns/a"] = 3
    ctrl = controller.Controller(
        name="retry", reconcile=rec, watches=[controller.Watch(source=src)]
    )
    task = await run(ctrl)
    src.add(obj("a", "1"))
    await eventually(lambda: len(rec.calls) == 4, what="len(rec.calls) == 4")
    times = [t for _, t in rec.calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([0.005, 0.01, 0.02])
    await eventually(
        lambda: ctrl.queue.num_requeues(ObjectKey("ns/a")) == 0,
        what="ctrl.queue.num_requeues(ObjectKey('ns/a')) == 0",
    )
    await finish(ctrl, task)


async def test_requeue_after_schedules_the_key_again_after_the_delay() -> None:
    src = FakeSource()
    rec = Reconciler()
    rec.results["ns/a"] = controller.Result(requeue_after=30.0)
    ctrl = controller.Controller(
        name="after", reconcile=rec, watches=[controller.Watch(source=src)]
    )
    task = await run(ctrl)
    src.add(obj("a", "1"))
    await eventually(
        lambda: len(rec.calls) == 3, what="len(rec.calls) == 3", within=120, interval=1.0
    )
    times = [t for _, t in rec.calls]
    assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx([30.0, 30.0])
    await finish(ctrl, task)


async def test_no_key_runs_twice_at_once_and_concurrency_is_bounded_by_workers() -> None:
    src = FakeSource()
    rec = Reconciler()
    rec.delay = 1.0
    ctrl = controller.Controller(
        name="bounded", reconcile=rec, watches=[controller.Watch(source=src)], workers=3
    )
    task = await run(ctrl)
    for i in range(10):
        src.add(obj(f"k{i}", "1"))
    await asyncio.sleep(0.5)
    assert sorted(rec.running) == ["ns/k0", "ns/k1", "ns/k2"]
    for i in range(10):
        # k0-k2 are processing: reconciled again after; the rest are still queued: deduped
        src.update(obj(f"k{i}", "1"), obj(f"k{i}", "2"))
    await eventually(lambda: len(rec.calls) == 13, what="len(rec.calls) == 13", within=60)
    await asyncio.sleep(5)
    await finish(ctrl, task)
    assert rec.max_running == 3
    assert not rec.overlap
    expected = {f"ns/k{i}": 2 if i < 3 else 1 for i in range(10)}
    assert collections.Counter(rec.keys()) == expected


async def test_stop_drains_reconciles_in_flight_and_drops_queued_keys() -> None:
    src = FakeSource()
    rec = Reconciler()
    rec.delay = 10.0
    ctrl = controller.Controller(
        name="drain", reconcile=rec, watches=[controller.Watch(source=src)]
    )
    task = await run(ctrl)
    src.add(obj("busy", "1"))
    # polled every 10 ms of virtual time: stop() starts right after the reconcile did
    await eventually(lambda: len(rec.calls) == 1, what="the busy key's reconcile", interval=0.01)
    src.add(obj("queued", "1"))
    loop = asyncio.get_running_loop()
    before = loop.time()
    await ctrl.stop()
    assert loop.time() - before == pytest.approx(10.0, abs=0.1), "stop waits for the reconcile"
    await asyncio.wait_for(task, 1)
    assert rec.keys() == ["ns/busy"]


async def test_stop_before_sync_ends_run_without_reconciling() -> None:
    src = FakeSource(synced=False)
    rec = Reconciler()
    ctrl = controller.Controller(
        name="early-stop", reconcile=rec, watches=[controller.Watch(source=src)]
    )
    task = await run(ctrl)
    src.add(obj("a", "1"))
    await finish(ctrl, task)
    assert rec.calls == []


async def test_results_and_event_latency_are_exported() -> None:
    name = "metrics-ctrl"

    def sample(metric: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(metric, {"controller": name, **labels}) or 0.0

    src = FakeSource()
    rec = Reconciler()
    rec.fail["ns/bad"] = 1
    rec.delay = 0.25
    ctrl = controller.Controller(name=name, reconcile=rec, watches=[controller.Watch(source=src)])
    task = await run(ctrl)
    src.add(obj("good", "1"))
    src.add(obj("bad", "1"))
    await eventually(lambda: len(rec.calls) == 3, what="len(rec.calls) == 3")
    await finish(ctrl, task)
    assert sample("agent_forge_reconcile_total", result="success") == 2
    assert sample("agent_forge_reconcile_total", result="error") == 1
    assert sample("agent_forge_reconcile_duration_seconds_count") == 3
    # two events; the retry of "bad" is not an event. "bad" waited for "good" (0.25 s).
    assert sample("agent_forge_event_to_reconcile_seconds_count") == 2
    assert sample("agent_forge_event_to_reconcile_seconds_sum") == pytest.approx(0.25)
