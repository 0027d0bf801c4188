"""Discarding a temporary upload: final after an answered PUT, looked at again after an
aborted one (the server may create the file after the client gave up on the request).

The datastore is scripted; time is the loop's (looptime), so the pauses cost nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.vsphere import IsoLimits, TransientError
from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.iso import upload as iso_upload

pytestmark = pytest.mark.looptime

WHERE = datastore.Location(datacenter="dc1", datastore="iso-ds")
TEMP = "agent-forge/ns/pool/.upload-00.iso"


class Store:
    """A datastore where the file appears `appears_at` seconds into the test."""

    def __init__(self, *, appears_at: float | None, present: bool = False) -> None:
        self.appears_at = appears_at
        self.present = present
        self.calls: list[tuple[str, float]] = []
        self.fail_heads = 0

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _settle(self) -> None:
        if self.appears_at is not None and self._now() >= self.appears_at:
            self.present, self.appears_at = True, None

    async def delete(self, session: Any, *, where: Any, path: str) -> bool:
        self._settle()
        self.calls.append(("delete", self._now()))
        found, self.present = self.present, False
        return found

    async def exists(self, session: Any, *, where: Any, path: str) -> bool:
        self._settle()
        self.calls.append(("exists", self._now()))
        if self.fail_heads:
            self.fail_heads -= 1
            raise TransientError("HEAD failed", subject=path)
        return self.present


def install(monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
    monkeypatch.setattr(datastore, "delete", store.delete)
    monkeypatch.setattr(datastore, "exists", store.exists)


async def discard(recheck: tuple[float, ...]) -> None:
    await iso_upload.discard(None, WHERE, TEMP, recheck=recheck)  # type: ignore[arg-type]


async def test_after_an_answered_put_one_delete_is_final(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(appears_at=None)
    install(monkeypatch, store)
    await discard(())
    assert [c for c, _ in store.calls] == ["delete"]


async def test_after_an_aborted_put_a_file_found_at_once_is_not_looked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(appears_at=None, present=True)
    install(monkeypatch, store)
    await discard(IsoLimits().abort_recheck_seconds)
    assert [c for c, _ in store.calls] == ["delete"]


async def test_a_file_the_server_creates_after_the_first_delete_is_deleted_when_it_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = asyncio.get_running_loop().time()
    store = Store(appears_at=start + 0.5)
    install(monkeypatch, store)
    await discard((0.25, 0.5, 1.0))
    assert [(c, round(t - start, 2)) for c, t in store.calls] == [
        ("delete", 0.0),
        ("exists", 0.25),
        ("exists", 0.75),
        ("delete", 0.75),
    ]
    assert not store.present


async def test_a_failed_look_is_not_taken_for_absence_the_next_one_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = asyncio.get_running_loop().time()
    store = Store(appears_at=start + 0.1)
    store.fail_heads = 1
    install(monkeypatch, store)
    await discard((0.25, 0.5))
    assert [c for c, _ in store.calls] == ["delete", "exists", "exists", "delete"]
    assert not store.present


async def test_an_aborted_put_that_never_reached_the_server_costs_only_the_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(appears_at=None)
    install(monkeypatch, store)
    await discard((0.25, 0.5, 1.0))
    assert [c for c, _ in store.calls] == ["delete", "exists", "exists", "exists"]
