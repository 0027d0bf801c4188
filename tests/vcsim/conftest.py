"""Fixtures for the vSphere layer against the simulator (`vcsim` fixture of sim.vcsim).

Each test gets its own `SessionRegistry` (closed at teardown, so no task or thread
outlives the test) with a `TaskDriver` that runs its vCenter tasks the operator's one
way (`sim.vsphere_tasks`), a unique VM folder and unique ownership markers, so tests
share one simulator without seeing each other's VMs. Retries are fast here: the policy
is the production one with shorter waits.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentforge.vsphere import (
    Credentials,
    OwnershipMarkers,
    Placement,
    SessionOptions,
    SessionRegistry,
    VsphereService,
)
from sim.vsphere_tasks import TaskDriver

pytestmark = pytest.mark.vcsim

FAST = SessionOptions(
    retry_attempts=4,
    retry_initial_seconds=0.01,
    retry_max_seconds=0.05,
    wait_max_seconds=10,
    login_wait_seconds=30.0,  # a busy test machine never turns a login into LoginPending
)


@pytest.fixture
def credentials(vcsim: Any) -> Credentials:
    return credentials_of(vcsim)


@pytest.fixture
async def registry() -> AsyncIterator[SessionRegistry]:
    reg = SessionRegistry(options=FAST)
    yield reg
    await reg.close()


@pytest.fixture
def driver(registry: SessionRegistry) -> Iterator[TaskDriver]:
    tasks = TaskDriver(registry)
    yield tasks
    tasks.close()


@pytest.fixture
async def service(registry: SessionRegistry, credentials: Credentials) -> VsphereService:
    """A logged-in service (its session's background tasks exist before the test runs)."""
    svc = VsphereService(registry=registry, credentials=credentials)
    await svc.session()
    return svc


@pytest.fixture
async def private(
    vcsim_factory: Callable[..., Any], registry: SessionRegistry
) -> tuple[Any, VsphereService]:
    """A simulator of the test's own, for tests that end every session: ending the
    sessions of the shared one would disturb every later test."""
    sim = vcsim_factory()
    svc = VsphereService(registry=registry, credentials=credentials_of(sim))
    await svc.session()
    return sim, svc


def credentials_of(sim: Any) -> Credentials:
    return Credentials(
        server=sim.server,
        username=sim.username,
        password=sim.password,
        ca_bundle_pem=Path(sim.ca_file).read_text(),
    )


@pytest.fixture
def placement(request: pytest.FixtureRequest) -> Placement:
    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    return Placement(
        datacenter="dc1",
        resource_pool="cluster/Resources",
        folder=f"af-tests/{slug}-{uuid.uuid4().hex[:6]}",
        network="VM Network",
        datastore_cluster="dsc1",
        iso_datastore="iso-ds",
    )


@pytest.fixture
def markers() -> OwnershipMarkers:
    return OwnershipMarkers(
        pool_namespace="ns1",
        pool_name="pool1",
        pool_uid=str(uuid.uuid4()),
        vsphere_agent="agent1",
    )
