"""REST client rules against the real apiserver (through the fault proxy)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge.api.kinds import AGENT, Kind
from agentforge.kube import client, config, errors
from sim.controlplane.control import ProxyControl
from sim.controlplane.controlplane import ControlPlane

CONFIGMAP = Kind("", "v1", "ConfigMap", "configmaps")


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def agent(name: str) -> dict[str, Any]:
    return {
        "apiVersion": AGENT.api_version,
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"approved": False, "role": "worker"},
    }


def requests_total(verb: str, resource: str, code: str) -> float:
    labels = {"verb": verb, "resource": resource, "code": code}
    return REGISTRY.get_sample_value("agent_forge_kube_requests_total", labels) or 0.0


async def test_get_of_a_missing_object_raises_not_found(
    kube: client.KubeClient, namespace: str
) -> None:
    with pytest.raises(errors.NotFound) as caught:
        await kube.get(CONFIGMAP, namespace=namespace, name="absent")
    assert caught.value.status == 404
    assert caught.value.reason == "NotFound"


async def test_an_unreachable_server_is_a_transport_error_not_not_found(
    controlplane: ControlPlane,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    cfg = config.ClusterConfig(
        server=f"https://127.0.0.1:{port}", ca_file=str(controlplane.ca_file)
    )
    retry = client.RetryPolicy(attempts=3, initial_backoff=0.01, max_backoff=0.02)
    async with client.KubeClient(config=cfg, retry=retry) as unreachable:
        with pytest.raises(errors.TransportError) as caught:
            await unreachable.get(CONFIGMAP, namespace="default", name="x")
    assert not isinstance(caught.value, errors.NotFound)


async def test_a_server_whose_certificate_is_not_trusted_is_refused(
    controlplane: ControlPlane,
) -> None:
    cfg = config.ClusterConfig(server=controlplane.server, ca_file=None)  # system CAs only
    async with client.KubeClient(config=cfg) as untrusting:
        with pytest.raises(errors.TransportError, match="certificate"):
            await untrusting.get(CONFIGMAP, namespace="default", name="x")


async def test_writes_round_trip_with_optimistic_concurrency_and_preconditions(
    kube: client.KubeClient, namespace: str
) -> None:
    created = await kube.create(CONFIGMAP, configmap("cm", a="1"), namespace=namespace)
    assert created["metadata"]["uid"]
    with pytest.raises(errors.AlreadyExists):
        await kube.create(CONFIGMAP, configmap("cm"), namespace=namespace)

    patched = await kube.patch_merge(
        CONFIGMAP, namespace=namespace, name="cm", patch={"data": {"b": "2", "a": None}}
    )
    assert patched["data"] == {"b": "2"}

    jsonpatched = await kube.patch_json(
        CONFIGMAP,
        namespace=namespace,
        name="cm",
        operations=[
            {"op": "test", "path": "/data/b", "value": "2"},
            {"op": "add", "path": "/data/c", "value": "3"},
        ],
    )
    assert jsonpatched["data"] == {"b": "2", "c": "3"}

    stale = dict(created, data={"stale": "yes"})
    with pytest.raises(errors.Conflict):
        await kube.replace(CONFIGMAP, stale)  # carries the create's resourceVersion
    fresh = await kube.get(CONFIGMAP, namespace=namespace, name="cm")
    replaced = await kube.replace(CONFIGMAP, dict(fresh, data={"d": "4"}))
    assert replaced["data"] == {"d": "4"}

    with pytest.raises(errors.Conflict):
        await kube.delete(CONFIGMAP, namespace=namespace, name="cm", uid="not-the-uid")
    await kube.delete(CONFIGMAP, namespace=namespace, name="cm", uid=created["metadata"]["uid"])
    with pytest.raises(errors.NotFound):
        await kube.get(CONFIGMAP, namespace=namespace, name="cm")


async def test_invalid_objects_raise_invalid(kube: client.KubeClient, namespace: str) -> None:
    with pytest.raises(errors.Invalid):
        await kube.create(CONFIGMAP, configmap("Not_A_Valid_Name"), namespace=namespace)


async def test_list_is_paginated_with_limit_and_continue(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    for i in range(7):
        await kube.create(CONFIGMAP, configmap(f"cm-{i}"), namespace=namespace)
    await proxy.reset_counts()
    result = await kube.list(CONFIGMAP, namespace=namespace, limit=3)
    assert sorted(o["metadata"]["name"] for o in result.items) == [f"cm-{i}" for i in range(7)]
    assert int(result.resource_version) > 0
    counts = await proxy.counts()
    assert counts[("list", "configmaps")] == 3


async def test_label_selectors_filter_lists(kube: client.KubeClient, namespace: str) -> None:
    labelled = configmap("labelled")
    labelled["metadata"]["labels"] = {"app": "x"}
    await kube.create(CONFIGMAP, labelled, namespace=namespace)
    await kube.create(CONFIGMAP, configmap("plain"), namespace=namespace)
    result = await kube.list(CONFIGMAP, namespace=namespace, label_selector="app=x")
    assert [o["metadata"]["name"] for o in result.items] == ["labelled"]


async def test_server_errors_are_retried_and_counted(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await kube.create(CONFIGMAP, configmap("cm"), namespace=namespace)
    before_500 = requests_total("get", "configmaps", "500")
    before_200 = requests_total("get", "configmaps", "200")
    await proxy.fail_next(3, status=500, verb="get", resource="configmaps")
    got = await kube.get(CONFIGMAP, namespace=namespace, name="cm")
    assert got["metadata"]["name"] == "cm"
    assert requests_total("get", "configmaps", "500") - before_500 == 3
    assert requests_total("get", "configmaps", "200") - before_200 == 1


async def test_throttling_is_retried_after_retry_after(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await proxy.fail_next(2, status=429, verb="create", resource="configmaps", retry_after=1)
    started = time.monotonic()
    created = await kube.create(CONFIGMAP, configmap("throttled"), namespace=namespace)
    elapsed = time.monotonic() - started
    assert created["metadata"]["name"] == "throttled"
    assert elapsed >= 2.0, "each 429 must be retried only after its Retry-After"


async def test_a_burst_longer_than_the_retry_budget_surfaces_the_server_error(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await proxy.fail_next(20, status=503, verb="get", resource="configmaps", retry_after=0)
    with pytest.raises(errors.ServerError) as caught:
        await kube.get(CONFIGMAP, namespace=namespace, name="whatever")
    assert caught.value.status == 503


async def test_forbidden_is_reported_as_forbidden(
    controlplane: ControlPlane, namespace: str
) -> None:
    kubeconfig = controlplane.user_kubeconfig("nobody", groups=())
    cfg = await config.load_config(kubeconfig=kubeconfig, environ={})
    async with client.KubeClient(config=cfg) as nobody:
        with pytest.raises(errors.Forbidden):
            await nobody.get(CONFIGMAP, namespace=namespace, name="x")


async def test_update_status_retries_a_conflict_from_fresh_state(
    kube: client.KubeClient, namespace: str, controlplane: ControlPlane
) -> None:
    await kube.create(AGENT, agent("a1"), namespace=namespace)
    other_writer = controlplane.direct_client()  # blocking, straight to the apiserver
    seen_versions: list[str] = []

    def mutate(obj: dict[str, Any]) -> dict[str, Any]:
        seen_versions.append(obj["metadata"]["resourceVersion"])
        if len(seen_versions) == 1:
            # another writer bumps the object between our GET and our PUT
            other_writer.request(
                "PATCH",
                AGENT.path(namespace=namespace, name="a1"),
                body={"metadata": {"labels": {"bumped": "yes"}}},
                content_type="application/merge-patch+json",
                expect=(200,),
            )
        obj.setdefault("status", {})["debugInfo"] = {"state": "ours"}
        return obj

    result = await kube.update_status(AGENT, namespace=namespace, name="a1", mutate=mutate)
    assert len(seen_versions) == 2, "the 409 must be retried from a fresh GET"
    assert seen_versions[0] != seen_versions[1]
    assert result["status"]["debugInfo"] == {"state": "ours"}
    assert result["metadata"]["labels"] == {"bumped": "yes"}, "the other writer's change survives"


async def test_update_status_gives_up_after_bounded_attempts(
    kube: client.KubeClient, namespace: str, controlplane: ControlPlane
) -> None:
    await kube.create(AGENT, agent("a3"), namespace=namespace)
    other_writer = controlplane.direct_client()
    calls = 0

    def always_raced(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        other_writer.request(
            "PATCH",
            AGENT.path(namespace=namespace, name="a3"),
            body={"metadata": {"labels": {"n": str(calls)}}},
            content_type="application/merge-patch+json",
            expect=(200,),
        )
        obj.setdefault("status", {})["debugInfo"] = {"state": "never"}
        return obj

    with pytest.raises(errors.Conflict):
        await kube.update_status(
            AGENT, namespace=namespace, name="a3", mutate=always_raced, attempts=3
        )
    assert calls == 3


async def test_update_status_writes_nothing_when_mutate_returns_none(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    created = await kube.create(AGENT, agent("a2"), namespace=namespace)
    await proxy.reset_counts()
    result = await kube.update_status(AGENT, namespace=namespace, name="a2", mutate=lambda o: None)
    assert result["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    counts = await proxy.counts()
    assert ("update", "agents.agent-install.openshift.io/status") not in counts


async def test_update_status_from_a_current_start_writes_without_a_get(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    created = await kube.create(AGENT, agent("a4"), namespace=namespace)
    await proxy.reset_counts()

    def mutate(obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("status", {})["debugInfo"] = {"state": "ours"}
        return obj

    result = await kube.update_status(
        AGENT, namespace=namespace, name="a4", mutate=mutate, start=created
    )
    assert result["status"]["debugInfo"] == {"state": "ours"}
    counts = await proxy.counts()
    assert counts.get(("update", "agents.agent-install.openshift.io/status")) == 1
    assert ("get", "agents.agent-install.openshift.io") not in counts


async def test_update_status_from_a_stale_start_retries_from_a_get_and_keeps_the_others_write(
    kube: client.KubeClient, namespace: str, controlplane: ControlPlane
) -> None:
    stale = await kube.create(AGENT, agent("a5"), namespace=namespace)
    controlplane.direct_client().request(  # another writer moves it on meanwhile
        "PATCH",
        AGENT.path(namespace=namespace, name="a5"),
        body={"metadata": {"labels": {"bumped": "yes"}}},
        content_type="application/merge-patch+json",
        expect=(200,),
    )
    seen_versions: list[str] = []

    def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
        seen_versions.append(obj["metadata"]["resourceVersion"])
        obj.setdefault("status", {})["debugInfo"] = {"state": "ours"}
        return obj

    result = await kube.update_status(
        AGENT, namespace=namespace, name="a5", mutate=mutate, start=stale
    )
    assert seen_versions[0] == stale["metadata"]["resourceVersion"]
    assert len(seen_versions) == 2, "the 409 is retried from a fresh GET"
    assert result["status"]["debugInfo"] == {"state": "ours"}
    assert result["metadata"]["labels"] == {"bumped": "yes"}


async def test_watch_streams_events_from_a_resource_version(
    kube: client.KubeClient, namespace: str
) -> None:
    listed = await kube.list(CONFIGMAP, namespace=namespace)
    async with kube.watch(
        CONFIGMAP, namespace=namespace, resource_version=listed.resource_version, timeout_seconds=30
    ) as stream:
        await kube.create(CONFIGMAP, configmap("w1"), namespace=namespace)
        await kube.delete(CONFIGMAP, namespace=namespace, name="w1")
        seen = []
        async with asyncio.timeout(20):
            async for event in stream:
                if event.type.value != "BOOKMARK":
                    seen.append((event.type.value, event.object["metadata"]["name"]))
                if len(seen) == 2:
                    break
    assert seen == [("ADDED", "w1"), ("DELETED", "w1")]


async def _consume(kube: client.KubeClient, namespace: str, resource_version: str) -> None:
    async with kube.watch(CONFIGMAP, namespace=namespace, resource_version=resource_version) as w:
        async with asyncio.timeout(20):
            async for _ in w:
                pass


async def test_a_410_error_event_in_a_watch_raises_gone(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await proxy.gone_next_watch("configmaps")
    listed = await kube.list(CONFIGMAP, namespace=namespace)
    with pytest.raises(errors.Gone):
        await _consume(kube, namespace, listed.resource_version)


async def test_the_status_observer_sees_each_write_made_once_with_before_and_stored(
    kube: client.KubeClient, namespace: str, controlplane: ControlPlane
) -> None:
    seen: list[tuple[str, str | None, str]] = []

    def observe(kind: Any, before: dict[str, Any], after: dict[str, Any]) -> None:
        state = ((before.get("status") or {}).get("debugInfo") or {}).get("state")
        seen.append((kind.kind, state, after["status"]["debugInfo"]["state"]))

    cfg = await config.load_config(kubeconfig=controlplane.admin_kubeconfig, environ={})
    async with client.KubeClient(config=cfg, status_observer=observe) as observed:
        await observed.create(AGENT, agent("a4"), namespace=namespace)
        other_writer = controlplane.direct_client()
        attempts = 0

        def mutate(obj: dict[str, Any]) -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            if attempts == 1:  # the first PUT loses a race: it is no write
                other_writer.request(
                    "PATCH",
                    AGENT.path(namespace=namespace, name="a4"),
                    body={"metadata": {"labels": {"bumped": "yes"}}},
                    content_type="application/merge-patch+json",
                    expect=(200,),
                )
            obj.setdefault("status", {})["debugInfo"] = {"state": f"v{attempts}"}
            return obj

        await observed.update_status(AGENT, namespace=namespace, name="a4", mutate=mutate)
        await observed.update_status(AGENT, namespace=namespace, name="a4", mutate=lambda o: None)
    assert attempts == 2
    assert seen == [("Agent", None, "v2")]
