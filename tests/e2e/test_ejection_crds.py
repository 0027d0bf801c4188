"""An old VsphereAgent CRD (without `status.isoEjection`) makes ejection stop before vSphere.

A control plane of its own gets our CRDs with the record's fields removed from the
VsphereAgent schema, as a cluster looks when a new controller was deployed without
its CRDs: the API server prunes the recovery record on every write. The operator must
notice on the read-back, change nothing in vSphere and say to update the CRDs, and
must not turn the refusal into a hot loop of writes.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import crdgen
from sim import paths
from sim.controlplane import ControlPlane
from sim.operator import grant_credentials, operator_identity
from sim.vcsim import Vcsim, VcsimControl
from sim.world import World
from tests.e2e import ejection_support as ej
from tests.e2e.support import (
    E2E_TIMINGS,
    OperatorHarness,
    consistently,
    destroy_vms,
    eventually,
    install_operator_rbac,
)

POOL = ej.POOL
STAYS_S = 5.0


def without_record_fields(crd: dict[str, Any]) -> dict[str, Any]:
    for version in crd["spec"]["versions"]:
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        del status["properties"]["isoEjection"]
    return crd


@pytest.fixture
def old_crd_controlplane(tmp_path: Path) -> Iterator[ControlPlane]:
    folder = tmp_path / "crds"
    folder.mkdir()
    for name, rendered in crdgen.render_all().items():
        old = rendered["spec"]["names"]["kind"] == "VsphereAgent"
        crd = without_record_fields(rendered) if old else rendered
        (folder / name).write_text(yaml.safe_dump(crd))
    controlplane = ControlPlane(crd_paths=[paths.EXTERNAL_CRDS_DIR, folder], quiet=True)
    controlplane.start()
    try:
        yield controlplane
    finally:
        controlplane.stop()


@pytest.fixture
async def old_world(old_crd_controlplane: ControlPlane, vcsim: Vcsim) -> AsyncIterator[World]:
    namespace = old_crd_controlplane.create_namespace(f"t-old-crd-{secrets.token_hex(3)}")
    grant_credentials(old_crd_controlplane, namespace)  # as the e2e `world` fixture does
    async with World(
        controlplane=old_crd_controlplane,
        vcsim=vcsim,
        namespace=namespace,
        timings=E2E_TIMINGS,
        iso_size=1024 * 1024,
    ) as world:
        yield world
        leftovers = (await world.snapshot()).vms
    await destroy_vms(vcsim, leftovers)
    world.check()


@pytest.fixture
async def old_operator(
    old_crd_controlplane: ControlPlane, old_world: World, tmp_path: Path
) -> AsyncIterator[OperatorHarness]:
    harness = OperatorHarness(
        kubeconfig=install_operator_rbac(old_crd_controlplane),
        namespaces=(old_world.namespace, old_world.control_plane_namespace),
        log_path=tmp_path / "operator.log",
    )
    try:
        await harness.start()
        yield harness
    finally:
        await harness.stop()
    assert old_world.vcsim.password not in harness.log_text()


async def test_an_old_crd_that_prunes_the_record_stops_before_vsphere_and_says_to_update(
    old_crd_controlplane: ControlPlane,
    old_world: World,
    old_operator: OperatorHarness,
    vcsim_control: VcsimControl,
) -> None:
    world = old_world
    await ej.set_up(world, eject_after_install=True)
    await world.nodepool(POOL).scale(1)
    snap = await ej.wait_reasons(world, {"EjectionFailed"}, within=120)
    (va,) = ej.vas_of(snap)
    vm = ej.vm_of(snap, va)
    message = ej.iso_ejected(va)["message"]
    assert "Update the CRDs" in message
    assert "nothing was changed in vSphere" in message
    assert "isoEjection" not in va["status"]
    # The Warning follows the condition's write (status first, then the Event).
    await eventually(
        world.snapshot,
        lambda s: (
            "ISOEjectionCRDsOutdated"
            in {e.get("reason") for e in s.events_about("VsphereAgent", va["metadata"]["name"])}
        ),
        within=30,
        what="the ISOEjectionCRDsOutdated event",
    )

    proxy = old_crd_controlplane.proxy
    await proxy.reset_counts()
    await consistently(
        world.snapshot,
        lambda s: (
            set(ej.ejected_reasons(s).values()) == {"EjectionFailed"}
            and ej.pool_iso(s) in (s.vm(vm.name) or vm).iso_files
        ),
        duration=STAYS_S,
        what="no ejection with a pruning CRD",
    )
    assert await ej.disconnects(vcsim_control, vm.moref) == []
    counts = await proxy.counts(operator_identity())
    writes = sum(
        n
        for (verb, resource), n in counts.items()
        if verb == "update" and "vsphereagents" in resource
    )
    assert writes <= 4, f"the refusal is retried with backoff, not in a loop: {counts}"
