"""The discovery ISO cache end to end: revalidation, a content change, pruning.

The pool re-checks every 2 s and keeps one version (`retainVersions: 1`). A new
image behind the same URL must be picked up (new content-addressed file, used by
VMs created afterwards), the unchanged image must cost no bytes on re-checks
(conditional GET), and the old file must stay while a VM still boots from it and
be pruned on a later refresh once no VM uses it.
"""

from __future__ import annotations

import asyncio

from sim.vcsim import Vcsim
from sim.world import Snapshot, World
from tests.e2e.support import OperatorHarness, eventually, wait_converged

POOL = "workers"
INFRAENV = "discovery"


async def iso_files(vcsim: Vcsim, folder: str) -> set[str]:
    """The files in a folder of the ISO datastore, as govc lists them."""
    listing = await asyncio.to_thread(vcsim.govc, "datastore.ls", "-ds", "iso-ds", folder)
    return {line.strip() for line in listing.splitlines() if line.strip()}


def iso_status(snap: Snapshot) -> dict[str, object]:
    return dict(snap.pool_status(POOL).get("iso") or {})


async def rechecked(world: World, *, after: str | None, times: int = 1) -> Snapshot:
    """Wait until `status.iso.checkedAt` moved on from `after`, `times` times over."""
    snap = await world.snapshot()
    for _ in range(times):
        previous = after

        def moved_on(s: Snapshot, previous: str | None = previous) -> bool:
            return iso_status(s).get("checkedAt") not in (None, previous)

        snap = await eventually(
            world.snapshot, moved_on, within=60, what=f"an ISO re-check after {previous}"
        )
        after = str(iso_status(snap).get("checkedAt"))
    return snap


async def test_iso_change_is_used_by_new_vms_and_old_file_pruned_once_unused(
    world: World, operator: OperatorHarness, vcsim: Vcsim
) -> None:
    await world.create_infraenv(INFRAENV)
    await world.create_credentials()
    await world.create_pool(
        POOL, folder=f"e2e/{world.namespace}", retain_versions=1, check_interval="2s"
    )
    nodepool = world.nodepool(POOL)
    first = world.iso_server.image(world.namespace, INFRAENV)
    assert first is not None

    await nodepool.scale(1)
    snap = await wait_converged(world, pool=POOL, nodepool=POOL, replicas=1)
    (old_vm,) = snap.vms_of_pool(POOL)
    assert old_vm.iso_digests == (first.sha256,)
    status = iso_status(snap)
    assert status["sha256"] == first.sha256
    folder = str(status["path"]).split("] ", 1)[-1].rsplit("/", 1)[0]  # "[iso-ds] a/b" or "a/b"

    # Unchanged content: re-checks are conditional and download nothing.
    served = world.iso_server.stats(world.namespace, INFRAENV).bytes_served
    assert served >= first.size
    await rechecked(world, after=str(status.get("checkedAt")), times=2)
    assert world.iso_server.stats(world.namespace, INFRAENV).bytes_served == served

    # New content behind the same URL.
    second = await world.infraenvs.change_image(INFRAENV)
    snap = await eventually(
        world.snapshot,
        lambda s: iso_status(s).get("sha256") == second.sha256,
        within=60,
        what="the pool caching the new image",
    )
    assert world.iso_server.stats(world.namespace, INFRAENV).bytes_served == served + second.size
    await nodepool.scale(2)
    snap = await wait_converged(world, pool=POOL, nodepool=POOL, replicas=2)
    (new_vm,) = [vm for vm in snap.vms_of_pool(POOL) if vm.name != old_vm.name]
    assert new_vm.iso_digests == (second.sha256,)
    assert snap.vm(old_vm.name) is not None
    assert snap.vm(old_vm.name).iso_digests == (first.sha256,)  # type: ignore[union-attr]

    # The old file is beyond retention but in use: a refresh must keep it.
    await rechecked(world, after=str(iso_status(snap).get("checkedAt")), times=2)
    assert {first.file_name, second.file_name} <= await iso_files(vcsim, folder)

    # Once no VM uses it, a later refresh prunes it; the current one stays.
    await nodepool.scale(0)
    await wait_converged(world, pool=POOL, nodepool=POOL, replicas=0)
    files = await eventually(
        lambda: iso_files(vcsim, folder),
        lambda names: first.file_name not in names,
        within=60,
        what=f"{first.file_name} pruned from iso-ds",
    )
    assert second.file_name in files
