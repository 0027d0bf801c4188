"""A refused ISO is not fetched again and again: against the real control plane, vcsim
and a local image server that counts its GETs.

Two pools cache the image of one InfraEnv. The image service answers 40 KB that are
no image (refused at its head), a chunked body cut short of its volume (refused at its
end) or a body whose connection breaks mid-stream. The infra controller's clock is
the test's (`Deps.now`), so the back-off is stepped through without waiting for it:
one GET for both pools, none on any reconcile before the next try (30 s later), one
at it; the conditions say when the next try is, without the URL's key; a new
force-iso-refresh token tries at once. Nothing is left on the datastore.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentforge.api import fields, kinds, names
from agentforge.kube.controller import Controller
from sim.actors.iso9660 import build_iso
from sim.actors.waiting import eventually
from tests.kube.reconcilers_world import World, discovery_image

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL
PAGE = b"<!DOCTYPE html><html><body>Your session expired. Sign in again.</body></html>\n"


class Clock:
    """The infra controller's `now`, moved by the test alone."""

    def __init__(self) -> None:
        self.moment = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


def serve(world: World, shape: str) -> str:
    """Make the image service misbehave as `shape` says; the ISOReady reason it earns."""
    if shape == "non-image":
        world.iso.answer(PAGE.ljust(40 * 1024, b" "), content_type="text/html")
        return "ISOInvalid"
    if shape == "truncated":
        whole = build_iso(volume_id="CUT", size=4 * 1024 * 1024)
        world.iso.answer(
            whole[: 2 * 1024 * 1024], content_type="application/octet-stream", chunked=True
        )
        return "ISOInvalid"
    world.iso.answer(discovery_image(), content_type="application/octet-stream")
    world.iso.break_after = 512 * 1024
    return "ISOCacheFailed"


def iso_ready(obj: dict[str, Any] | None) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    found: dict[str, Any] = {c["type"]: c for c in conditions}["ISOReady"]
    return found


async def again(world: World, controller: Controller, *pools: str) -> None:
    for pool in pools:
        await world.reconciled(controller, f"{world.namespace}/{pool}")


@pytest.mark.parametrize("shape", ["non-image", "truncated", "cut"])
async def test_a_refused_image_is_fetched_once_per_try_for_every_pool_of_its_infra_env(
    world: World, shape: str
) -> None:
    reason = serve(world, shape)
    clock = Clock()
    start = clock()
    world.deps = dataclasses.replace(world.deps, now=clock)
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool("pool")
    await world.create_pool("pool2")
    async with world.run(vm_controller=False) as (infra,):
        for pool in ("pool", "pool2"):
            await world.condition(POOL, pool, "ISOReady", status="False", reason=reason)
            await world.settled(POOL, pool, infra)
        assert world.iso.requests == 1, "one GET for both pools"
        next_try = fields.format_time(start + timedelta(seconds=30))
        for pool in ("pool", "pool2"):
            message = iso_ready(await world.get(POOL, pool))["message"]
            assert f"the next try of this URL is at {next_try}, after 1 refused in a row" in (
                message
            )
            assert "[REDACTED]" in message
            assert "it-secret" not in message

        await again(world, infra, "pool", "pool2", "pool", "pool2")
        clock.advance(29)
        await again(world, infra, "pool", "pool2")
        assert world.iso.requests == 1, "no GET before the next try, whoever reconciles"

        clock.advance(1)
        await again(world, infra, "pool", "pool2")
        assert world.iso.requests == 2, "one GET at the next try, for both pools"
        clock.advance(5)
        await again(world, infra, "pool2", "pool")
        assert world.iso.requests == 2, "35 s in: two GETs"
        later = fields.format_time(start + timedelta(seconds=30 + 60))
        for pool in ("pool", "pool2"):
            message = iso_ready(await world.get(POOL, pool))["message"]
            assert f"the next try of this URL is at {later}, after 2 refused in a row" in message

        await world.kube.patch_merge(
            POOL,
            namespace=world.namespace,
            name="pool",
            patch={"metadata": {"annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: "now"}}},
        )
        await eventually(lambda: _at_least(world, 3), what="the forced try")
        await world.settled(POOL, "pool", infra)
        await again(world, infra, "pool2", "pool")
        assert world.iso.requests == 3, "a new token tries once, at once; the others wait"

        warned = [
            e
            for e in await world.events(reason)
            if e["involvedObject"]["name"] == "pool2" and e["type"] == "Warning"
        ]
        assert warned, "the pool that never fetched is told too"
        assert all("it-secret" not in e["message"] for e in warned)
    assert await world.iso_files() == [], "nothing uploaded, or nothing left of it"


async def _at_least(world: World, requests: int) -> bool:
    return world.iso.requests >= requests
