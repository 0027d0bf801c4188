"""`KubeClient.update_status` on a 409: retried as client-go's `RetryOnConflict` with
`retry.DefaultRetry` (5 attempts, 10 ms apart plus up to 10% jitter), each attempt
from a fresh GET, the last `Conflict` raised when they are used up.

The API is scripted below the client (its `get` and `replace_status`); time is the
loop's (looptime), so the pauses between attempts are measured exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.api import kinds
from agentforge.kube import errors
from agentforge.kube.client import JsonObj, KubeClient, StatusObserver
from agentforge.kube.config import ClusterConfig

pytestmark = pytest.mark.looptime

AGENT = kinds.AGENT


class Scripted(KubeClient):
    """A client whose status PUT loses `conflicts` races, then succeeds."""

    def __init__(self, *, conflicts: int, observer: StatusObserver | None = None) -> None:
        super().__init__(
            config=ClusterConfig(server="https://apiserver.invalid"), status_observer=observer
        )
        self.conflicts = conflicts
        self.version = 1
        self.calls: list[tuple[str, float]] = []

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def get(self, kind: Any, *, namespace: str | None = None, name: str) -> JsonObj:
        self.calls.append(("get", self._now()))
        return {"metadata": {"name": name, "resourceVersion": str(self.version)}}

    async def replace_status(self, kind: Any, obj: Any) -> JsonObj:
        self.calls.append(("put", self._now()))
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            raise errors.Conflict(status=409, reason="Conflict", message="modified")
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": "stored"}}


def mark(obj: JsonObj) -> JsonObj:
    obj["status"] = {"ours": True}
    return obj


def pauses(calls: list[tuple[str, float]]) -> list[float]:
    """The pause before each GET after the first (the time since the PUT before it)."""
    return [
        round(when - calls[index - 1][1], 6)
        for index, (verb, when) in enumerate(calls)
        if verb == "get" and index > 0
    ]


async def test_a_conflict_is_retried_from_a_fresh_get_after_10_to_11_ms() -> None:
    api = Scripted(conflicts=2)
    stored = await api.update_status(AGENT, namespace="ns", name="a", mutate=mark)
    assert stored["status"] == {"ours": True}
    assert [verb for verb, _ in api.calls] == ["get", "put"] * 3
    waited = pauses(api.calls)
    assert len(waited) == 2
    assert all(0.010 <= pause <= 0.011 for pause in waited), waited


async def test_five_conflicts_raise_the_last_after_four_pauses() -> None:
    api = Scripted(conflicts=10)
    with pytest.raises(errors.Conflict):
        await api.update_status(AGENT, namespace="ns", name="a", mutate=mark)
    assert [verb for verb, _ in api.calls] == ["get", "put"] * 5
    assert len(pauses(api.calls)) == 4
    assert api.conflicts == 5, "no sixth PUT"


async def test_the_pauses_are_jittered_so_racing_writers_drift_apart() -> None:
    seen: set[float] = set()
    for _ in range(5):
        api = Scripted(conflicts=4)
        await api.update_status(AGENT, namespace="ns", name="a", mutate=mark)
        seen.update(pauses(api.calls))
    assert len(seen) > 1, "every pause the same: no jitter"
    assert all(0.010 <= pause <= 0.011 for pause in seen), seen


async def test_a_stale_start_costs_one_put_then_the_get_decides() -> None:
    api = Scripted(conflicts=1)
    start = {"metadata": {"name": "a", "resourceVersion": "0"}}
    await api.update_status(AGENT, namespace="ns", name="a", mutate=mark, start=start)
    assert [verb for verb, _ in api.calls] == ["put", "get", "put"]


async def test_other_errors_are_not_retried_here() -> None:
    class Gone(Scripted):
        async def replace_status(self, kind: Any, obj: Any) -> JsonObj:
            self.calls.append(("put", self._now()))
            raise errors.NotFound(status=404, reason="NotFound", message="gone")

    api = Gone(conflicts=0)
    with pytest.raises(errors.NotFound):
        await api.update_status(AGENT, namespace="ns", name="a", mutate=mark)
    assert [verb for verb, _ in api.calls] == ["get", "put"]


async def test_a_write_from_start_is_observed_like_one_after_a_get() -> None:
    seen: list[tuple[Any, Any]] = []
    api = Scripted(
        conflicts=0, observer=lambda kind, before, after: seen.append((before, after["status"]))
    )
    start = {"metadata": {"name": "a", "resourceVersion": "1"}, "status": {"ours": False}}
    await api.update_status(AGENT, namespace="ns", name="a", mutate=mark, start=start)
    assert [verb for verb, _ in api.calls] == ["put"]
    assert seen == [(start, {"ours": True})]
