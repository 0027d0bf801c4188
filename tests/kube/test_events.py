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


async def test_repeats_are_one_event_whose_count_is_written_in_one_patch(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    obj = await subject(kube, namespace)
    recorder = events.EventRecorder(client=kube, component="agent-forge", host="test-host")
    await proxy.reset_counts()
    for _ in range(4):
        await recorder.record(obj, type=EventType.WARNING, reason="Flapping", message="again")
    await recorder.record(obj, type=EventType.NORMAL, reason="Settled", message="done")
    counts = await proxy.counts()
    assert counts[("create", "events")] == 2
    assert counts.get(("patch", "events"), 0) == 0  # the 3 repeats are counted, held
    assert recorder.pending == 1

    await recorder.flush()  # (the flusher's turn would come 30 s after the first write)
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
    assert counts[("patch", "events")] == 1


async def test_many_objects_of_a_group_end_in_one_combined_event_on_the_group(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    group = await subject(kube, namespace)
    members = [
        await kube.create(
            CONFIGMAP,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"member-{i}"}},
            namespace=namespace,
        )
        for i in range(1, 11)
    ]
    recorder = events.EventRecorder(client=kube, component="agent-forge")
    await proxy.reset_counts()
    for member in members:
        name = member["metadata"]["name"]
        await recorder.record(
            member, type=EventType.NORMAL, reason="Made", message=f"made {name}", group=group
        )
    await recorder.flush()

    made = [e for e in (await kube.list(EVENT, namespace=namespace)).items if e["reason"] == "Made"]
    # the first member's event was held, then folded into the burst by the second's
    (combined,) = made
    assert combined["involvedObject"]["name"] == "subject"
    assert combined["count"] == 10
    assert combined["involvedObject"]["uid"] == group["metadata"]["uid"]
    assert combined["message"] == (
        f"(combined from similar events): ConfigMap {namespace}/member-10: made member-10"
    )
    counts = await proxy.counts()
    assert counts[("create", "events")] == 1  # the combined one created with its count
    assert counts.get(("patch", "events"), 0) == 0


async def test_a_count_for_an_event_the_server_no_longer_has_creates_it_anew(
    kube: client.KubeClient, namespace: str
) -> None:
    obj = await subject(kube, namespace)
    recorder = events.EventRecorder(client=kube, component="agent-forge")
    await recorder.record(obj, type=EventType.NORMAL, reason="Again", message="m")
    (first,) = (await kube.list(EVENT, namespace=namespace)).items
    await kube.delete(EVENT, namespace=namespace, name=first["metadata"]["name"])  # its TTL
    await recorder.record(obj, type=EventType.NORMAL, reason="Again", message="m")
    await recorder.flush()
    (again,) = (await kube.list(EVENT, namespace=namespace)).items
    assert again["metadata"]["name"] != first["metadata"]["name"]
    assert again["count"] == 2


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
