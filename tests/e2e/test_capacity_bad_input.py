"""Bad input end to end: each mistake is named in a condition or event, vSphere is untouched.

Every case has demand (a NodePool scaled to 1) so that a careless operator would act;
the rule checked is that it reports the problem where a user looks (the pool's
conditions, Warning events) naming what is wrong, and sends vCenter nothing that
changes anything (vcsim's counters: no create, reconfigure, power, destroy, folder or
file operation, no upload). An invalid pool never gets that far: the API server
rejects it with the CRD generated from the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentforge.api import kinds
from agentforge.api.conditions import PoolConditionType, PoolReason
from agentforge.kube import errors
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from sim.world.snapshot import condition_of
from tests.e2e.support import OperatorHarness, consistently, eventually, vsphere_writes

POOL = "workers"
WITHIN = 60.0


def problem_reported(
    snap: Snapshot, pool: str, types: tuple[str, ...], reasons: tuple[str, ...], *words: str
) -> bool:
    """A False condition of one of `types` with one of `reasons`, or a Warning event on
    the pool, whose message names every word in `words` (case-insensitive)."""
    messages = [
        str(c.get("message", ""))
        for t in types
        if (c := condition_of(snap.pool(pool), t)) is not None
        and c.get("status") == "False"
        and c.get("reason") in reasons
    ]
    messages += [
        str(e.get("message", ""))
        for e in snap.events_about("VsphereAgentPool", pool)
        if e.get("type") == "Warning"
    ]
    return any(all(w.lower() in m.lower() for w in words) for m in messages)


async def expect_reported_and_nothing_done(
    world: World,
    vcsim_control: VcsimControl,
    *,
    types: tuple[str, ...],
    reasons: tuple[str, ...],
    words: tuple[str, ...],
    pool: str = POOL,
    allow: tuple[str, ...] = (),
) -> None:
    await eventually(
        world.snapshot,
        lambda s: problem_reported(s, pool, types, reasons, *words),
        within=WITHIN,
        what=f"pool {pool} reporting {'/'.join(reasons)} naming {words}",
    )

    async def writes() -> dict[str, int]:
        return {k: v for k, v in (await vsphere_writes(vcsim_control)).items() if k not in allow}

    await consistently(writes, lambda w: w == {}, duration=3, what="no change in vSphere")
    snap = await world.snapshot()
    assert snap.vms_of_pool(pool) == []
    (agent_machine,) = snap.agent_machines
    ready = condition_of(agent_machine, "Ready")
    assert ready is not None
    assert ready["reason"] == "NoSuitableAgents", "the AgentMachine still waits"


async def test_missing_infraenv_is_reported_and_nothing_is_created(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await world.create_credentials()
    await world.create_pool(POOL, infraenv="no-such-infraenv", folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await expect_reported_and_nothing_done(
        world,
        vcsim_control,
        types=(PoolConditionType.INFRA_ENV_AVAILABLE,),
        reasons=(PoolReason.INFRA_ENV_NOT_FOUND,),
        words=("no-such-infraenv",),
    )


async def test_empty_iso_url_is_reported_and_nothing_is_created(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await world.create_infraenv("discovery", manual_status={"isoDownloadURL": ""})
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await expect_reported_and_nothing_done(
        world,
        vcsim_control,
        types=(PoolConditionType.INFRA_ENV_AVAILABLE, PoolConditionType.ISO_READY),
        reasons=(
            PoolReason.INFRA_ENV_IMAGE_NOT_CREATED,
            PoolReason.WAITING_FOR_INFRA_ENV,
            PoolReason.ISO_CACHE_FAILED,
        ),
        words=("discovery",),
    )


async def test_iso_url_answering_404_is_reported_and_nothing_is_created(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await world.create_infraenv("discovery")
    world.iso_server.fail(world.namespace, "discovery", status=404)
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await expect_reported_and_nothing_done(
        world,
        vcsim_control,
        types=(PoolConditionType.ISO_READY,),
        reasons=(PoolReason.ISO_CACHE_FAILED,),
        words=("404",),
    )
    assert world.iso_server.stats(world.namespace, "discovery").bytes_served == 0


async def test_iso_url_answering_200_with_a_login_page_is_refused_and_nothing_is_created(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Session expired</body>"
    await world.create_infraenv("discovery")
    world.iso_server.answer_instead(world.namespace, "discovery", page)
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await expect_reported_and_nothing_done(
        world,
        vcsim_control,
        types=(PoolConditionType.ISO_READY,),
        reasons=(PoolReason.ISO_INVALID,),
        words=("Content-Type text/html", f"{len(page)} bytes", '"<!DOCTYPE html>'),
    )
    assert world.iso_server.stats(world.namespace, "discovery").bytes_served >= len(page)


async def test_secret_missing_a_key_is_reported_and_vsphere_is_not_touched(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await world.create_infraenv("discovery")
    await world.create_credentials("partial-credentials", omit=("password",))
    await world.create_pool(POOL, secret="partial-credentials", folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await expect_reported_and_nothing_done(
        world,
        vcsim_control,
        types=(PoolConditionType.VSPHERE_READY,),
        reasons=(PoolReason.CREDENTIALS_UNAVAILABLE,),
        words=("partial-credentials", "password"),
    )


async def test_agent_machine_matching_two_pools_is_an_error_not_a_guess(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await world.create_infraenv("discovery")
    await world.create_credentials()
    folder = f"e2e/{world.namespace}"
    await world.create_pool("first", nodepool=POOL, folder=folder)
    await world.create_pool("second", nodepool=POOL, folder=folder)
    await world.nodepool(POOL).scale(1)
    for pool, other in (("first", "second"), ("second", "first")):
        await expect_reported_and_nothing_done(
            world,
            vcsim_control,
            pool=pool,
            types=(PoolConditionType.AGENT_MACHINE_DEMAND_FOUND,),
            reasons=(PoolReason.AMBIGUOUS_POOL_MATCH,),
            words=(other,),
            # Caching the ISO does not depend on demand; creating a VM does.
            allow=(
                "MakeDirectory",
                "MoveDatastoreFile_Task",
                "DeleteDatastoreFile_Task",
                "PUT /folder",
            ),
        )
    assert (await world.snapshot()).vsphere_agents == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        for key in parents:
            spec = spec.setdefault(key, {})
        spec[leaf] = value

    return mutate


INVALID_SPECS: dict[str, Callable[[dict[str, Any]], None]] = {
    "numCPUs": _set("template.numCPUs", 0),
    "labels": _set("agent.labels", {}),
    "cleanupPolicy": _set("cleanupPolicy", "Sometimes"),
    "controlPlaneNamespace": _set("controlPlaneNamespace", "Not_A_Namespace"),
    "retainVersions": _set("iso.retainVersions", 0),
}


@pytest.mark.parametrize("field", sorted(INVALID_SPECS))
async def test_invalid_pool_spec_is_rejected_by_the_api_server(
    world: World, vcsim_control: VcsimControl, field: str
) -> None:
    manifest = world.pool_manifest(POOL)
    INVALID_SPECS[field](manifest["spec"])
    with pytest.raises(errors.Invalid) as rejected:
        await world.client.create(kinds.VSPHERE_AGENT_POOL, manifest)
    assert field in rejected.value.message
    assert (await world.snapshot()).pools == []
    assert await vsphere_writes(vcsim_control) == {}
