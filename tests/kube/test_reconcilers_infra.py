"""The infra controller against the real control plane and vcsim: VsphereReady and the ISO cache."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

import pytest

from agentforge import redaction, vsphere
from agentforge.api import kinds, names
from agentforge.kube import errors as kerrors
from sim.actors.waiting import eventually
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import MUTATING, World, reconcile_count

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL


async def ready_pool(world: World, **spec: Any) -> dict[str, Any]:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(**spec)
    return await world.condition(POOL, "pool", "ISOReady", status="True", reason="ISOCached")


async def force_refresh(world: World, token: str) -> None:
    await world.kube.patch_merge(
        POOL,
        namespace=world.namespace,
        name="pool",
        patch={"metadata": {"annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: token}}},
    )


async def iso_token_processed(world: World, token: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pool = await world.get(POOL, "pool")
        iso = ((pool or {}).get("status") or {}).get("iso") or {}
        return pool if iso.get("forceRefreshToken") == token else None

    return await eventually(check, what=f"force-refresh token {token} processed")


def methods(counters: dict[str, Any], *wanted: str) -> dict[str, int]:
    found = counters.get("methods", {})
    return {m: found[m] for m in wanted if found.get(m)}


async def test_the_iso_is_uploaded_content_addressed_and_vsphere_ready_is_reported(
    world: World,
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world)
    iso = pool["status"]["iso"]
    expected = f"{world.prefix}/{world.iso.sha256}.iso"
    assert iso["path"] == expected
    assert iso["sha256"] == world.iso.sha256
    assert iso["sizeBytes"] == len(world.iso.body)
    assert iso["url"].endswith("/images/discovery.iso?api_key=[REDACTED]")
    assert "it-secret" not in str(pool["status"])
    assert iso["validators"]["etag"] == world.iso.etag
    assert [h["path"] for h in iso["history"]] == [expected]
    assert await world.iso_files() == [expected]
    ready = {c["type"]: c for c in pool["status"]["conditions"]}["VsphereReady"]
    assert (ready["status"], ready["reason"]) == ("True", "VsphereConnected")
    assert world.vcsim.password not in str(pool)


async def test_an_unchanged_iso_is_rechecked_at_the_interval_without_downloading(
    world: World,
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world, iso={"checkInterval": "1s"})
        first_check = pool["status"]["iso"]["checkedAt"]
        served = world.iso.served

        async def rechecked() -> bool:
            fresh = await world.get(POOL, "pool")
            return bool(fresh and fresh["status"]["iso"]["checkedAt"] > first_check)

        await eventually(rechecked, what="a re-check after checkInterval", within=15)
    assert world.iso.served == served  # 304: zero bytes
    assert await world.iso_files() == [f"{world.prefix}/{world.iso.sha256}.iso"]


async def test_a_changed_iso_gets_a_new_file_and_the_old_is_pruned_only_once_unused(
    world: World,
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world, iso={"retainVersions": 1})
        old_path = pool["status"]["iso"]["path"]
        # A VM in the pool's folder holds the old ISO (as one created for the pool would).
        holder = await world.tasks.create(
            world.service,
            vsphere.VmRequest(
                name="holder",
                placement=world.placement,
                hardware=vsphere.Hardware(cpus=1, memory_mib=512, disk_gib=1),
                iso_file=f"[iso-ds] {old_path}",
                markers=vsphere.OwnershipMarkers(
                    pool_namespace=world.namespace,
                    pool_name="pool",
                    pool_uid=pool["metadata"]["uid"],
                    vsphere_agent="someone",
                ),
                power_on=False,
            ),
        )
        world.iso.change()
        await force_refresh(world, "t1")
        pool = await iso_token_processed(world, "t1")
        new_path = pool["status"]["iso"]["path"]
        assert new_path == f"{world.prefix}/{world.iso.sha256}.iso" != old_path
        assert await world.iso_files() == sorted([old_path, new_path])  # old one is attached
        assert [h["path"] for h in pool["status"]["iso"]["history"]] == [new_path, old_path]

        assert holder.bios_uuid is not None
        await world.tasks.delete(
            world.service,
            datacenter="dc1",
            bios_uuid=holder.bios_uuid,
            markers=vsphere.OwnershipMarkers(
                pool_namespace=world.namespace,
                pool_name="pool",
                pool_uid=pool["metadata"]["uid"],
                vsphere_agent="someone",
            ),
        )
        await force_refresh(world, "t2")
        pool = await iso_token_processed(world, "t2")
    assert await world.iso_files() == [new_path]
    assert [h["path"] for h in pool["status"]["iso"]["history"]] == [new_path]
    assert await world.events("ISOPruned")


async def test_a_file_attached_to_a_known_vm_outside_the_folder_is_never_pruned(
    world: World,
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world, iso={"retainVersions": 1})
        old_path = pool["status"]["iso"]["path"]
        elsewhere = await world.tasks.create(
            world.service,
            vsphere.VmRequest(
                name="moved",
                placement=dataclasses.replace(
                    world.placement, folder=f"af-it-moved/{world.namespace}"
                ),
                hardware=vsphere.Hardware(cpus=1, memory_mib=512, disk_gib=1),
                iso_file=f"[iso-ds] {old_path}",
                markers=vsphere.OwnershipMarkers(
                    pool_namespace=world.namespace,
                    pool_name="pool",
                    pool_uid=pool["metadata"]["uid"],
                    vsphere_agent="moved",
                ),
                power_on=False,
            ),
        )
        # A VsphereAgent of the pool recorded that VM (e.g. it was moved by an admin).
        await world.create_vsphere_agent("moved")

        def record(obj: dict[str, Any]) -> dict[str, Any]:
            obj.setdefault("status", {})["vm"] = {
                "name": elsewhere.name,
                "biosUUID": elsewhere.bios_uuid,
            }
            return obj

        await world.kube.update_status(
            kinds.VSPHERE_AGENT, namespace=world.namespace, name="moved", mutate=record
        )
        await eventually(
            _cached_uuid(world, "moved", elsewhere.bios_uuid),
            what="the informer to see the recorded VM",
        )
        world.iso.change()
        await force_refresh(world, "t1")
        pool = await iso_token_processed(world, "t1")
    assert old_path in await world.iso_files()
    assert old_path in [h["path"] for h in pool["status"]["iso"]["history"]]


async def test_a_restarted_operator_removes_uploads_a_killed_one_left_and_only_those(
    world: World, vcsim_control: VcsimControl
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world)
    cached = pool["status"]["iso"]["path"]
    # What a SIGKILL mid-upload leaves (two hours old), a running upload of another
    # replica (fresh), and the same stale name in a folder that is not the pool's.
    names = [f".upload-{os.urandom(16).hex()}.iso" for _ in range(3)]
    stale, fresh = (f"{world.prefix}/{n}" for n in names[:2])
    outside = f"{world.prefix}-other/{names[2]}"
    assert world.vcsim.workdir is not None
    root = world.vcsim.workdir / "datastores" / "dc1" / world.iso_location.datastore
    two_hours_ago = time.time() - 2 * 3600
    for path, mtime in ((stale, two_hours_ago), (fresh, None), (outside, two_hours_ago)):
        on_disk = root / path
        await asyncio.to_thread(on_disk.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(on_disk.write_bytes, b"partial")
        if mtime is not None:
            await asyncio.to_thread(os.utime, on_disk, (mtime, mtime))
    async with world.run(vm_controller=False):  # the restarted operator
        await force_refresh(world, "t1")  # an unchanged image: nothing else to prune
        await iso_token_processed(world, "t1")
        assert await world.iso_files() == sorted([cached, fresh])
        assert (root / outside).exists()
        events = await world.events("ISOPruned")
        assert any(stale in e.get("message", "") for e in events)
        # Swept once: the next check within the stale age lists nothing.
        await vcsim_control.reset_counters()
        await force_refresh(world, "t2")
        await iso_token_processed(world, "t2")
        counted = await vcsim_control.counters()
    assert methods(counted, "SearchDatastoreSubFolders_Task") == {}


def _cached_uuid(world: World, name: str, uuid: str | None) -> Any:
    async def check() -> bool:
        cached = world.informers[kinds.VSPHERE_AGENT].get(namespace=world.namespace, name=name)
        return bool(
            cached and ((cached.get("status") or {}).get("vm") or {}).get("biosUUID") == uuid
        )

    return check


async def test_steady_state_costs_no_vsphere_call_until_the_generation_changes(
    world: World, vcsim_control: VcsimControl
) -> None:
    async with world.run(vm_controller=False) as (infra_ctrl,):
        await ready_pool(world)
        await vcsim_control.reset_counters()
        before = reconcile_count(infra_ctrl)
        for _ in range(3):
            infra_ctrl.enqueue(f"{world.namespace}/pool")  # type: ignore[arg-type]
        await world.kube.patch_merge(
            POOL, namespace=world.namespace, name="pool", patch={"metadata": {"labels": {"x": "1"}}}
        )
        # The label change is in the cache and every reconcile it and the enqueues
        # caused has finished.
        await world.settled(POOL, "pool", infra_ctrl)
        assert reconcile_count(infra_ctrl) > before
        quiet = await vcsim_control.counters()
        assert quiet.get("methods", {}) == {}
        assert quiet.get("http", {}) == {}
        await world.kube.patch_merge(
            POOL,
            namespace=world.namespace,
            name="pool",
            patch={"spec": {"template": {"numCPUs": 3}}},
        )

        async def preflight_ran() -> bool:
            counted = await vcsim_control.counters()
            return bool(counted.get("methods", {}))

        await eventually(preflight_ran, what="a preflight after the generation changed")
    counted = await vcsim_control.counters()
    assert methods(counted, *MUTATING) == {}


# --- bad input: a condition, a Warning event, nothing changed in vSphere -------------------


async def assert_nothing_changed(vcsim_control: VcsimControl) -> None:
    counted = await vcsim_control.counters()
    assert methods(counted, *MUTATING) == {}
    assert not any(k.startswith("PUT") for k in counted.get("http", {}))


async def test_a_status_an_older_version_wrote_is_rewritten_without_a_download(
    world: World,
) -> None:
    async with world.run(vm_controller=False):
        pool = await ready_pool(world)
    iso = pool["status"]["iso"]
    shown, digest = iso["url"], iso["urlHash"]
    assert shown == redaction.redact_url(world.iso.url)
    for legacy in (
        {"url": world.iso.url, "urlHash": None},  # the whole URL, no digest
        {"url": world.iso.url.split("?")[0]},  # an earlier agent-forge: query dropped
    ):
        await world.kube.patch_status(
            POOL, namespace=world.namespace, name="pool", patch={"status": {"iso": legacy}}
        )
        # The informers outlive `world.run`; a new process would list the patched status.
        await world.caught_up(POOL, "pool")
        requests = world.iso.requests
        async with world.run(vm_controller=False):  # the new version starts

            async def rewritten() -> dict[str, Any] | None:
                pool = await world.get(POOL, "pool")
                found = ((pool or {}).get("status") or {}).get("iso") or {}
                return (
                    found if (found.get("url"), found.get("urlHash")) == (shown, digest) else None
                )

            after = await eventually(rewritten, what="status.iso rewritten to the shown URL")
        assert world.iso.requests == requests, "no request to the image service"
        assert {k: v for k, v in after.items() if k not in ("url", "urlHash")} == {
            k: v for k, v in iso.items() if k not in ("url", "urlHash")
        }, "nothing else changed: same file, same check time"
        assert "it-secret" not in str(after)


async def test_a_missing_infra_env_is_reported_and_nothing_is_done(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_pool()
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "ISOReady", status="False", reason="WaitingForInfraEnv"
        )
        await eventually(lambda: world.events("InfraEnvNotFound"), what="a Warning event")
    message = {c["type"]: c for c in pool["status"]["conditions"]}["ISOReady"]["message"]
    assert f"InfraEnv {world.namespace}/infra not found" in message
    assert "spec.infraEnvRef.name" in message
    assert not (pool["status"].get("iso") or {}).get("path")
    await assert_nothing_changed(vcsim_control)


async def test_an_infra_env_without_iso_url_is_reported_and_nothing_is_done(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_infra_env(url="")
    await world.create_pool()
    async with world.run(vm_controller=False):
        await world.condition(POOL, "pool", "ISOReady", status="False", reason="WaitingForInfraEnv")
        events = await eventually(lambda: world.events("ISOURLMissing"), what="a Warning event")
    assert events[0]["type"] == "Warning"
    assert "status.isoDownloadURL" in events[0]["message"]
    await assert_nothing_changed(vcsim_control)


async def test_an_iso_url_answering_404_is_reported_and_nothing_is_done(
    world: World, vcsim_control: VcsimControl
) -> None:
    world.iso.status = 404
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool()
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "ISOReady", status="False", reason="ISOCacheFailed"
        )
        events = await eventually(lambda: world.events("ISOCacheFailed"), what="a Warning event")
    message = {c["type"]: c for c in pool["status"]["conditions"]}["ISOReady"]["message"]
    assert "HTTP 404" in message
    assert f"InfraEnv {world.namespace}/infra" in message
    assert "it-secret" not in message + events[0]["message"]
    await assert_nothing_changed(vcsim_control)
    assert await world.iso_files() == []


async def test_a_secret_missing_a_key_is_reported_and_vsphere_is_not_called(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret(password=None)
    await world.create_infra_env()
    await world.create_pool()
    await vcsim_control.reset_counters()
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "VsphereReady", status="False", reason="CredentialsUnavailable"
        )
        events = await eventually(
            lambda: world.events("CredentialsUnavailable"), what="a Warning event"
        )
        message = {c["type"]: c for c in pool["status"]["conditions"]}["VsphereReady"]["message"]
        assert f"Secret {world.namespace}/vc-creds has no key 'password'" in message
        assert events[0]["type"] == "Warning"
        counted = await vcsim_control.counters()
        assert counted.get("methods", {}) == {}
        assert counted.get("logins", 0) == 0
        # Fixing the Secret is noticed by its periodic re-read (every second in this world).
        await world.kube.patch_merge(
            kinds.SECRET,
            namespace=world.namespace,
            name="vc-creds",
            patch={"stringData": {"password": world.vcsim.password}},
        )
        await world.condition(POOL, "pool", "VsphereReady", status="True")
        await world.condition(POOL, "pool", "ISOReady", status="True")


async def test_wrong_placement_names_every_problem_and_changes_nothing(
    world: World, vcsim_control: VcsimControl
) -> None:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(vsphere={"network": "no-such-net", "datastoreCluster": "no-dsc"})
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "VsphereReady", status="False", reason="VsphereUnavailable"
        )
    message = {c["type"]: c for c in pool["status"]["conditions"]}["VsphereReady"]["message"]
    assert "no-such-net" in message
    assert "no-dsc" in message
    await assert_nothing_changed(vcsim_control)


async def test_an_unusable_failure_domain_is_named_and_the_others_stay_ready(
    world: World,
) -> None:
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(
        vsphere={
            "spreadPolicy": "Spread",
            "failureDomains": [
                {"name": "zone-a", "computeCluster": "cluster", "datastoreCluster": "dsc1"},
                {"name": "zone-gone", "computeCluster": "gone", "datastore": "ds1"},
            ],
        }
    )
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "VsphereReady", status="True", reason="FailureDomainUnusable"
        )
        await world.condition(POOL, "pool", "ISOReady", status="True", reason="ISOCached")
    message = {c["type"]: c for c in pool["status"]["conditions"]}["VsphereReady"]["message"]
    assert message.startswith("new VMs go to zone-a only; skipped: failure domain zone-gone")
    assert "resource pool gone/Resources" in message


async def test_spread_without_failure_domains_is_refused_by_the_api_server(world: World) -> None:
    with pytest.raises(kerrors.Invalid, match="spreadPolicy Spread needs at least one entry"):
        await world.create_pool(vsphere={"spreadPolicy": "Spread"})
