"""Placement: resolved once, folders created on demand, every problem reported at once."""

from __future__ import annotations

import dataclasses

import pytest

from agentforge.vsphere import Credentials, Placement, SessionRegistry, VsphereService
from agentforge.vsphere.vm import resolve_placement as placements
from tests.vcsim.conftest import FAST

pytestmark = pytest.mark.vcsim


@pytest.mark.parametrize("network", ["VM Network", "dvpg1"])
async def test_a_good_placement_has_no_problem(
    service: VsphereService, placement: Placement, network: str
) -> None:
    problems = await service.preflight(placement=dataclasses.replace(placement, network=network))
    assert problems == []


async def test_preflight_reports_every_problem_in_one_go(
    service: VsphereService, placement: Placement
) -> None:
    broken = dataclasses.replace(
        placement,
        resource_pool="nope/Resources",
        network="no-such-net",
        datastore_cluster="no-such-pod",
        iso_datastore="no-such-ds",
    )
    problems = await service.preflight(placement=broken)
    subjects = sorted(p.subject for p in problems)
    assert subjects == [
        "ISO datastore no-such-ds",
        "datastore cluster no-such-pod",
        "network no-such-net",
        "resource pool nope/Resources",
    ]
    network = next(p for p in problems if p.subject == "network no-such-net")
    assert "VM Network" in network.fix
    assert "dvpg1" in network.fix


async def test_a_missing_datacenter_is_reported_with_the_ones_that_exist(
    service: VsphereService, placement: Placement
) -> None:
    problems = await service.preflight(placement=dataclasses.replace(placement, datacenter="dcX"))
    assert [p.subject for p in problems] == ["datacenter dcX"]
    assert "dc1" in problems[0].fix


async def test_bad_credentials_are_a_problem_not_a_crash(
    credentials: Credentials, placement: Placement
) -> None:
    registry = SessionRegistry(options=FAST)
    try:
        service = VsphereService(
            registry=registry, credentials=dataclasses.replace(credentials, password="wrong")
        )
        problems = await service.preflight(placement=placement)
    finally:
        await registry.close()
    assert len(problems) == 1
    assert "username and password" in problems[0].fix
    assert "wrong" not in problems[0].message


async def test_an_unreachable_vcenter_is_a_problem(placement: Placement) -> None:
    registry = SessionRegistry(options=FAST)
    try:
        service = VsphereService(
            registry=registry,
            credentials=Credentials(server="127.0.0.1:9", username="u", password="p"),
        )
        problems = await service.preflight(placement=placement)
    finally:
        await registry.close()
    assert len(problems) == 1
    assert problems[0].subject == "vCenter 127.0.0.1:9"


async def test_a_missing_nested_vm_folder_is_created_on_first_use(
    service: VsphereService, placement: Placement
) -> None:
    session = await service.session()
    resolved = await placements.resolve(session, placement)
    assert resolved.folder is None
    folder = await placements.ensure_folder(session, resolved)
    again = await placements.resolve(session, placement)
    assert again.folder is not None
    assert again.folder._moId == folder._moId
    placements.invalidate(session, placement)
    fresh = await placements.resolve(session, placement)
    assert fresh.folder is not None
    assert fresh.folder._moId == folder._moId
