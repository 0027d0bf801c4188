"""Keys that met a login still running are reconciled again when it ends; a failed login
brings back every key that used those credentials. Against a real registry whose
login fails fast (nothing listens on the port)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator

import pytest

from agentforge import vsphere
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.waits import LoginWaits


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def registry() -> AsyncIterator[vsphere.SessionRegistry]:
    options = dataclasses.replace(vsphere.SessionOptions(), login_wait_seconds=0.0)
    built = vsphere.SessionRegistry(options=options)
    yield built
    await built.close()


async def test_a_key_that_met_a_login_in_flight_is_enqueued_when_it_ends(
    registry: vsphere.SessionRegistry,
) -> None:
    dead = vsphere.Credentials(server=f"127.0.0.1:{closed_port()}", username="u", password="p")
    woken: list[str] = []
    ended = asyncio.Event()
    waits = LoginWaits(registry)

    def wake(key: ObjectKey) -> None:
        woken.append(key)
        ended.set()

    waits.bind(wake)
    with pytest.raises(vsphere.LoginPending) as pending:
        await registry.session(dead)
    result = waits.wait(pending.value, ObjectKey("ns/pool"))
    assert result.requeue_after == registry.options.login_timeout_seconds  # the fallback
    await asyncio.wait_for(ended.wait(), timeout=30)
    assert woken == ["ns/pool"]
    with pytest.raises(vsphere.VcenterUnreachable):
        await registry.session(dead)


async def test_a_failed_login_brings_back_every_key_using_those_credentials(
    registry: vsphere.SessionRegistry,
) -> None:
    dead = vsphere.Credentials(server=f"127.0.0.1:{closed_port()}", username="u", password="p")
    other = dataclasses.replace(dead, password="other")
    woken: list[str] = []
    forgotten: list[str] = []
    ended = asyncio.Event()
    waits = LoginWaits(registry, on_failure=forgotten.append)

    def wake(key: ObjectKey) -> None:
        woken.append(key)
        ended.set()

    waits.bind(wake)
    waits.track(ObjectKey("ns/a"), dead.key)
    waits.track(ObjectKey("ns/b"), dead.key)
    waits.track(ObjectKey("ns/c"), other.key)
    waits.track(ObjectKey("ns/b"), None)  # b moved on (deleted, or another Secret)
    with pytest.raises(vsphere.LoginPending):
        await registry.session(dead)
    await asyncio.wait_for(ended.wait(), timeout=30)
    assert woken == ["ns/a"]
    assert forgotten == ["ns/a"]
