"""pytest fixtures for the vSphere simulator (loaded by `tests/conftest.py`).

- `vcsim` (session): one `Vcsim` with the default inventory per pytest session, started
  the first time a test asks for it (unit runs never pay for it), stopped at session
  end. A missing binary fails the test with the `make vcsim` hint; never a skip.
- after every test that used `vcsim` (directly or through another fixture), the
  simulator's faults, delays, door locks, counters and request log are reset, so a
  scripted failure a test did not consume cannot hit the next test. A simulator that
  died during the test fails that test with its exit status and log tail and is
  restarted (on a new port), so one crash does not error every later test.
- `vcsim_control` (function): the `VcsimControl`, reset before the test as well, so
  counters and the log hold only the test's own requests.
- `vcsim_factory` (function): starts private simulators (`vcsim_factory(vms=1, ...)`)
  for tests that must not share one, e.g. because they end every session or need
  another inventory; all are stopped at teardown.

Why one shared simulator rather than one per test: a simulator starts in well under a
second, but tests of the vSphere layer, the reconcilers and e2e runs mostly want a
vCenter that already exists, exactly like the real one; state that could leak between
tests (faults, delays, locks, counters) is reset, and tests keep apart by using their
own VM names and folders. The factory covers the rest.

Tests that use `vcsim` get the `vcsim` marker, so `-m "not vcsim"` deselects them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sim import testing
from sim.vcsim.control import VcsimControl
from sim.vcsim.launcher import Vcsim


@pytest.fixture(scope="session")
def vcsim(request: pytest.FixtureRequest) -> Iterator[Vcsim]:
    simulator = Vcsim()
    simulator.start()
    _report(
        request.config,
        f"vcsim ready in {simulator.startup_seconds:.1f}s "
        f"({simulator.url}, log {simulator.log_path})",
    )
    try:
        yield simulator
    finally:
        simulator.stop()


@pytest.fixture(autouse=True)
def _vcsim_reset_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "vcsim" in request.fixturenames:
        simulator: Vcsim = request.getfixturevalue("vcsim")
        if simulator.running():
            simulator.control.reset_blocking()
            return
        # The shared simulator died during this test: say so with its log, and start a
        # new one so one crash costs this test, not every later one.
        report = simulator.exit_report()
        simulator.restart()
        testing.long_lived(simulator.pid)
        _report(request.config, f"vcsim restarted at {simulator.url}")
        pytest.fail(f"the shared simulator died during this test: {report}")


@pytest.fixture
def vcsim_control(vcsim: Vcsim) -> VcsimControl:
    control = vcsim.control
    control.reset_blocking()
    return control


@pytest.fixture
def vcsim_factory() -> Iterator[Callable[..., Vcsim]]:
    started: list[Vcsim] = []

    def start(**inventory: Any) -> Vcsim:
        simulator = Vcsim(**inventory)
        started.append(simulator)
        return simulator.start()

    try:
        yield start
    finally:
        for simulator in started:
            simulator.stop()


def _report(config: pytest.Config, message: str) -> None:
    """Print past output capture: the start-up time is worth seeing in every run."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(message)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(message)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "vcsim" in names or "vcsim_factory" in names:
            item.add_marker(pytest.mark.vcsim)
