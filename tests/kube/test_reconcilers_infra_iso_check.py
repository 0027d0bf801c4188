"""The infra controller refuses what is no boot image: the image service answers 200, but
with an HTML page, a JSON error, an archive, a tiny or truncated body, or an ISO that
cannot boot. Against the real control plane and vcsim: ISOReady=False/ISOInvalid with
a message saying what came back, a Warning event, nothing uploaded (no file, no PUT,
no folder made), no VM created, and the ISO cached before still used for new VMs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zipfile
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.vsphere.iso import datastore_files as datastore
from sim.actors.iso9660 import build_iso
from sim.actors.waiting import eventually
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import MUTATING, World, discovery_image

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL
VA = kinds.VSPHERE_AGENT

LOGIN_PAGE = (
    b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Your session expired. "
    b"<a href='/login?token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl'>Sign in</a>"
    b"</body></html>\n"
)


def zipped(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("discovery.iso", data)
    return out.getvalue()


# name -> (body, content type, shape, words the message must hold)
SHAPES: dict[str, tuple[bytes, str, dict[str, Any], tuple[str, ...]]] = {
    "html": (
        LOGIN_PAGE,
        "text/html; charset=utf-8",
        {},
        (
            "Content-Type text/html; charset=utf-8",
            f"{len(LOGIN_PAGE)} bytes",
            'starting "<!DOCTYPE html><html><head><title>Sign in</title>',
        ),
    ),
    "json-error": (
        json.dumps({"code": 401, "message": "image token expired"}).encode(),
        "application/json",
        {},
        ('starting "{"code": 401, "message": "image token expired"}"',),
    ),
    "tiny": (b"OK\n", "text/plain", {}, ("3 bytes", 'starting "OK"')),
    "zip": (zipped(discovery_image()), "application/zip", {}, ("(a zip archive)",)),
    "gzip": (
        gzip.compress(discovery_image()),
        "application/octet-stream",
        {"encoding": "gzip"},
        ("Content-Encoding gzip", "(a gzip stream)"),
    ),
    "not-bootable": (
        build_iso(volume_id="PLAIN", size=2 * 1024 * 1024, bootable=False),
        "application/x-iso9660-image",
        {},
        ("has no El Torito boot record",),
    ),
}


async def iso_ready(world: World, *, status: str, reason: str) -> dict[str, Any]:
    return await world.condition(POOL, "pool", "ISOReady", status=status, reason=reason)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = {
        c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []
    }[type_]
    return found


async def all_files(world: World) -> list[str]:
    files = await world.service.list_files(
        where=world.iso_location, prefix=world.prefix, pattern="*"
    )
    return sorted(f.path for f in files)


async def nothing_uploaded(world: World, vcsim_control: VcsimControl) -> None:
    counted = await vcsim_control.counters()
    mutating = {m: n for m, n in counted.get("methods", {}).items() if m in MUTATING}
    assert mutating == {}, "no folder made, no VM created"
    assert not any(k.startswith("PUT") for k in counted.get("http", {})), "no upload"
    assert await all_files(world) == []


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_200_that_is_no_boot_image_uploads_nothing_and_creates_no_vm(
    world: World, vcsim_control: VcsimControl, shape: str
) -> None:
    body, content_type, extra, words = SHAPES[shape]
    world.iso.answer(body, content_type=content_type, **extra)
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    await world.create_vsphere_agent("va1")
    async with world.run():
        pool = await iso_ready(world, status="False", reason="ISOInvalid")
        events = await eventually(lambda: world.events("ISOInvalid"), what="a Warning event")
        va = await world.condition(VA, "va1", "Ready", status="False", reason="WaitingForISO")
    message = condition(pool, "ISOReady")["message"]
    assert f"InfraEnv {world.namespace}/infra was not cached" in message
    assert "[REDACTED]" in message
    assert "it-secret" not in message
    assert "did not serve a bootable ISO image" in message
    assert "nothing was uploaded" in message
    assert "no ISO is cached yet, so no VM is created" in message
    for word in words:
        assert word in message, word
    assert "eyJ" not in message, "a token on the page is redacted"
    assert events[0]["type"] == "Warning"
    assert "it-secret" not in events[0]["message"]
    assert not (pool["status"].get("iso") or {}).get("path")
    assert "ISOReady" in condition(va, "Ready")["message"]
    await nothing_uploaded(world, vcsim_control)


async def test_a_chunked_body_cut_short_of_its_volume_is_discarded_after_streaming(
    world: World,
) -> None:
    whole = build_iso(volume_id="CUT", size=4 * 1024 * 1024)
    world.iso.answer(
        whole[: 2 * 1024 * 1024], content_type="application/octet-stream", chunked=True
    )
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    async with world.run(vm_controller=False):
        pool = await iso_ready(world, status="False", reason="ISOInvalid")
    message = condition(pool, "ISOReady")["message"]
    assert "the image is truncated" in message
    assert "its upload was discarded" in message
    assert await all_files(world) == [], "the temporary upload is gone too"


async def test_the_iso_cached_before_stays_in_use_for_new_vms(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    async with world.run():
        pool = await iso_ready(world, status="True", reason="ISOCached")
        good = pool["status"]["iso"]
        world.iso.answer(LOGIN_PAGE, content_type="text/html")
        await world.kube.patch_merge(
            POOL,
            namespace=world.namespace,
            name="pool",
            patch={"metadata": {"annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: "t1"}}},
        )
        pool = await iso_ready(world, status="False", reason="ISOInvalid")
        await vcsim_control.reset_counters()
        await world.create_vsphere_agent("va1")
        await world.condition(VA, "va1", "Ready", status="True", reason="VMReady")
        pool = await world.get(POOL, "pool") or {}
    assert pool["status"]["iso"]["path"] == good["path"]
    assert pool["status"]["iso"]["sha256"] == good["sha256"]
    message = condition(pool, "ISOReady")["message"]
    assert f"new VMs keep booting the ISO cached before, [iso-ds] {good['path']}" in message
    (vm,) = await world.vms()
    assert [c.backing_file for c in vm.cdroms] == [f"[iso-ds] {good['path']}"]
    assert await all_files(world) == [good["path"]]
    counted = await vcsim_control.counters()
    assert not any(k.startswith("PUT") for k in counted.get("http", {})), "no upload"


async def test_a_page_cached_before_images_were_checked_is_no_longer_used(
    world: World, vcsim_control: VcsimControl
) -> None:
    """What an older agent-forge left: the login page itself cached as `<sha256>.iso`."""
    world.iso.answer(LOGIN_PAGE, content_type="text/html")
    digest = hashlib.sha256(LOGIN_PAGE).hexdigest()
    path = f"{world.prefix}/{digest}.iso"
    session = await world.service.session()
    await datastore.mkdir(session, where=world.iso_location, path=world.prefix)

    async def body() -> Any:
        yield LOGIN_PAGE

    await datastore.upload(
        session, where=world.iso_location, path=path, body=body(), size=len(LOGIN_PAGE)
    )
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    await world.kube.patch_status(
        POOL,
        namespace=world.namespace,
        name="pool",
        patch={
            "status": {
                "iso": {
                    "url": world.iso.url,
                    "path": path,
                    "sha256": digest,
                    "sizeBytes": len(LOGIN_PAGE),
                    "checkedAt": "2020-01-01T00:00:00Z",
                    "validators": {"etag": world.iso.etag},
                    "history": [{"path": path, "sha256": digest, "sizeBytes": len(LOGIN_PAGE)}],
                }
            }
        },
    )
    await vcsim_control.reset_counters()
    async with world.run(vm_controller=False):
        pool = await iso_ready(world, status="False", reason="ISOInvalid")

        async def dropped() -> dict[str, Any] | None:
            found = await world.get(POOL, "pool") or {}
            return None if found["status"]["iso"].get("path") else found

        pool = await eventually(dropped, what="status.iso.path dropped")
    assert world.iso.served >= len(LOGIN_PAGE), "downloaded again, not reused"
    message = condition(pool, "ISOReady")["message"]
    assert f"{len(LOGIN_PAGE)} bytes, cached before agent-forge checked images" in message
    assert "no VM is created until the URL serves a bootable image" in message
    await world.create_vsphere_agent("va1")
    async with world.run():
        await world.condition(VA, "va1", "Ready", status="False", reason="WaitingForISO")
    counted = await vcsim_control.counters()
    assert counted.get("methods", {}).get("CreateVM_Task", 0) == 0
    assert not any(k.startswith("PUT") for k in counted.get("http", {})), "no upload"
    assert await all_files(world) == [path], "nothing deleted, nothing uploaded"
