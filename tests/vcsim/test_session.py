"""Sessions: one verified login per whole credential shared by its callers, re-established
once per expiry."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from agentforge.vsphere import (
    Credentials,
    Location,
    LoginFailed,
    PermissionDenied,
    SessionOptions,
    SessionRegistry,
    SessionUnavailable,
    VsphereService,
)
from tests.vcsim import support
from tests.vcsim.conftest import FAST

pytestmark = pytest.mark.vcsim


async def test_concurrent_callers_share_one_login(vcsim: Any, credentials: Credentials) -> None:
    before = await vcsim.control.counters()
    registry = SessionRegistry(options=FAST)
    try:
        services = [VsphereService(registry=registry, credentials=credentials) for _ in range(5)]
        await asyncio.gather(
            *(s.vm_by_uuid(datacenter="dc1", bios_uuid="4" * 32) for s in services)
        )
    finally:
        await registry.close()
    after = await vcsim.control.counters()
    assert support.delta(before, after, "logins") == 1


async def test_an_expired_session_is_re_established_once_for_all_concurrent_callers(
    private: tuple[Any, VsphereService],
) -> None:
    vcsim, service = private
    session = await service.session()
    await vcsim.control.end_sessions()
    before = await vcsim.control.counters()
    results = await asyncio.gather(
        *(service.vm_by_uuid(datacenter="dc1", bios_uuid=f"{i:032x}") for i in range(8))
    )
    after = await vcsim.control.counters()
    assert results == [None] * 8
    assert support.delta(before, after, "logins") == 1
    assert session.logins == 2


async def test_the_vcenter_certificate_is_verified_against_the_ca_bundle(
    credentials: Credentials,
) -> None:
    untrusting = dataclasses.replace(credentials, ca_bundle_pem=None)
    registry = SessionRegistry(options=FAST)
    try:
        with pytest.raises(SessionUnavailable, match="not trusted"):
            await registry.session(untrusting)
    finally:
        await registry.close()


async def test_a_wrong_password_is_denied_and_never_echoed(credentials: Credentials) -> None:
    wrong = dataclasses.replace(credentials, password="not-the-password-42")
    registry = SessionRegistry(options=FAST)
    try:
        with pytest.raises(PermissionDenied) as info:
            await registry.session(wrong)
    finally:
        await registry.close()
    assert "not-the-password-42" not in str(info.value)
    assert credentials.password not in str(info.value)


async def test_keepalive_pings_only_while_idle(vcsim: Any, credentials: Credentials) -> None:
    registry = SessionRegistry(options=dataclasses.replace(FAST, keepalive_seconds=0.2))
    try:
        service = VsphereService(registry=registry, credentials=credentials)
        await service.session()
        before = await vcsim.control.counters()
        await asyncio.sleep(0.7)
        idle = await vcsim.control.counters()
        busy_until = asyncio.get_running_loop().time() + 0.7
        while asyncio.get_running_loop().time() < busy_until:
            await service.vm_by_uuid(datacenter="dc1", bios_uuid="5" * 32)
            await asyncio.sleep(0.05)
        busy = await vcsim.control.counters()
    finally:
        await registry.close()
    assert support.method_delta(before, idle, "CurrentTime") >= 2
    assert support.method_delta(idle, busy, "CurrentTime") <= 1


async def test_a_transient_fault_on_a_call_is_retried(vcsim: Any, service: VsphereService) -> None:
    await service.session()
    await vcsim.control.fail_next_tasks("FindByUuid", 2, "SystemError")
    assert await service.vm_by_uuid(datacenter="dc1", bios_uuid="6" * 32) is None
    assert (await vcsim.control.counters())["faults_injected"] == 2


async def test_another_password_never_uses_an_existing_session(
    vcsim: Any, service: VsphereService, registry: SessionRegistry, credentials: Credentials
) -> None:
    first = await service.session()
    logins = first.logins
    rotated = dataclasses.replace(credentials, password="rotated-password")
    with pytest.raises(LoginFailed):
        await registry.session(rotated)
    assert registry.live(rotated) is None
    assert first.credentials.password == credentials.password  # never swapped in place
    assert await registry.session(credentials) is first
    assert first.logins == logins


def test_session_options_defaults_are_production_values() -> None:
    opts = SessionOptions()
    assert opts.max_workers >= 2
    assert opts.retry_attempts >= 3


async def test_vcenter_connections_ignore_the_proxy_environment(
    credentials: Credentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy variables are for ISO downloads only (`vsphere.iso_http`): pyVmomi's
    SOAP connection and the session's HTTP client (datastore files, tagging REST) go to
    vCenter directly even when they are set, in either case."""
    from sim.http_proxy import ForwardProxy  # noqa: PLC0415 (only this test needs it)

    async with ForwardProxy() as proxy:
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        registry = SessionRegistry(options=FAST)
        try:
            service = VsphereService(registry=registry, credentials=credentials)
            assert await service.vm_by_uuid(datacenter="dc1", bios_uuid="5" * 32) is None
            where = Location(datacenter="dc1", datastore="iso-ds")
            assert not await service.file_exists(where=where, path="no-such/file.iso")
        finally:
            await registry.close()
        assert proxy.requests == []
