"""Fixtures for the runtime's integration tests against the real control plane.

`kube` is an `agentforge.kube.client.KubeClient` for the admin identity through the
fault proxy (so `proxy` faults and counters apply to it), with a short retry
backoff so fault bursts cost milliseconds, not seconds. `current_crds` installs this
checkout's CRDs once per module (a module may have installed older ones); `world`
is the vSphere-facing controllers' test namespace (`reconcilers_world.World`);
`pool_world` the operator over a test namespace and its control plane namespace
(`pool_world.World`, for the pool and scale-up controllers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentforge.kube import client
from sim.cluster_config import cluster_config
from sim.controlplane.controlplane import ControlPlane
from sim.controlplane.pytest_plugin import namespace_name
from sim.vcsim.launcher import Vcsim
from tests.kube import pool_world as pool_world_
from tests.kube.reconcilers_world import World, install_current_crds, world_for


@pytest.fixture
async def kube(controlplane: ControlPlane) -> AsyncIterator[client.KubeClient]:
    cfg = await cluster_config(controlplane.admin_kubeconfig)
    retry = client.RetryPolicy(attempts=6, initial_backoff=0.02, max_backoff=0.5)
    async with client.KubeClient(config=cfg, retry=retry) as kube_client:
        yield kube_client


@pytest.fixture(scope="module")
def current_crds(controlplane: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    install_current_crds(controlplane, tmp_path_factory.mktemp("crds"))


@pytest.fixture
async def world(
    current_crds: None, kube: client.KubeClient, namespace: str, vcsim: Vcsim
) -> AsyncIterator[World]:
    async with world_for(kube=kube, namespace=namespace, vcsim=vcsim) as built:
        yield built


@pytest.fixture
async def pool_world(
    controlplane: ControlPlane,
    kube: client.KubeClient,
    namespace: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[pool_world_.World]:
    cpns = controlplane.create_namespace(namespace_name(f"{request.node.name}-cp"))
    async with pool_world_.pool_world(controlplane, kube, namespace, cpns) as built:
        yield built
