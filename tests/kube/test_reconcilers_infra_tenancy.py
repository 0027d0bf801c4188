"""The namespace boundary of credentials, with the infra and vm controllers, the real
control plane and vcsim: a pool cannot borrow another namespace's Secret, and its
status cannot tell whether that Secret exists.

The test's namespace plays the tenant ("tenant-b"); two more namespaces play other
owners: one holds a valid credentials Secret that is not shared, one holds none.
Both of the tenant's pools are refused with `CredentialsNotShared` in the same words
(the namespace they named aside) and nothing happens in vSphere: no login, no ISO
upload, no VM. Then the owner lists the tenant's namespace in the Secret's
allowed-namespaces annotation and the pool that names it becomes ready.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from sim.controlplane.controlplane import ControlPlane
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_world import MUTATING, SECRET, World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL
SAME = "<other namespace>"


def vsphere_ready(pool: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in pool["status"]["conditions"]}["VsphereReady"]  # type: ignore[no-any-return]


async def test_another_namespaces_secret_is_refused_alike_until_its_owner_shares_it(
    world: World, controlplane: ControlPlane, vcsim_control: VcsimControl
) -> None:
    owner = controlplane.create_namespace(f"{world.namespace[:50]}-owner")
    empty = controlplane.create_namespace(f"{world.namespace[:50]}-empty")
    await world.create_secret(namespace=owner)  # valid credentials, not shared
    await world.create_infra_env()
    ref = {"name": SECRET}
    await world.create_pool(
        "borrower", vsphere={"credentialsSecretRef": {**ref, "namespace": owner}}
    )
    await world.create_pool("stray", vsphere={"credentialsSecretRef": {**ref, "namespace": empty}})
    await world.create_vsphere_agent("borrower-vm", pool="borrower")
    await vcsim_control.reset_counters()
    async with world.run():
        borrower = await world.condition(
            POOL, "borrower", "VsphereReady", status="False", reason="CredentialsNotShared"
        )
        stray = await world.condition(
            POOL, "stray", "VsphereReady", status="False", reason="CredentialsNotShared"
        )
        events = await eventually(
            lambda: _events_of(world, "CredentialsNotShared", {"borrower", "stray"}),
            what="an event per pool",
        )
        counted = await vcsim_control.counters()
        assert counted.get("logins", 0) == 0
        assert {m: n for m, n in counted.get("methods", {}).items() if m in MUTATING} == {}
        assert not any(k.startswith("PUT") for k in counted.get("http", {}))
        assert await world.iso_files() == []
        assert not (borrower["status"].get("iso") or {}).get("path")

        # One text, whether the Secret exists (valid, unshared) or not at all.
        said = vsphere_ready(borrower)["message"].replace(owner, SAME)
        assert said == vsphere_ready(stray)["message"].replace(empty, SAME)
        assert events["borrower"].replace(owner, SAME) == events["stray"].replace(empty, SAME)
        assert events["borrower"] == vsphere_ready(borrower)["message"]
        assert names.ANNOTATION_ALLOWED_NAMESPACES in said
        assert world.namespace in said
        for word in ("not found", "forbidden", "password", "key '", world.vcsim.server):
            assert word not in said
        agent = await world.get(kinds.VSPHERE_AGENT, "borrower-vm")
        assert not ((agent or {}).get("status") or {}).get("vm", {}).get("biosUUID")

        # The owner shares it: the pool that named it is accepted, the other is not.
        await world.kube.patch_merge(
            kinds.SECRET,
            namespace=owner,
            name=SECRET,
            patch={
                "metadata": {
                    "annotations": {
                        names.ANNOTATION_ALLOWED_NAMESPACES: f"someone-else, {world.namespace}"
                    }
                }
            },
        )
        await world.condition(POOL, "borrower", "VsphereReady", status="True")
        accepted = await world.condition(POOL, "borrower", "ISOReady", status="True")
        stray = await world.condition(
            POOL, "stray", "VsphereReady", status="False", reason="CredentialsNotShared"
        )
    assert accepted["status"]["iso"]["path"] in await world.iso_files()
    assert vsphere_ready(stray)["message"].replace(empty, SAME) == said


async def test_once_shared_a_secret_without_a_key_is_named_with_the_key(
    world: World, controlplane: ControlPlane, vcsim_control: VcsimControl
) -> None:
    owner = controlplane.create_namespace(f"{world.namespace[:50]}-owner")
    await world.create_secret(namespace=owner, password=None)
    await world.kube.patch_merge(
        kinds.SECRET,
        namespace=owner,
        name=SECRET,
        patch={"metadata": {"annotations": {names.ANNOTATION_ALLOWED_NAMESPACES: world.namespace}}},
    )
    await world.create_infra_env()
    await world.create_pool(vsphere={"credentialsSecretRef": {"name": SECRET, "namespace": owner}})
    await vcsim_control.reset_counters()
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "VsphereReady", status="False", reason="CredentialsUnavailable"
        )
    assert f"Secret {owner}/{SECRET} has no key 'password'" in vsphere_ready(pool)["message"]
    assert (await vcsim_control.counters()).get("logins", 0) == 0


async def _events_of(world: World, reason: str, pools: set[str]) -> dict[str, str] | None:
    found = {
        e["involvedObject"]["name"]: e["message"]
        for e in await world.events(reason)
        if e["involvedObject"]["kind"] == "VsphereAgentPool"
    }
    return found if set(found) >= pools else None
