"""Credentials are isolated from each other, logins are bounded, a dead vCenter costs only
its own callers, and an interrupted create destroys nothing. Against the simulator: it
accepts exactly one user and password, so any other password fails like on vCenter
(`InvalidLogin`), and its request log shows every login attempt."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from agentforge.vsphere import (
    WAIT_FOR_LOGIN,
    Credentials,
    IsoSource,
    Location,
    LoginDeferred,
    LoginFailed,
    LoginPending,
    OwnershipMarkers,
    Placement,
    PowerState,
    SessionKey,
    SessionRegistry,
    SessionUnavailable,
    VcenterUnreachable,
    VsphereService,
)
from sim.actors.waiting import eventually
from sim.blackhole import BlackHole
from sim.vsphere_tasks import TaskDriver
from tests.vcsim import support
from tests.vcsim.conftest import FAST, credentials_of

pytestmark = pytest.mark.vcsim


async def _logins(vcsim: Any, since: int) -> tuple[int, int]:
    """(failed, succeeded) SOAP logins the simulator answered since `since`."""
    entries = await vcsim.control.request_log("Login", since=since)
    failed = sum(1 for e in entries if e.get("fault") == "InvalidLogin")
    return failed, sum(1 for e in entries if not e.get("fault") and e.get("status") == 200)


async def _methods(vcsim: Any, since: int) -> list[str]:
    entries = await vcsim.control.request_log(since=since)
    return [str(e.get("method") or f"{e['http_method']} {e['path']}") for e in entries]


async def test_a_wrong_password_never_gets_a_session_a_vm_or_an_iso_upload(
    vcsim: Any, credentials: Credentials, placement: Placement, markers: OwnershipMarkers
) -> None:
    wrong = dataclasses.replace(credentials, password="not-the-password")
    assert (wrong.netloc, wrong.username) == (credentials.netloc, credentials.username)
    registry = SessionRegistry(options=FAST)
    driver = TaskDriver(registry)
    try:
        good = VsphereService(registry=registry, credentials=credentials)
        bad = VsphereService(registry=registry, credentials=wrong)
        created = await driver.create(good, support.request(placement, markers))
        mark = await vcsim.control.last_seq()
        with pytest.raises(LoginFailed, match="InvalidLogin"):
            await bad.session()
        with pytest.raises(LoginFailed):
            await driver.create(bad, support.request(placement, markers))
        with pytest.raises(SessionUnavailable):
            await bad.ensure_iso(
                source=IsoSource(url="http://127.0.0.1:9/never.iso"),
                where=Location(datacenter="dc1", datastore="iso-ds"),
                prefix=f"agent-forge/tests/{placement.folder}",
            )
        assert registry.live(wrong) is None
        assert (await good.session()).credentials.password == credentials.password
        methods = await _methods(vcsim, mark)
    finally:
        driver.close()
        await registry.close()
    assert await _logins(vcsim, mark) == (1, 0)
    assert "CreateVM_Task" not in methods
    assert not [m for m in methods if m.startswith("PUT /folder")]
    assert created.power_state is PowerState.ON


async def test_failed_logins_stay_bounded_while_vcenter_ends_sessions_again_and_again(
    vcsim_factory: Callable[..., Any],
) -> None:
    """The issue saw 1,097 failed logins in 20 s; the production policy allows one per
    credential per backoff, and the right password keeps logging in again."""
    sim = vcsim_factory()
    right = credentials_of(sim)
    wrong = dataclasses.replace(right, password="wrong-password")
    registry = SessionRegistry(options=FAST)  # production LoginPolicy
    good = VsphereService(registry=registry, credentials=right)
    bad = VsphereService(registry=registry, credentials=wrong)
    calls = {"good": 0, "refused": 0}

    async def reconciles(service: VsphereService, name: str) -> None:
        while True:
            try:
                await service.vm_by_uuid(datacenter="dc1", bios_uuid="7" * 32)
                calls[name] += 1
            except SessionUnavailable:
                calls["refused"] += 1
            await asyncio.sleep(0.005)

    mark = await sim.control.last_seq()
    workers = [asyncio.create_task(reconciles(s, n)) for s, n in ((good, "good"), (bad, "bad"))]
    try:
        for _ in range(30):
            await sim.control.end_sessions()
            await asyncio.sleep(0.1)
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await registry.close()
    failed, succeeded = await _logins(sim, mark)
    assert failed == 1, "one refused login, then the backoff"
    assert calls["refused"] > 100, "the bad pool kept asking"
    assert succeeded >= 5, "the right password logs in again after every end"
    assert calls["good"] > 0


async def test_at_most_two_failed_logins_per_account_and_window_across_passwords(
    vcsim_factory: Callable[..., Any],
) -> None:
    sim = vcsim_factory()
    right = credentials_of(sim)
    registry = SessionRegistry(options=FAST)
    mark = await sim.control.last_seq()
    try:
        session = await registry.session(right)
        outcomes = []
        for n in range(6):
            wrong = dataclasses.replace(right, password=f"wrong-{n}")
            with pytest.raises(SessionUnavailable) as info:
                await registry.session(wrong)
            outcomes.append(type(info.value))
        assert outcomes[:2] == [LoginFailed, LoginFailed]
        assert set(outcomes[2:]) == {LoginDeferred}
        assert "not before" in str(info.value)
        # the logged-in session needs no login and is not held back
        await VsphereService(registry=registry, credentials=right).vm_by_uuid(
            datacenter="dc1", bios_uuid="8" * 32
        )
        assert session.logins == 1
    finally:
        await registry.close()
    assert await _logins(sim, mark) == (2, 1)


async def test_one_account_spelled_many_ways_at_a_name_and_its_address_gets_one_budget(
    vcsim_factory: Callable[..., Any],
) -> None:
    """The simulator is one vCenter (one instance UUID) at `127.0.0.1` and `localhost`;
    its user written in any case, with its domain first or last, is one account."""
    sim = vcsim_factory()
    right = credentials_of(sim)
    user = right.username.partition("@")[0]
    spellings = [
        (f"127.0.0.1:{sim.port}", user),
        (f"https://127.0.0.1:{sim.port}/sdk", f"{user.upper()}@VSPHERE.LOCAL"),
        (f"localhost:{sim.port}", f"vsphere.local\\{user}"),  # first seen after the budget
        (f"LocalHost:{sim.port}", user.capitalize()),
        (f"https://127.0.0.1:{sim.port}", f"{user}@vsphere.local"),
    ]
    registry = SessionRegistry(options=FAST)
    mark = await sim.control.last_seq()
    outcomes = []
    try:
        for n, (server, username) in enumerate(spellings):
            wrong = dataclasses.replace(
                right, server=server, username=username, password=f"wrong-{n}"
            )
            with pytest.raises(SessionUnavailable) as info:
                await registry.session(wrong, wait=WAIT_FOR_LOGIN)
            outcomes.append(type(info.value))
    finally:
        await registry.close()
    assert outcomes == [LoginFailed, LoginFailed, LoginDeferred, LoginDeferred, LoginDeferred]
    assert await _logins(sim, mark) == (2, 0)


async def test_a_black_holed_vcenter_costs_its_own_callers_a_bounded_wait_and_nobody_else(
    vcsim: Any, credentials: Credentials
) -> None:
    options = dataclasses.replace(
        FAST, connect_timeout_seconds=3.0, login_timeout_seconds=5.0, login_wait_seconds=0.2
    )
    registry = SessionRegistry(options=options)
    ended: list[tuple[SessionKey, SessionUnavailable | None]] = []
    registry.subscribe(lambda key, failure: ended.append((key, failure)))
    try:
        async with BlackHole() as hole:
            dead = dataclasses.replace(credentials, server=hole.server)
            with pytest.raises(LoginPending) as pending:
                await registry.session(dead)
            assert pending.value.key == dead.key
            with pytest.raises(LoginPending):  # the caller returned while the login goes on
                await registry.session(dead)
            await hole.wait_connected(1, within=10)
            assert hole.open == 1
            await registry.session(credentials, wait=WAIT_FOR_LOGIN)
            healthy = VsphereService(registry=registry, credentials=credentials)
            assert await healthy.vm_by_uuid(datacenter="dc1", bios_uuid="9" * 32) is None
            assert hole.open == 1, "the healthy vCenter was served while that login hung"
            with pytest.raises(LoginPending):  # that login still goes on, alone
                await registry.session(dead)
            assert ended == [(credentials.key, None)]  # the healthy login, reported
            await eventually(
                lambda: len(ended) == 2,
                what="the dead vCenter's login to end",
                within=30,
                interval=0.05,
            )
            key, failure = ended[1]
            assert key == dead.key
            assert isinstance(failure, VcenterUnreachable)
            await hole.wait_given_up(1, within=30)  # the client's thread let go
            accepted = hole.accepted
            with pytest.raises(VcenterUnreachable, match="fail fast until"):
                await registry.session(dead)
            assert hole.accepted == accepted, "the breaker sent nothing"
    finally:
        await registry.close()


async def test_a_rotated_credential_gets_its_own_session_and_the_unused_one_is_closed(
    vcsim: Any, credentials: Credentials
) -> None:
    options = dataclasses.replace(FAST, keepalive_seconds=0.2, idle_close_seconds=1.0)
    registry = SessionRegistry(options=options)
    # Another credential vCenter accepts (the simulator knows one password): the same
    # user and password, but the Secret now skips verification instead of pinning a CA.
    rotated = dataclasses.replace(credentials, insecure=True, ca_bundle_pem=None)
    mark = await vcsim.control.last_seq()
    try:
        old = await registry.session(credentials)
        new = await registry.session(rotated)
        assert new is not old
        assert (old.logins, new.logins) == (1, 1)
        service = VsphereService(registry=registry, credentials=rotated)

        async def keep_using() -> None:
            while True:
                await service.vm_by_uuid(datacenter="dc1", bios_uuid="a" * 32)
                await asyncio.sleep(0.1)

        user = asyncio.create_task(keep_using())
        try:
            await eventually(
                lambda: old.closed,
                what="the unused session to be closed",
                within=20,
                interval=0.05,
            )
            logouts = await eventually(
                lambda: _methods(vcsim, mark),
                lambda methods: "Logout" in methods,
                within=10,
                what="the unused session's logout",
            )
        finally:
            user.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await user
        assert registry.live(credentials) is None
        assert registry.live(rotated) is new
        assert not new.closed
    finally:
        await registry.close()
    assert logouts.count("Logout") == 1
