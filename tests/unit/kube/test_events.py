"""Event recorder rules: aggregate repeats, spam filter per object, never raise, scrub."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentforge.api.kinds import Kind
from agentforge.kube import errors, events
from agentforge.kube.events import EventType

POOL = {
    "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
    "kind": "VsphereAgentPool",
    "metadata": {"name": "pool", "namespace": "ns", "uid": "u-1", "resourceVersion": "5"},
}


class FakeClock:
    def __init__(self) -> None:
        self.mono = 0.0
        self.wall = datetime(2026, 1, 1, tzinfo=UTC)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


class FakeWriter:
    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.patches = 0
        self.fail_with: BaseException | None = None

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        if self.fail_with is not None:
            raise self.fail_with
        self.creates += 1
        self.events[obj["metadata"]["name"]] = dict(obj)
        return dict(obj)

    async def patch_merge(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        if name not in self.events:
            raise errors.NotFound(status=404, reason="NotFound", message=name)
        self.patches += 1
        self.events[name].update(patch)
        return self.events[name]


def recorder(writer: FakeWriter, clock: FakeClock, **kwargs: Any) -> events.EventRecorder:
    return events.EventRecorder(
        client=writer,
        component="agent-forge",
        host="pod-1",
        clock=lambda: clock.mono,
        wall_clock=lambda: clock.wall,
        **kwargs,
    )


async def test_repeats_within_the_window_bump_count_on_one_event() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock)
    for _ in range(3):
        await rec.record(POOL, type=EventType.WARNING, reason="CreateFailed", message="no space")
        clock.advance(10)
    assert writer.creates == 1
    assert writer.patches == 2
    (event,) = writer.events.values()
    assert event["count"] == 3
    assert event["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["lastTimestamp"] == "2026-01-01T00:00:20Z"
    assert event["involvedObject"] == {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgentPool",
        "name": "pool",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "5",
    }
    assert event["metadata"]["namespace"] == "ns"
    assert event["source"] == {"component": "agent-forge", "host": "pod-1"}


async def test_different_messages_are_different_events() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock)
    await rec.record(POOL, type=EventType.NORMAL, reason="Scaled", message="to 1")
    await rec.record(POOL, type=EventType.NORMAL, reason="Scaled", message="to 2")
    assert writer.creates == 2


async def test_a_repeat_after_the_window_creates_a_new_event() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock, window=60)
    await rec.record(POOL, type=EventType.NORMAL, reason="R", message="m")
    clock.advance(61)
    await rec.record(POOL, type=EventType.NORMAL, reason="R", message="m")
    assert writer.creates == 2


async def test_an_expired_event_is_recreated_instead_of_patched() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock)
    await rec.record(POOL, type=EventType.NORMAL, reason="R", message="m")
    writer.events.clear()  # the apiserver's TTL removed it
    await rec.record(POOL, type=EventType.NORMAL, reason="R", message="m")
    assert writer.creates == 2
    assert [e["count"] for e in writer.events.values()] == [1]


async def test_the_spam_filter_drops_a_hot_loop_per_object_and_refills_slowly() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock, burst=5, refill_per_second=1 / 300)
    for i in range(20):
        await rec.record(POOL, type=EventType.NORMAL, reason="R", message=f"m{i}")
    assert writer.creates == 5
    other = {**POOL, "metadata": {**POOL["metadata"], "name": "other", "uid": "u-2"}}
    await rec.record(other, type=EventType.NORMAL, reason="R", message="m")
    assert writer.creates == 6, "another object has its own bucket"
    clock.advance(300)
    await rec.record(POOL, type=EventType.NORMAL, reason="R", message="late")
    assert writer.creates == 7


async def test_api_failures_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    writer, clock = FakeWriter(), FakeClock()
    writer.fail_with = errors.Forbidden(status=403, reason="Forbidden", message="no rbac")
    rec = recorder(writer, clock)
    await rec.record(POOL, type=EventType.WARNING, reason="R", message="m")
    writer.fail_with = errors.TransportError("reset")
    await rec.record(POOL, type=EventType.WARNING, reason="R", message="m")
    assert "could not record event" in caplog.text


async def test_cluster_scoped_objects_get_events_in_default() -> None:
    writer, clock = FakeWriter(), FakeClock()
    rec = recorder(writer, clock)
    node = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "uid": "u"}}
    await rec.record(node, type=EventType.NORMAL, reason="R", message="m")
    (event,) = writer.events.values()
    assert event["metadata"]["namespace"] == "default"


def test_messages_are_scrubbed_of_credentials_and_cut_to_1k() -> None:
    text = events.scrub("login failed: Authorization: Bearer abc.def password=hunter2 token: xyz")
    assert "abc.def" not in text
    assert "hunter2" not in text
    assert "xyz" not in text
    assert "login failed" in text
    assert len(events.scrub("x" * 5000)) == events.MAX_MESSAGE
