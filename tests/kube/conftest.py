"""Fixtures for the runtime's integration tests against the real control plane.

`kube` is an `agentforge.kube.client.KubeClient` for the admin identity through the
fault proxy (so `proxy` faults and counters apply to it), with a short retry
backoff so fault bursts cost milliseconds, not seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentforge.kube import client, config
from sim.controlplane.controlplane import ControlPlane


@pytest.fixture
async def kube(controlplane: ControlPlane) -> AsyncIterator[client.KubeClient]:
    cfg = await config.load_config(kubeconfig=controlplane.admin_kubeconfig, environ={})
    retry = client.RetryPolicy(attempts=6, initial_backoff=0.02, max_backoff=0.5)
    async with client.KubeClient(config=cfg, retry=retry) as kube_client:
        yield kube_client
