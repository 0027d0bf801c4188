"""pytest fixtures for the real control plane (loaded by `tests/conftest.py`).

- `controlplane` (session): one `ControlPlane` per pytest session, started the first
  time a test asks for it (so unit runs never pay for it), stopped at session end.
  A missing binary fails the test with the `make controlplane` hint; never a skip.
- `namespace` (function): a fresh, uniquely named namespace for each test.
- `admin_api` (function, async): a kubernetes_asyncio `ApiClient` for the admin
  identity through the fault proxy.
- `proxy` (function): the `ProxyControl`; faults cleared and counters reset before
  and after each test, so a test sees only its own requests.

Tests that use `controlplane` (directly or through another fixture) get the
`controlplane` marker, so `-m "not controlplane"` deselects them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client, config

from sim.controlplane.control import ProxyControl
from sim.controlplane.controlplane import ControlPlane

_NAMESPACE_MAX = 63


@pytest.fixture(scope="session")
def controlplane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    control_plane = ControlPlane(quiet=True)
    control_plane.start()
    _report(
        request.config,
        f"control plane ready in {control_plane.startup_seconds:.1f}s "
        f"(server {control_plane.server}, workdir {control_plane.workdir})",
    )
    try:
        yield control_plane
    finally:
        control_plane.stop()


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


def namespace_name(test_name: str) -> str:
    """A DNS-1123 label derived from the test name, unique thanks to a random suffix."""
    suffix = secrets.token_hex(3)
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-") or "test"
    slug = slug[: _NAMESPACE_MAX - len(suffix) - 3].strip("-")
    return f"t-{slug}-{suffix}"


@pytest.fixture
def namespace(controlplane: ControlPlane, request: pytest.FixtureRequest) -> str:
    # Namespaces are never deleted: a bare apiserver runs no namespace controller, so a
    # deleted namespace would stay Terminating forever. A fresh name per test keeps
    # tests apart instead, and the whole etcd goes away with the session.
    return controlplane.create_namespace(namespace_name(request.node.name))


@pytest.fixture
async def admin_api(controlplane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(controlplane.admin_kubeconfig),
        client_configuration=configuration,
        persist_config=False,
    )
    async with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def proxy(controlplane: ControlPlane) -> Iterator[ProxyControl]:
    control = controlplane.proxy
    control.reset_blocking()
    try:
        yield control
    finally:
        control.reset_blocking()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "controlplane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.controlplane)
