"""Event recorder rules against the real apiserver."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api.kinds import EVENT, Kind
from agentforge.kube import client, events
from agentforge.kube.events import EventType
from sim.controlplane.control import ProxyControl

CONFIGMAP = Kind("", "v1", "ConfigMap", "configmaps")


async def subject(kube: client.KubeClient, namespace: str) -> dict[str, Any]:
    return await kube.create(
        CONFIGMAP,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "subject"}},
        namespace=namespace,
    )


async def test_repeats_are_aggregated_into_one_event_with_a_count(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    obj = await subject(kube, namespace)
    recorder = events.EventRecorder(client=kube, component="agent-forge", host="test-host")
    await proxy.reset_counts()
    for _ in range(4):
        await recorder.record(obj, type=EventType.WARNING, reason="Flapping", message="again")
    await recorder.record(obj, type=EventType.NORMAL, reason="Settled", message="done")

    listed = await kube.list(EVENT, namespace=namespace)
    by_reason = {e["reason"]: e for e in listed.items}
    assert sorted(by_reason) == ["Flapping", "Settled"]
    flapping = by_reason["Flapping"]
    assert flapping["count"] == 4
    assert flapping["type"] == "Warning"
    assert flapping["involvedObject"]["uid"] == obj["metadata"]["uid"]
    assert flapping["involvedObject"]["kind"] == "ConfigMap"
    assert flapping["source"] == {"component": "agent-forge", "host": "test-host"}
    assert by_reason["Settled"]["count"] == 1
    counts = await proxy.counts()
    assert counts[("create", "events")] == 2
    assert counts[("patch", "events")] == 3


async def test_a_failing_write_is_logged_not_raised(
    kube: client.KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ghost", "namespace": "no-such-namespace-anywhere", "uid": "u"},
    }
    recorder = events.EventRecorder(client=kube, component="agent-forge")
    await recorder.record(ghost, type=EventType.WARNING, reason="Lost", message="nobody hears")
    assert "could not record event" in caplog.text
