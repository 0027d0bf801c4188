"""Reflector rules: list then watch, resume, relist on 410, backoff, transform, handlers."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from agentforge.api.kinds import AGENT
from agentforge.kube import errors, informer
from agentforge.kube.store import key_for
from sim.actors.waiting import eventually
from tests.unit.kube.fakes import (
    FakeApi,
    Recorder,
    WatchScript,
    bookmark,
    event,
    obj,
)

pytestmark = pytest.mark.looptime


def make(api: FakeApi, **kwargs: Any) -> informer.Informer:
    return informer.Informer(client=api, kind=AGENT, rng=random.Random(1), **kwargs)


async def test_it_lists_then_watches_from_the_list_resource_version() -> None:
    api = FakeApi()
    api.put(obj("a", "3"), obj("b", "4"))
    api.list_rv = "10"
    rec = Recorder()
    inf = make(api)
    inf.add_handler(rec.handler())
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
        await eventually(lambda: len(api.watch_calls) == 1, what="len(api.watch_calls) == 1")
    assert sorted(rec.events) == [("add", "ns/a", "3"), ("add", "ns/b", "4")]
    assert api.watch_calls[0].resource_version == "10"
    assert inf.has_synced


async def test_the_list_is_requested_in_pages_of_page_size() -> None:
    api = FakeApi()
    api.put(*(obj(f"o{i}", str(i)) for i in range(5)))
    inf = make(api, page_size=2)
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
    assert api.list_calls[0].limit == 2
    assert len(inf.store) == 5


async def test_a_dropped_watch_resumes_from_the_last_seen_resource_version() -> None:
    api = FakeApi()
    api.put(obj("a", "1"))
    api.list_rv = "5"
    api.script(
        None,
        WatchScript(
            steps=[
                event("MODIFIED", obj("a", "11")),
                bookmark("15"),
                errors.TransportError("reset"),
            ]
        ),
        WatchScript(steps=[event("ADDED", obj("b", "16"))], hang=True),
    )
    rec = Recorder()
    inf = make(api)
    inf.add_handler(rec.handler())
    async with inf:
        await eventually(
            lambda: inf.get(namespace="ns", name="b") is not None,
            what="inf.get(namespace='ns', name='b') is not None",
        )
    assert [c.resource_version for c in api.watch_calls[:2]] == ["5", "15"]
    assert len(api.list_calls) == 1, "a dropped stream must not relist"
    assert rec.events == [("add", "ns/a", "1"), ("update", "ns/a", "11"), ("add", "ns/b", "16")]


async def test_watches_that_end_at_once_and_empty_are_retried_with_backoff() -> None:
    api = FakeApi()
    api.script(None, *(WatchScript() for _ in range(3)))  # each ends immediately, empty
    inf = make(api)
    loop = asyncio.get_running_loop()
    async with inf:
        await eventually(lambda: len(api.watch_calls) == 4, what="len(api.watch_calls) == 4")
        elapsed = loop.time()
    assert elapsed >= 0.8 + 1.6 + 3.2, "empty streams must not be reopened in a hot loop"


async def test_a_watch_that_ends_cleanly_is_resumed_without_relisting() -> None:
    api = FakeApi()
    api.list_rv = "7"
    api.script(None, WatchScript(steps=[event("ADDED", obj("a", "8"))]))
    inf = make(api)
    async with inf:
        await eventually(lambda: len(api.watch_calls) >= 2, what="len(api.watch_calls) >= 2")
    assert api.watch_calls[1].resource_version == "8"
    assert len(api.list_calls) == 1


async def test_gone_at_watch_open_relists_and_emits_only_real_changes() -> None:
    api = FakeApi()
    api.put(obj("same", "1"), obj("changed", "1"), obj("gone", "1"))

    def world_moves_on() -> None:
        api.put(obj("changed", "20"), obj("new", "21"))
        api.remove("ns", "gone")
        api.list_rv = "22"

    api.script(
        None,
        WatchScript(
            open_error=errors.Gone(status=410, reason="Expired", message="x"),
            on_open=world_moves_on,
        ),
    )
    rec = Recorder()
    inf = make(api)
    inf.add_handler(rec.handler())
    async with inf:
        await eventually(
            lambda: len(api.list_calls) == 2 and len(api.watch_calls) == 2,
            what="len(api.list_calls) == 2 and len(api.watch_calls) == 2",
        )
    assert sorted(rec.events[3:]) == [
        ("add", "ns/new", "21"),
        ("delete", "ns/gone", "1"),
        ("update", "ns/changed", "20"),
    ]
    assert api.watch_calls[1].resource_version == "22"


async def test_gone_as_a_watch_error_event_relists() -> None:
    api = FakeApi()
    api.put(obj("a", "1"))
    api.script(None, WatchScript(steps=[errors.Gone(status=410, reason="Expired", message="")]))
    rec = Recorder()
    inf = make(api)
    inf.add_handler(rec.handler())
    async with inf:
        await eventually(
            lambda: len(api.list_calls) == 2 and len(api.watch_calls) == 2,
            what="len(api.list_calls) == 2 and len(api.watch_calls) == 2",
        )
    assert rec.events == [("add", "ns/a", "1")], "an unchanged object must not be re-announced"


async def test_a_410_right_after_every_relist_backs_off_instead_of_looping() -> None:
    api = FakeApi()
    gone = errors.Gone(status=410, reason="Expired", message="")
    api.script(None, *(WatchScript(open_error=gone) for _ in range(4)))
    inf = make(api)
    async with inf:
        await eventually(lambda: len(api.list_calls) == 5, what="len(api.list_calls) == 5")
    gaps = [b - a for a, b in itertools.pairwise(api.list_times)]
    assert gaps[0] < 0.1, "the first 410 relists at once"
    assert all(gap >= 0.8 for gap in gaps[1:]), f"repeated 410s must back off: {gaps}"


async def test_failures_back_off_with_jitter_before_retrying() -> None:
    api = FakeApi()
    api.list_errors = [errors.TransportError("refused")] * 3
    inf = make(api)
    async with inf:
        await asyncio.wait_for(inf.synced(), 60)
    gaps = [b - a for a, b in itertools.pairwise(api.list_times)]
    assert len(gaps) == 3
    for gap, base in zip(gaps, (0.8, 1.6, 3.2), strict=True):
        assert base <= gap < 2 * base


async def test_objects_are_transformed_before_they_are_cached_and_handed_out() -> None:
    api = FakeApi()
    api.put(obj("a", "1", metadata={"managedFields": [{"m": 1}]}, status={"big": "x" * 100}))

    def trim(o: dict[str, Any]) -> dict[str, Any]:
        o["metadata"].pop("managedFields", None)
        o.pop("status", None)
        return o

    rec: list[dict[str, Any]] = []
    inf = make(api, transform=trim)
    inf.add_handler(informer.EventHandler(on_add=rec.append))
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
    cached = inf.get(namespace="ns", name="a")
    assert cached is not None
    assert "managedFields" not in cached["metadata"]
    assert "status" not in cached
    assert rec == [cached]


async def test_the_default_transform_drops_managed_fields() -> None:
    api = FakeApi()
    api.put(obj("a", "1", metadata={"managedFields": [{"m": 1}]}))
    inf = make(api)
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
    assert "managedFields" not in inf.get(namespace="ns", name="a")["metadata"]  # type: ignore[index]


async def test_a_handler_added_after_sync_first_receives_every_cached_object() -> None:
    api = FakeApi()
    api.put(obj("a", "1"), obj("b", "2"))
    inf = make(api)
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
        rec = Recorder()
        inf.add_handler(rec.handler())
    assert sorted(rec.events) == [("add", "ns/a", "1"), ("add", "ns/b", "2")]


async def test_a_failing_handler_does_not_stop_the_informer_or_other_handlers() -> None:
    api = FakeApi()
    api.script(None, WatchScript(steps=[event("ADDED", obj("a", "2"))], hang=True))

    def explode(o: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    rec = Recorder()
    inf = make(api)
    inf.add_handler(informer.EventHandler(on_add=explode))
    inf.add_handler(rec.handler())
    async with inf:
        await eventually(lambda: len(rec.events) == 1, what="len(rec.events) == 1")
    assert rec.events == [("add", "ns/a", "2")]


async def test_each_namespace_relists_on_its_own_without_touching_the_others() -> None:
    api = FakeApi()
    api.put(obj("a", "1", namespace="one"), obj("b", "1", namespace="two"))
    api.script("one", WatchScript(open_error=errors.Gone(status=410, reason="Expired", message="")))
    rec = Recorder()
    inf = make(api, namespaces=["one", "two"])
    inf.add_handler(rec.handler())
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
        await eventually(
            lambda: sum(c.namespace == "one" for c in api.list_calls) == 2,
            what="sum((c.namespace == 'one' for c in api.list_calls)) == 2",
        )
        await eventually(lambda: len(api.watch_calls) >= 3, what="len(api.watch_calls) >= 3")
    assert sorted(rec.events) == [("add", "one/a", "1"), ("add", "two/b", "1")]
    assert [c.namespace for c in api.list_calls].count("two") == 1
    assert len(inf.list(namespace="two")) == 1


async def test_synced_waits_for_every_namespace() -> None:
    api = FakeApi()
    api.list_errors = [errors.Forbidden(status=403, reason="Forbidden", message="rbac")]
    inf = make(api, namespaces=["one", "two"])
    async with inf:
        await asyncio.sleep(0.1)
        assert not inf.has_synced, "one namespace failed to list: not synced yet"
        await asyncio.wait_for(inf.synced(), 60)


async def test_custom_indexes_answer_from_the_cache() -> None:
    api = FakeApi()
    api.put(
        obj("a", "1", metadata={"labels": {"pool": "p"}}),
        obj("b", "1", metadata={"labels": {"pool": "q"}}),
    )
    inf = make(api)
    inf.add_index("pool", lambda o: [o["metadata"].get("labels", {}).get("pool", "")])
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
    assert [o["metadata"]["name"] for o in inf.by_index("pool", "p")] == ["a"]


async def test_stop_cancels_the_reflector_task() -> None:
    api = FakeApi()
    inf = make(api)
    inf.start()
    await asyncio.wait_for(inf.synced(), 5)
    await inf.stop()
    calls = len(api.watch_calls)
    await asyncio.sleep(10)
    assert len(api.watch_calls) == calls


async def test_a_parse_hook_keeps_one_record_per_cached_object_current() -> None:
    """Parsed on the first read (a handler reads the new version's), replaced on change,
    dropped on delete; an object the parser rejects is still cached but has no record."""
    api = FakeApi()
    api.put(obj("a", "1"), obj("bad", "2"), obj("gone", "2"))
    api.script(
        None,
        WatchScript(
            steps=[event("MODIFIED", obj("a", "3")), event("DELETED", obj("gone", "4"))],
            hang=True,
        ),
    )

    def parse(o: dict[str, Any]) -> tuple[str, str]:
        meta = o["metadata"]
        if meta["name"] == "bad":
            raise ValueError("unreadable")
        return meta["name"], meta["resourceVersion"]

    seen: list[object] = []
    inf = make(api, parse=parse)
    key_a, key_bad = key_for(namespace="ns", name="a"), key_for(namespace="ns", name="bad")
    key_gone = key_for(namespace="ns", name="gone")
    inf.add_handler(
        informer.EventHandler(
            on_add=lambda o: seen.append(
                inf.record(key_for(namespace="ns", name=o["metadata"]["name"]))
            ),
            on_update=lambda old, new: seen.append(inf.record(key_a)),
        )
    )
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
        await eventually(
            lambda: inf.get(namespace="ns", name="gone") is None,
            what="inf.get(namespace='ns', name='gone') is None",
        )
    assert inf.record(key_a) == ("a", "3")
    assert seen == [("a", "1"), None, ("gone", "2"), ("a", "3")], "handlers see the new record"
    assert inf.record(key_gone) is None
    assert inf.get(namespace="ns", name="bad") is not None
    assert inf.record(key_bad) is None
    assert str(inf.rejection(key_bad)) == "unreadable"
    assert inf.rejection(key_a) is None


async def test_the_sync_parses_nothing_until_a_record_is_read() -> None:
    """Start-up pays for the list alone: records are built on the first read."""
    api = FakeApi()
    api.put(obj("a", "1"), obj("b", "1"))
    parsed: list[str] = []

    def parse(o: dict[str, Any]) -> str:
        name: str = o["metadata"]["name"]
        parsed.append(name)
        return name

    inf = make(api, parse=parse)
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
        assert parsed == []
        assert inf.record(key_for(namespace="ns", name="a")) == "a"
        assert inf.record(key_for(namespace="ns", name="a")) == "a"
    assert parsed == ["a"]


async def test_without_a_parse_hook_there_are_no_records() -> None:
    api = FakeApi()
    api.put(obj("a", "1"))
    inf = make(api)
    async with inf:
        await asyncio.wait_for(inf.synced(), 5)
    assert inf.get(namespace="ns", name="a") is not None
    assert inf.record(key_for(namespace="ns", name="a")) is None


async def test_a_record_is_parsed_and_a_rejection_logged_once_per_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A relist that replays known versions parses nothing again and logs no rejection
    twice; a new version of the rejected object is parsed (and, rejected, logged) anew.
    Nothing is parsed until read: here a handler reads every object it is told of."""
    api = FakeApi()
    api.put(obj("a", "1"), obj("bad", "1"))

    def world_moves_on() -> None:
        api.put(obj("bad", "20"))
        api.list_rv = "22"

    api.script(None, WatchScript(steps=[errors.Gone(status=410, reason="Expired", message="")]))
    api.script(
        None,
        WatchScript(
            open_error=errors.Gone(status=410, reason="Expired", message="x"),
            on_open=world_moves_on,
        ),
    )
    parsed: list[tuple[str, str]] = []

    def parse(o: dict[str, Any]) -> str:
        meta = o["metadata"]
        parsed.append((meta["name"], meta["resourceVersion"]))
        if meta["name"] == "bad":
            raise ValueError("unreadable")
        name: str = meta["name"]
        return name

    inf = make(api, parse=parse)

    def read(o: dict[str, Any]) -> None:
        inf.record(key_for(namespace="ns", name=o["metadata"]["name"]))

    inf.add_handler(informer.EventHandler(on_add=read, on_update=lambda old, new: read(new)))
    with caplog.at_level("WARNING", logger=informer.__name__):
        async with inf:
            await eventually(
                lambda: len(api.list_calls) == 3 and len(api.watch_calls) == 3,
                what="len(api.list_calls) == 3 and len(api.watch_calls) == 3",
            )
    assert sorted(parsed) == [("a", "1"), ("bad", "1"), ("bad", "20")]
    rejected = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(rejected) == 2
    assert "ns/bad (resourceVersion 1)" in rejected[0]
    assert "ns/bad (resourceVersion 20)" in rejected[1]
    assert inf.record(key_for(namespace="ns", name="a")) == "a"
    assert inf.record(key_for(namespace="ns", name="bad")) is None
