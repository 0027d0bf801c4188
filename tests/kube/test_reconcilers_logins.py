"""Pools get exactly their own credentials' session: a wrong or rotated-to-wrong password is
reported on exactly its pools, borrows nobody's login, and cannot storm vCenter with
failed logins. The infra and vm controllers against the real control plane and vcsim
(which accepts exactly one password, so any other fails with InvalidLogin)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.api import kinds
from sim.actors.waiting import eventually
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import SECRET, World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL
BAD = "bad-creds"


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = {c["type"]: c for c in obj["status"]["conditions"]}[type_]
    return found


async def failed_logins(vcsim: VcsimControl, since: int) -> int:
    entries = await vcsim.request_log("Login", since=since)
    return sum(1 for e in entries if e.get("fault") == "InvalidLogin")


async def methods_since(vcsim: VcsimControl, since: int) -> list[str]:
    entries = await vcsim.request_log(since=since)
    return [str(e.get("method") or f"{e['http_method']} {e['path']}") for e in entries]


async def events_about(world: World, reason: str) -> dict[str, int]:
    """Pool name -> count of `reason` events about it."""
    found: dict[str, int] = {}
    for event in await world.events(reason):
        name = event["involvedObject"]["name"]
        found[name] = found.get(name, 0) + int(event.get("count") or 1)
    return found


async def test_a_wrong_password_is_reported_on_exactly_its_pools_and_never_storms_vcenter(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_secret(name=BAD, password="not-the-password")
    await world.create_infra_env()
    mark = await vcsim_control.last_seq()
    await world.create_pool("good")
    for name in ("bad", "bad2"):  # two pools share the wrong Secret
        await world.create_pool(
            name,
            vsphere={"credentialsSecretRef": {"name": BAD}, "folder": f"{world.folder}/{name}"},
            iso={"pathPrefix": f"{world.prefix}/{name}"},
        )
    async with world.run():
        await world.condition(POOL, "good", "ISOReady", status="True", reason="ISOCached")
        for name in ("bad", "bad2"):
            pool = await world.condition(
                POOL, name, "VsphereReady", status="False", reason="LoginFailed"
            )
            message = condition(pool, "VsphereReady")["message"]
            assert "InvalidLogin" in message
            assert "next attempt is not before" in message
            assert "not-the-password" not in message
        warned = await eventually(
            lambda: _both(events_about(world, "LoginFailed")),
            what="LoginFailed events on both bad pools",
        )
        assert set(warned) == {"bad", "bad2"}
        # vCenter ends every session again and again, as in the issue (1,097 failed
        # logins in 20 s): the good pool's session logs in again with its own password,
        # the wrong one is not tried before its backoff ends.
        for _ in range(20):
            await vcsim_control.end_sessions()
            await world.service.vm_by_uuid(datacenter="dc1", bios_uuid="b" * 32)
            await asyncio.sleep(0.1)
        assert await failed_logins(vcsim_control, mark) == 1
        uploads = [
            m for m in await methods_since(vcsim_control, mark) if m.startswith("PUT /folder")
        ]
        assert len(uploads) == 1, "the good pool's ISO, nothing for the bad ones"
        assert f"{world.prefix}/bad" not in uploads[0]
        for name in ("bad", "bad2"):
            assert (await world.get(POOL, name) or {}).get("status", {}).get("iso", {}) == {}
        # A fixed Secret is a new credential: tried at once, not after the backoff.
        await world.kube.patch_merge(
            kinds.SECRET,
            namespace=world.namespace,
            name=BAD,
            patch={"stringData": {"password": world.vcsim.password}},
        )
        for name in ("bad", "bad2"):
            await world.condition(POOL, name, "VsphereReady", status="True")
    assert await failed_logins(vcsim_control, mark) == 1


async def _both(found: Any) -> dict[str, int] | None:
    counted: dict[str, int] = await found
    return counted if {"bad", "bad2"} <= set(counted) else None


async def test_a_password_rotated_to_a_wrong_one_stops_the_pool_without_borrowing_a_session(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    async with world.run():
        await world.condition(POOL, "pool", "ISOReady", status="True", reason="ISOCached")
        mark = await vcsim_control.last_seq()
        await world.kube.patch_merge(
            kinds.SECRET,
            namespace=world.namespace,
            name=SECRET,
            patch={"stringData": {"password": "rotated-but-wrong"}},
        )
        await world.condition(POOL, "pool", "VsphereReady", status="False", reason="LoginFailed")
        await world.create_vsphere_agent("agent-1")
        agent = await world.condition(
            kinds.VSPHERE_AGENT, "agent-1", "Ready", status="False", reason="VMCreateFailed"
        )
        assert "InvalidLogin" in condition(agent, "Ready")["message"]
        methods = await methods_since(vcsim_control, mark)
        # the session of the old password is still there (the test's own service uses
        # it), and nothing went through it for the pool
        assert "CreateVM_Task" not in methods
        assert await failed_logins(vcsim_control, mark) == 1
