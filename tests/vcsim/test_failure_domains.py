"""Failure domains against the simulator: each resolved like the pool's placement, a
domain that cannot take VMs (cluster gone, datastore missing) named with its reason,
never skipped silently, and each usable domain's free storage read in the same
inventory retrieval (`reconcilers.common.pool_specs`, `vsphere.placement`)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest

from agentforge.api.pool import VsphereAgentPool
from agentforge.check import probes as check_probes
from agentforge.check.render import Status
from agentforge.reconcilers.common import pool_specs
from agentforge.vsphere import Credentials, Placement, SessionRegistry, VsphereService, vmomi
from agentforge.vsphere.vmomi import vim
from tests.unit.api.support import MINIMAL_SPEC, pool_object
from tests.vcsim.conftest import FAST

pytestmark = pytest.mark.vcsim


def _pool(failure_domains: list[dict[str, Any]]) -> VsphereAgentPool:
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec["vsphere"] |= {"spreadPolicy": "Spread", "failureDomains": failure_domains}
    return VsphereAgentPool.model_validate(pool_object(spec))


async def test_a_single_datastore_is_a_placement(
    service: VsphereService, placement: Placement
) -> None:
    assert await service.preflight(placement=dataclasses.replace(placement, datastore="ds1")) == []
    problems = await service.preflight(placement=dataclasses.replace(placement, datastore="nope"))
    assert [p.subject for p in problems] == ["datastore nope"]
    assert "ds1" in problems[0].fix


async def test_unusable_domains_are_named_with_their_reason(service: VsphereService) -> None:
    pool = _pool(
        [
            {"name": "zone-a", "computeCluster": "cluster", "datastoreCluster": "dsc1"},
            {"name": "zone-b", "computeCluster": "cluster", "datastore": "ds2"},
            {"name": "zone-gone", "computeCluster": "gone", "datastore": "ds1"},
            {"name": "zone-nods", "computeCluster": "cluster", "datastore": "no-such-ds"},
        ]
    )
    report = await pool_specs.inspect_domains(service, pool)
    assert report.usable == ("zone-a", "zone-b")
    assert [name for name, _ in report.unusable] == ["zone-gone", "zone-nods"]
    why = dict(report.unusable)
    assert "resource pool gone/Resources" in why["zone-gone"]
    assert "datastore no-such-ds: not found" in why["zone-nods"]
    assert report.message.startswith("new VMs go to zone-a, zone-b only; skipped:")
    # free storage: the datastore cluster's is the sum over its datastores (ds1, ds2)
    free = await datastore_free(service)
    assert report.free == {"zone-a": free["ds1"] + free["ds2"], "zone-b": free["ds2"]}
    assert free["ds1"] > 0
    assert free["ds2"] > 0


async def datastore_free(service: VsphereService) -> dict[str, int]:
    """Datastore name -> `summary.freeSpace`, read from vCenter."""
    content = (await service.session()).content

    def read() -> dict[str, int]:
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.Datastore], True)
        try:
            found = vmomi.retrieve(
                content,
                objects=vmomi.object_specs(view.view),
                props=[(vim.Datastore, ["name", "summary.freeSpace"])],
            )
        finally:
            view.Destroy()
        return {str(f.props["name"]): int(f.props["summary.freeSpace"]) for f in found}

    return await asyncio.to_thread(read)


async def test_no_usable_domain_says_so(service: VsphereService) -> None:
    pool = _pool([{"name": "zone-gone", "computeCluster": "gone", "datastore": "ds1"}])
    report = await pool_specs.inspect_domains(service, pool)
    assert report.usable == ()
    assert report.message.startswith("no failure domain can take VMs: failure domain zone-gone")


async def test_check_validates_every_domain(credentials: Credentials) -> None:
    pool = _pool(
        [
            {"name": "zone-a", "computeCluster": "cluster", "datastoreCluster": "dsc1"},
            {"name": "zone-gone", "computeCluster": "gone", "datastore": "ds1"},
        ]
    )
    registry = SessionRegistry(options=FAST)
    try:
        items = await check_probes.vsphere_preflight(registry, pool, credentials)
    finally:
        await registry.close()
    by_subject = {i.subject: i for i in items}
    assert by_subject["failure domain zone-a"].status is Status.PASS
    gone = by_subject["failure domain zone-gone"]
    assert gone.status is Status.FAIL
    assert "resource pool gone/Resources" in gone.message
    assert "spec.vsphere.failureDomains" in (gone.fix or "")
