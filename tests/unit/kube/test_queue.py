"""Work-queue rules (client-go semantics), on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from agentforge import ratelimit
from agentforge.kube import queue


def _q(name: str, **kwargs: object) -> queue.WorkQueue[str]:
    return queue.WorkQueue[str](name=name, **kwargs)  # type: ignore[arg-type]


def _sample(metric: str, name: str) -> float:
    value = REGISTRY.get_sample_value(metric, {"name": name})
    assert value is not None, f"{metric}{{name={name}}} is not exported"
    return value


async def test_a_key_added_twice_is_queued_once() -> None:
    q = _q("dedupe")
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"
    assert len(q) == 0


async def test_a_key_is_not_handed_out_again_while_processing() -> None:
    q = _q("exclusive")
    q.add("a")
    assert await q.get() == "a"
    q.add("a")
    assert len(q) == 0, "a key in processing must not be queued"
    getter = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.done("a")
    assert await getter == "a"


async def test_a_key_re_added_while_processing_is_processed_again_after_done() -> None:
    q = _q("readd")
    q.add("a")
    await q.get()
    q.add("a")
    q.add("a")
    q.done("a")
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    assert len(q) == 0


async def test_a_key_done_without_re_add_is_not_requeued() -> None:
    q = _q("noreadd")
    q.add("a")
    await q.get()
    q.done("a")
    assert len(q) == 0


@pytest.mark.looptime
async def test_add_after_adds_the_key_when_its_delay_expires() -> None:
    q = _q("after")
    loop = asyncio.get_running_loop()
    start = loop.time()
    q.add_after("a", 5.0)
    assert len(q) == 0
    assert q.delayed == {"a"}, "waiting for its time: not queued, yet not idle"
    assert await q.get() == "a"
    assert loop.time() - start == pytest.approx(5.0)
    assert q.delayed == frozenset()


@pytest.mark.looptime
async def test_add_after_keeps_the_earliest_pending_delay() -> None:
    q = _q("earliest")
    loop = asyncio.get_running_loop()
    start = loop.time()
    q.add_after("a", 10.0)
    q.add_after("a", 3.0)
    q.add_after("a", 7.0)
    assert await q.get() == "a"
    assert loop.time() - start == pytest.approx(3.0)
    q.done("a")
    await asyncio.sleep(20)
    assert len(q) == 0, "the superseded delays must not add the key again"


@pytest.mark.looptime
async def test_add_after_hands_out_keys_in_ready_time_order() -> None:
    q = _q("order")
    q.add_after("late", 3.0)
    q.add_after("early", 1.0)
    q.add_after("middle", 2.0)
    q.add_after("now", 0)
    got = [await q.get() for _ in range(4)]
    assert got == ["now", "early", "middle", "late"]


@pytest.mark.looptime
async def test_rate_limited_delay_doubles_per_failure_and_resets_after_forget() -> None:
    limiter = ratelimit.ItemExponentialLimiter[str](base=0.005, cap=300.0)
    q = _q("backoff", rate_limiter=limiter)
    loop = asyncio.get_running_loop()
    waits = []
    for _ in range(4):
        start = loop.time()
        q.add_rate_limited("a")
        await q.get()
        q.done("a")
        waits.append(loop.time() - start)
    assert waits == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert q.num_requeues("a") == 4
    q.forget("a")
    assert q.num_requeues("a") == 0
    start = loop.time()
    q.add_rate_limited("a")
    await q.get()
    assert loop.time() - start == pytest.approx(0.005)


async def test_shutdown_with_drain_waits_for_keys_in_processing_not_for_queued_ones() -> None:
    q = _q("drain")
    q.add("busy")
    q.add("queued")
    assert await q.get() == "busy"
    shutdown = asyncio.ensure_future(q.shutdown(drain=True))
    await asyncio.sleep(0)
    assert not shutdown.done(), "drain must wait for the key in processing"
    with pytest.raises(queue.ShutDown):
        await q.get()  # the queued key is not handed out any more
    q.done("busy")
    await asyncio.wait_for(shutdown, timeout=1)
    assert len(q) == 0


async def test_shutdown_without_processing_keys_returns_at_once() -> None:
    q = _q("drain-idle")
    q.add("a")
    await q.shutdown(drain=True)
    with pytest.raises(queue.ShutDown):
        await q.get()


async def test_shutdown_releases_waiting_getters() -> None:
    q = _q("release")
    getters = [asyncio.ensure_future(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    await q.shutdown()
    for getter in getters:
        with pytest.raises(queue.ShutDown):
            await getter


@pytest.mark.looptime
async def test_adds_after_shutdown_are_ignored() -> None:
    q = _q("closed")
    q.add_after("later", 1.0)
    await q.shutdown()
    q.add("a")
    q.add_after("b", 0.5)
    q.add_rate_limited("c")
    await asyncio.sleep(5)
    assert len(q) == 0  # "later" never came


async def test_a_cancelled_getter_does_not_swallow_a_wakeup() -> None:
    q = _q("cancel")
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await asyncio.sleep(0)
    q.add("a")  # wakes `first` ...
    first.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(second, timeout=1) == "a"
    with pytest.raises(asyncio.CancelledError):
        await first


@pytest.mark.looptime
async def test_metrics_track_depth_adds_retries_and_durations() -> None:
    name = "metrics-unit"
    q = _q(name)
    adds_before = _sample("workqueue_adds_total", name)
    q.add("a")
    q.add("a")
    q.add("b")
    assert _sample("workqueue_depth", name) == 2
    assert _sample("workqueue_adds_total", name) - adds_before == 2
    await asyncio.sleep(1)
    await q.get()
    assert _sample("workqueue_depth", name) == 1
    await asyncio.sleep(2)
    assert _sample("workqueue_unfinished_work_seconds", name) == pytest.approx(2)
    assert _sample("workqueue_longest_running_processor_seconds", name) == pytest.approx(2)
    q.done("a")
    assert _sample("workqueue_unfinished_work_seconds", name) == 0
    assert _sample("workqueue_queue_duration_seconds_count", name) >= 1
    assert _sample("workqueue_work_duration_seconds_count", name) >= 1
    retries_before = _sample("workqueue_retries_total", name)
    q.add_rate_limited("c")
    assert _sample("workqueue_retries_total", name) - retries_before == 1
    await q.shutdown()
    assert _sample("workqueue_depth", name) == 0
