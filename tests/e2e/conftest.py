"""e2e fixtures: the real operator process against control plane + vcsim + the actors.

- `operator_kubeconfig` (session): `config/rbac` applied as shipped, the operator's
  ServiceAccount kubeconfig (least privilege, enforced by the apiserver's RBAC).
- `world` (function): a `sim.world.World` in the test's fresh namespace (plus its
  hosted control plane namespace) with short actor delays, the operator allowed to
  `get` Secrets in its namespace (the installer's RoleBinding of a credentials
  namespace, docs/installation.md); at teardown it fails the
  test when a domain rule was broken (a bound Agent deleted, the VM of a bound Agent
  deleted) or an actor hit an unexpected error, then removes the test's VMs from the
  shared simulator.
- `metrics_reader` (session): what Prometheus holds (`sim.operator.metrics_reader`):
  the shipped metrics-reader identity's token and the operator's serving certificate.
- `operator` (function): an `OperatorHarness` running the operator for those two
  namespaces, ready (/readyz 200) before the test starts; kill -9 and restart at will;
  its /metrics read over HTTPS with the metrics reader's token.
  At teardown its log must not contain the vCenter password.

On failure the operator's log (every run) and the world's journal are attached to
the report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from pathlib import Path

import pytest

from sim.controlplane import ControlPlane
from sim.operator import MetricsReader, grant_credentials
from sim.operator import metrics_reader as shipped_metrics_reader
from sim.vcsim import Vcsim
from sim.world import World
from tests.e2e.support import E2E_TIMINGS, OperatorHarness, destroy_vms, install_operator_rbac

OPERATOR_KEY = pytest.StashKey[OperatorHarness]()
WORLD_KEY = pytest.StashKey[World]()
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent == _HERE:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def operator_kubeconfig(controlplane: ControlPlane) -> Path:
    return install_operator_rbac(controlplane)


@pytest.fixture(scope="session")
def metrics_reader(controlplane: ControlPlane, operator_kubeconfig: Path) -> MetricsReader:
    return shipped_metrics_reader(controlplane)


@pytest.fixture
async def world(
    request: pytest.FixtureRequest, controlplane: ControlPlane, vcsim: Vcsim, namespace: str
) -> AsyncIterator[World]:
    async with World(
        controlplane=controlplane,
        vcsim=vcsim,
        namespace=namespace,
        timings=E2E_TIMINGS,
        iso_size=1024 * 1024,
    ) as sim_world:
        # What an installer does for a credentials namespace (docs/installation.md): the
        # pools' Secrets are in the world's namespace, the operator watches it.
        grant_credentials(controlplane, sim_world.namespace)
        request.node.stash[WORLD_KEY] = sim_world
        yield sim_world
        leftovers = (await sim_world.snapshot()).vms
    await destroy_vms(vcsim, leftovers)  # with the world stopped: no actor sees them go
    sim_world.check()


@pytest.fixture
async def operator(
    request: pytest.FixtureRequest,
    operator_kubeconfig: Path,
    metrics_reader: MetricsReader,
    world: World,
    tmp_path: Path,
) -> AsyncIterator[OperatorHarness]:
    harness = OperatorHarness(
        kubeconfig=operator_kubeconfig,
        namespaces=(world.namespace, world.control_plane_namespace),
        log_path=tmp_path / "operator.log",
        metrics=metrics_reader,
        extra_args=tuple(
            str(arg) for m in request.node.iter_markers("operator_args") for arg in m.args
        ),
    )
    request.node.stash[OPERATOR_KEY] = harness
    try:
        await harness.start()
        yield harness
    finally:
        await harness.stop()
    assert world.vcsim.password not in harness.log_text(), "the operator logged a password"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        harness = item.stash.get(OPERATOR_KEY, None)
        if harness is not None:
            report.sections.append(
                (f"operator log ({harness.runs} run(s), {harness.log_path})", harness.log_tail())
            )
        world = item.stash.get(WORLD_KEY, None)
        if world is not None:
            report.sections.append(("world journal", world.journal.render(200)))
    return report
