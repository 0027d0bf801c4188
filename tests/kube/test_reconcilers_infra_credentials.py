"""The credentials source against the real control plane: one watched Secret, no polling."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentforge.api import kinds
from agentforge.kube import client, config
from agentforge.reconcilers.credentials import SecretCredentials, SecretUnreadable
from agentforge.reconcilers.deps import CredentialsError
from sim.controlplane.control import ProxyControl

pytestmark = pytest.mark.controlplane


def secret(name: str, password: str, **extra: str) -> dict[str, Any]:
    values = {"server": "vc.example", "username": "u", "password": password, **extra}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


@contextlib.asynccontextmanager
async def watching(kube: client.KubeClient) -> AsyncIterator[SecretCredentials]:
    """The source, closed before the test body ends (its watches are tasks)."""
    creds = SecretCredentials(client=kube, sync_timeout=10)
    try:
        yield creds
    finally:
        await creds.close()


async def until(what: str, check: Any, deadline: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while loop.time() < end:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_warm_lookup_costs_no_api_call_and_a_rotation_arrives_by_watch(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await kube.create(kinds.SECRET, secret("vc", "first"), namespace=namespace)
    await kube.create(kinds.SECRET, secret("other", "x"), namespace=namespace)
    async with watching(kube) as source:
        await _rotation(kube, namespace, proxy, source)


async def _rotation(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl, source: SecretCredentials
) -> None:
    changed: list[tuple[str, str]] = []
    source.subscribe(lambda ns, name: changed.append((ns, name)))
    assert (await source.get(namespace=namespace, name="vc")).password == "first"
    await proxy.reset_counts()
    for _ in range(5):
        assert (await source.get(namespace=namespace, name="vc")).password == "first"
    counts = await proxy.counts()
    assert counts.get(("get", "secrets"), 0) == 0
    assert counts.get(("list", "secrets"), 0) == 0
    changed.clear()
    await kube.patch_merge(
        kinds.SECRET, namespace=namespace, name="vc", patch={"stringData": {"password": "second"}}
    )

    async def rotated() -> bool:
        return (await source.get(namespace=namespace, name="vc")).password == "second"

    await until("the rotated password", rotated)
    await kube.patch_merge(
        kinds.SECRET, namespace=namespace, name="other", patch={"stringData": {"password": "y"}}
    )
    await asyncio.sleep(0.5)
    assert (namespace, "vc") in changed
    assert all(name == "vc" for _, name in changed)  # the other Secret is not watched


async def test_a_secret_is_read_by_a_namespaced_list_and_watch_only(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await kube.create(kinds.SECRET, secret("vc", "pw"), namespace=namespace)
    await proxy.reset_counts()
    async with watching(kube) as source:
        await source.get(namespace=namespace, name="vc")
        requests = [r for r in await proxy.requests() if r.resource == "secrets"]
    assert {r.verb for r in requests} <= {"list", "watch"}
    assert "list" in {r.verb for r in requests}
    assert all(r.namespace == namespace for r in requests)


async def test_a_missing_secret_names_itself_and_the_fix_and_its_creation_is_noticed(
    kube: client.KubeClient, namespace: str
) -> None:
    async with watching(kube) as source:
        await _missing_then_created(kube, namespace, source)


async def _missing_then_created(
    kube: client.KubeClient, namespace: str, source: SecretCredentials
) -> None:
    changed: list[tuple[str, str]] = []
    source.subscribe(lambda ns, name: changed.append((ns, name)))
    with pytest.raises(CredentialsError) as caught:
        await source.get(namespace=namespace, name="vc")
    assert f"Secret {namespace}/vc not found" in str(caught.value)
    assert "credentialsSecretRef" in str(caught.value)
    await kube.create(kinds.SECRET, secret("vc", "pw"), namespace=namespace)
    await until("the new Secret to be reported", lambda: _true(bool(changed)))
    assert (await source.get(namespace=namespace, name="vc")).password == "pw"


async def test_a_secret_that_cannot_be_read_is_unreadable_not_missing(
    controlplane: Any, namespace: str
) -> None:
    nobody = await config.load_config(
        kubeconfig=controlplane.user_kubeconfig("nobody", []), environ={}
    )
    async with client.KubeClient(config=nobody) as denied:
        creds = SecretCredentials(client=denied, sync_timeout=1.0)
        try:
            with pytest.raises(SecretUnreadable, match="may list and watch secrets"):
                await creds.get(namespace=namespace, name="vc")
        finally:
            await creds.close()


async def _true(value: bool) -> bool:
    return value
