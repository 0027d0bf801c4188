"""Event recorder rules on virtual time: client-go's correlator, groups, batched repeats."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentforge.api.kinds import Kind
from agentforge.kube import errors, event_correlator, events
from agentforge.kube.events import EventType

pytestmark = pytest.mark.looptime

START = datetime(2026, 1, 1, tzinfo=UTC)
FLUSH = events.FLUSH_INTERVAL_S


def obj(name: str, *, kind: str = "VsphereAgent", uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": uid or f"u-{name}",
                     "resourceVersion": "5"},
    }  # fmt: skip


POOL = obj("pool", kind="VsphereAgentPool")


class FakeWriter:
    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.patches: list[dict[str, Any]] = []
        self.fail_with: BaseException | None = None

    async def create(
        self, kind: Kind, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        if self.fail_with is not None:
            raise self.fail_with
        self.creates += 1
        self.events[body["metadata"]["name"]] = dict(body)
        return dict(body)

    async def patch_merge(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        if self.fail_with is not None:
            raise self.fail_with
        if name not in self.events:
            raise errors.NotFound(status=404, reason="NotFound", message=name)
        self.patches.append(dict(patch))
        self.events[name].update(patch)
        return self.events[name]

    def by_reason(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.events.values() if e["reason"] == reason]

    def writes(self) -> int:
        return self.creates + len(self.patches)


def recorder(writer: FakeWriter, **kwargs: Any) -> events.EventRecorder:
    loop = asyncio.get_running_loop()
    return events.EventRecorder(
        client=writer,
        component="agent-forge",
        host="pod-1",
        wall_clock=lambda: START + timedelta(seconds=loop.time()),
        **kwargs,
    )


async def normal(rec: events.EventRecorder, about: Mapping[str, Any], reason: str, message: str,
                 **kwargs: Any) -> None:  # fmt: skip
    await rec.record(about, type=EventType.NORMAL, reason=reason, message=message, **kwargs)


# --- identical events: one Event, its count written in batches --------------------------


async def test_repeats_are_counted_and_written_as_one_patch_after_the_flush_interval() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    t0 = asyncio.get_running_loop().time()
    for _ in range(5):
        await rec.record(POOL, type=EventType.WARNING, reason="CreateFailed", message="no space")
        await asyncio.sleep(2)
    assert (writer.creates, writer.patches) == (1, [])  # held: written 8 s ago
    assert rec.pending == 1
    await asyncio.sleep(FLUSH + 1)  # the flusher's turn
    assert rec.pending == 0
    (event,) = writer.events.values()
    assert len(writer.patches) == 1
    assert event["count"] == 5
    assert event["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["lastTimestamp"] == f"2026-01-01T00:00:{int(t0) + 8:02d}Z"
    assert event["involvedObject"] == {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgentPool",
        "name": "pool",
        "namespace": "ns",
        "uid": "u-pool",
        "resourceVersion": "5",
    }
    assert event["metadata"]["namespace"] == "ns"
    assert event["source"] == {"component": "agent-forge", "host": "pod-1"}
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event flusher"]


async def test_a_hot_loop_costs_one_write_per_flush_interval() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for _ in range(600):  # once a second for 10 minutes
        await rec.record(POOL, type=EventType.WARNING, reason="Flapping", message="again")
        await asyncio.sleep(1)
    await rec.flush()
    (event,) = writer.events.values()
    assert event["count"] == 600
    assert writer.writes() <= 1 + 600 / FLUSH + 1


async def test_an_isolated_repeat_is_written_at_once() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    await normal(rec, POOL, "R", "m")
    await asyncio.sleep(FLUSH + 1)
    await normal(rec, POOL, "R", "m")
    assert writer.patches == [{"count": 2, "lastTimestamp": "2026-01-01T00:00:31Z"}]
    assert rec.pending == 0


async def test_flush_writes_what_is_pending_and_close_drops_it() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for reason in ("A", "B"):
        await normal(rec, POOL, reason, "m")
        await normal(rec, POOL, reason, "m")
    assert rec.pending == 2
    await rec.flush()
    assert sorted(e["count"] for e in writer.events.values()) == [2, 2]
    await normal(rec, POOL, "A", "m")
    assert rec.pending == 1
    await rec.close()
    await asyncio.sleep(FLUSH * 2)
    assert rec.pending == 0
    assert sorted(e["count"] for e in writer.events.values()) == [2, 2]


async def test_different_messages_are_different_events() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    await normal(rec, POOL, "Scaled", "to 1")
    await normal(rec, POOL, "Scaled", "to 2")
    assert writer.creates == 2


async def test_an_expired_event_is_recreated_with_its_count() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    await normal(rec, POOL, "R", "m")
    writer.events.clear()  # the apiserver's TTL removed it
    await normal(rec, POOL, "R", "m")
    await asyncio.sleep(FLUSH + 1)
    assert writer.creates == 2
    assert [e["count"] for e in writer.events.values()] == [2]


# --- similar events (one object, one reason, other messages): client-go's aggregator -----


async def test_the_tenth_distinct_message_within_ten_minutes_is_combined() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for i in range(1, 13):
        await normal(rec, POOL, "Scaled", f"to {i}")
        await asyncio.sleep(10)
    own = [e for e in writer.by_reason("Scaled") if not e["message"].startswith("(combined")]
    (combined,) = [e for e in writer.by_reason("Scaled") if e["message"].startswith("(combined")]
    assert sorted(e["message"] for e in own) == sorted(f"to {i}" for i in range(1, 10))
    await asyncio.sleep(FLUSH + 1)
    assert combined["count"] == 3
    assert combined["message"] == "(combined from similar events): to 12"

    await normal(rec, POOL, "Scaled", "to 3")  # a message seen before keeps its own event
    await rec.flush()
    assert next(e for e in own if e["message"] == "to 3")["count"] == 2

    await asyncio.sleep(601)  # ten quiet minutes: similar events start afresh
    await normal(rec, POOL, "Scaled", "to 13")
    assert writer.by_reason("Scaled")[-1]["message"] == "to 13"


# --- groups: the same reason on many objects of one pool ----------------------------------


HOLD = event_correlator.GROUP_HOLD_S


async def test_a_burst_is_one_event_on_the_pool_created_with_its_count() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for i in range(1, 8):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
        await asyncio.sleep(4)  # 28 s in all
    assert writer.writes() == 0  # va1's held, then folded into the burst's by va2's
    await asyncio.sleep(FLUSH - 28 + 4 + 1)  # a flush interval after va2's: created
    (combined,) = writer.by_reason("VMCreated")
    assert combined["involvedObject"]["kind"] == "VsphereAgentPool"
    assert combined["involvedObject"]["name"] == "pool"
    assert combined["count"] == 7
    assert combined["message"] == (
        "(combined from similar events): VsphereAgent ns/va7: VM vm7 is running"
    )
    assert combined["firstTimestamp"] < combined["lastTimestamp"]  # va1's, va7's
    assert writer.writes() == 1  # no event on any VsphereAgent

    await normal(rec, obj("va8"), "VMCreated", "VM vm8 is running", group=POOL)
    await rec.flush()  # a later member of the burst: counted onto the combined event
    assert combined["count"] == 8
    assert writer.writes() == 2


async def test_a_later_burst_is_one_patch_of_the_pools_event_its_first_folded_in() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for i in range(1, 4):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
    await asyncio.sleep(FLUSH + 1)
    (combined,) = writer.by_reason("VMCreated")
    assert (combined["count"], writer.writes()) == (3, 1)
    first_seen = combined["firstTimestamp"]

    await asyncio.sleep(120)  # quiet: the next scale-up is a burst of its own
    for i in range(4, 10):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
        await asyncio.sleep(2)
    assert writer.writes() == 1  # va4's held, folded by va5's; the count waits
    await asyncio.sleep(FLUSH)
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMCreated")] == ["pool"]
    assert combined["count"] == 9
    assert combined["firstTimestamp"] == first_seen
    assert writer.writes() == 2  # one patch for the whole second burst


async def test_a_vm_made_alone_keeps_its_event_held_for_a_moment() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    await normal(rec, obj("va1"), "VMCreated", "VM vm1 is running", group=POOL)
    assert writer.writes() == 0
    await asyncio.sleep(HOLD + 0.5)
    (own,) = writer.by_reason("VMCreated")
    assert own["involvedObject"]["name"] == "va1"
    assert own["count"] == 1
    assert own["message"] == "VM vm1 is running"

    await asyncio.sleep(10)  # a second VM after the hold: the burst goes on, onto the pool
    for i in range(2, 4):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
    await asyncio.sleep(HOLD + 0.5)
    assert len(writer.by_reason("VMCreated")) == 1  # the combined one waits a flush interval
    await asyncio.sleep(FLUSH)
    own, combined = writer.by_reason("VMCreated")
    assert (own["involvedObject"]["name"], combined["involvedObject"]["name"]) == ("va1", "pool")
    assert combined["count"] == 2


async def test_held_and_combined_events_are_written_by_flush_and_dropped_by_close() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    await normal(rec, obj("va0"), "VMCreating", "creating vm0", group=POOL)
    for i in range(1, 4):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
    await rec.flush()  # a clean shutdown writes them: the lone one on its object
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMCreating")] == ["va0"]
    (combined,) = writer.by_reason("VMCreated")
    assert combined["count"] == 3
    assert combined["firstTimestamp"] <= combined["lastTimestamp"]

    for i in range(4, 6):
        await normal(rec, obj(f"va{i}"), "VMDeleting", f"deleting vm{i}", group=POOL)
    await rec.close()  # a lost Lease writes nothing more
    assert writer.by_reason("VMDeleting") == []


async def test_vms_made_a_minute_apart_keep_their_own_events() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for i in range(1, 4):
        await normal(rec, obj(f"va{i}"), "VMCreated", "up", group=POOL)
        await asyncio.sleep(61)
    names = [e["involvedObject"]["name"] for e in writer.by_reason("VMCreated")]
    assert names == ["va1", "va2", "va3"]


async def test_group_members_keep_their_other_events_and_groups_are_per_reason() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    for i in range(1, 6):
        await normal(rec, obj(f"va{i}"), "VMCreating", "creating", group=POOL)
    await normal(rec, obj("va5"), "VMRetained", "retained")  # no group: its own, at once
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMRetained")] == ["va5"]
    await normal(rec, obj("va5"), "VMCreated", "up", group=POOL)  # another reason's burst
    await rec.flush()
    creating = writer.by_reason("VMCreating")
    assert [e["involvedObject"]["name"] for e in creating] == ["pool"]
    assert [e["count"] for e in creating] == [5]
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMCreated")] == ["va5"]


async def test_without_a_hold_the_first_object_keeps_its_event_at_once() -> None:
    writer = FakeWriter()
    rec = recorder(writer, group_hold=0)
    for i in range(1, 4):
        await normal(rec, obj(f"va{i}"), "VMCreated", f"VM vm{i} is running", group=POOL)
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMCreated")] == ["va1"]
    await asyncio.sleep(FLUSH + 1)  # the rest: a flush interval after va2's
    _, combined = writer.by_reason("VMCreated")
    assert combined["count"] == 2


async def test_a_group_policy_names_the_group_when_the_caller_does_not() -> None:
    writer = FakeWriter()

    def onto_pool(about: Mapping[str, Any], type_: str, reason: str) -> Mapping[str, Any] | None:
        return POOL if reason == "VMCreated" else None

    rec = recorder(writer, group_of=onto_pool)
    for i in range(1, 6):
        await normal(rec, obj(f"va{i}"), "VMCreated", "up")
        await rec.record(obj(f"va{i}"), type=EventType.WARNING, reason="Slow", message="slow")
    assert len(writer.by_reason("Slow")) == 5
    await rec.flush()
    assert [e["involvedObject"]["name"] for e in writer.by_reason("VMCreated")] == ["pool"]
    await rec.close()


# --- the spam filter: new Events per object and type ---------------------------------------


async def test_the_spam_filter_limits_new_events_per_object_and_type_and_refills_slowly() -> None:
    writer = FakeWriter()
    rec = recorder(writer, burst=5, refill_per_second=1 / 300)
    for i in range(8):
        await normal(rec, POOL, f"R{i}", "m")
    assert writer.creates == 5
    await rec.record(POOL, type=EventType.WARNING, reason="W", message="m")
    await normal(rec, obj("other"), "R", "m")
    assert writer.creates == 7, "a Warning and another object have their own buckets"
    await normal(rec, POOL, "R0", "m")  # a repeat of a written Event is not filtered
    await rec.flush()
    assert writer.by_reason("R0")[0]["count"] == 2
    await asyncio.sleep(300)
    await normal(rec, POOL, "late", "m")
    assert writer.creates == 8


# --- best effort ---------------------------------------------------------------------------


async def test_api_failures_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    writer.fail_with = errors.Forbidden(status=403, reason="Forbidden", message="no rbac")
    await rec.record(POOL, type=EventType.WARNING, reason="R", message="m")
    writer.fail_with = None
    await rec.record(POOL, type=EventType.WARNING, reason="R", message="m")
    await rec.record(POOL, type=EventType.WARNING, reason="R", message="m")
    writer.fail_with = errors.TransportError("reset")
    await asyncio.sleep(FLUSH + 1)  # the flusher's write fails: logged, the flusher ends
    assert "could not record event" in caplog.text
    assert rec.pending == 0
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event flusher"]


async def test_cluster_scoped_objects_get_events_in_default() -> None:
    writer = FakeWriter()
    rec = recorder(writer)
    node = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "uid": "u"}}
    await normal(rec, node, "R", "m")
    (event,) = writer.events.values()
    assert event["metadata"]["namespace"] == "default"


def test_messages_are_scrubbed_of_credentials_and_cut_to_1k() -> None:
    text = events.scrub("login failed: Authorization: Bearer abc.def password=hunter2 token: xyz")
    assert "abc.def" not in text
    assert "hunter2" not in text
    assert "xyz" not in text
    assert "login failed" in text
    assert len(events.scrub("x" * 5000)) == events.MAX_MESSAGE
