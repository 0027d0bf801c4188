"""The credentials source against the real control plane: GET by name, no list, no watch.

A warm lookup costs nothing; a rotation, a created Secret and a new allowed-namespaces
annotation arrive by the periodic re-read (200 ms here; a minute by default); the
only request the source ever sends about Secrets is a `get` of the one it was asked
for; a Secret in another namespace is refused, in one text, until it opts in.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.kube import client, config
from agentforge.secret_credentials import (
    CredentialsError,
    CredentialsNotShared,
    SecretCredentials,
    SecretUnreadable,
    not_shared,
)
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl

pytestmark = pytest.mark.controlplane

REFRESH_S = 0.2
READER = "agent-forge-secrets-it"
"""The source's own identity, one per test namespace (in system:masters: it may do
anything, and does only GETs)."""


def secret(name: str, password: str, **extra: str) -> dict[str, Any]:
    values = {"server": "vc.example", "username": "u", "password": password, **extra}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    }


@contextlib.asynccontextmanager
async def reading(
    kube: client.KubeClient, *, refresh: float = REFRESH_S
) -> AsyncIterator[SecretCredentials]:
    """The source, closed before the test body ends (its sweep is a task)."""
    creds = SecretCredentials(client=kube, refresh_interval=refresh)
    try:
        yield creds
    finally:
        await creds.close()


@pytest.fixture
async def reader(controlplane: Any, namespace: str) -> AsyncIterator[client.KubeClient]:
    cfg = await config.load_config(
        kubeconfig=controlplane.user_kubeconfig(f"{READER}-{namespace}", ["system:masters"]),
        environ={},
    )
    async with client.KubeClient(config=cfg) as kube:
        yield kube


async def secret_requests(proxy: ProxyControl, namespace: str) -> list[Any]:
    return [r for r in await proxy.requests(f"{READER}-{namespace}") if r.resource == "secrets"]


async def test_a_warm_lookup_costs_no_api_call(
    kube: client.KubeClient, reader: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await kube.create(kinds.SECRET, secret("vc", "first"), namespace=namespace)
    await proxy.reset_counts()
    async with reading(reader, refresh=60.0) as source:
        for _ in range(6):
            found = await source.get(namespace=namespace, name="vc", for_namespace=namespace)
            assert found.password == "first"
    assert await proxy.counts(f"{READER}-{namespace}") == {("get", "secrets"): 1}


async def test_a_rotation_arrives_by_re_reading_with_get_only(
    kube: client.KubeClient, reader: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await kube.create(kinds.SECRET, secret("vc", "first"), namespace=namespace)
    await kube.create(kinds.SECRET, secret("other", "x"), namespace=namespace)
    async with reading(reader) as source:
        await _rotation(kube, namespace, proxy, source)


async def _rotation(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl, source: SecretCredentials
) -> None:
    changed: list[tuple[str, str]] = []
    source.subscribe(lambda ns, name: changed.append((ns, name)))
    found = await source.get(namespace=namespace, name="vc", for_namespace=namespace)
    assert found.password == "first"
    await kube.patch_merge(
        kinds.SECRET, namespace=namespace, name="vc", patch={"stringData": {"password": "second"}}
    )
    await eventually(lambda: bool(changed), what="the rotation reported", within=15.0)
    found = await source.get(namespace=namespace, name="vc", for_namespace=namespace)
    assert found.password == "second"
    await kube.patch_merge(
        kinds.SECRET, namespace=namespace, name="other", patch={"stringData": {"password": "y"}}
    )
    # Two more re-reads of "vc" prove the source kept looking; "other" was never asked for.
    seen = len(await secret_requests(proxy, namespace))

    async def two_more_reads() -> bool:
        return len(await secret_requests(proxy, namespace)) >= seen + 2

    await eventually(two_more_reads, what="two more re-reads", within=15.0)
    assert changed == [(namespace, "vc")]
    requests = await secret_requests(proxy, namespace)
    assert {r.verb for r in requests} == {"get"}
    assert {(r.namespace, r.name) for r in requests} == {(namespace, "vc")}


async def test_a_missing_secret_names_itself_and_the_fix_and_its_creation_is_noticed(
    kube: client.KubeClient, reader: client.KubeClient, namespace: str
) -> None:
    async with reading(reader) as source:
        changed: list[tuple[str, str]] = []
        source.subscribe(lambda ns, name: changed.append((ns, name)))
        with pytest.raises(CredentialsError) as caught:
            await source.get(namespace=namespace, name="vc", for_namespace=namespace)
        assert f"Secret {namespace}/vc not found" in str(caught.value)
        assert "credentialsSecretRef" in str(caught.value)
        await kube.create(kinds.SECRET, secret("vc", "pw"), namespace=namespace)
        await eventually(lambda: bool(changed), what="the new Secret to be reported", within=15.0)
        found = await source.get(namespace=namespace, name="vc", for_namespace=namespace)
        assert found.password == "pw"


async def test_a_secret_that_cannot_be_read_is_unreadable_not_missing(
    controlplane: Any, namespace: str
) -> None:
    nobody = await config.load_config(
        kubeconfig=controlplane.user_kubeconfig("nobody", []), environ={}
    )
    async with (
        client.KubeClient(config=nobody, retry=client.RetryPolicy(attempts=1)) as denied,
        reading(denied) as creds,
    ):
        with pytest.raises(SecretUnreadable, match="may get secrets") as caught:
            await creds.get(namespace=namespace, name="vc", for_namespace=namespace)
        assert "forbidden" in str(caught.value).lower()
        # Seen from another namespace it is one more refusal, in the usual words.
        with pytest.raises(CredentialsNotShared) as refused:
            await creds.get(namespace=namespace, name="vc", for_namespace="tenant-b")
        expected = not_shared(pool_namespace="tenant-b", secret_namespace=namespace, name="vc")
        assert str(refused.value) == str(expected)


async def test_a_secret_of_another_namespace_is_refused_until_it_lists_the_pools_namespace(
    kube: client.KubeClient, reader: client.KubeClient, namespace: str
) -> None:
    tenant = "tenant-b"  # only named: the pool's namespace need not exist for the rule
    async with reading(reader) as source:

        async def attempt() -> str:
            try:
                await source.get(namespace=namespace, name="vc", for_namespace=tenant)
            except CredentialsNotShared as exc:
                return str(exc)
            return "accepted"

        missing = await attempt()
        await kube.create(kinds.SECRET, secret("vc", "pw"), namespace=namespace)
        changed: list[tuple[str, str]] = []
        source.subscribe(lambda ns, name: changed.append((ns, name)))
        await eventually(lambda: bool(changed), what="the new Secret to be re-read", within=15.0)
        assert await attempt() == missing  # exists now: the same words
        await kube.patch_merge(
            kinds.SECRET,
            namespace=namespace,
            name="vc",
            patch={"metadata": {"annotations": {names.ANNOTATION_ALLOWED_NAMESPACES: tenant}}},
        )
        await eventually(
            lambda: len(changed) >= 2, what="the annotation to be re-read", within=15.0
        )
        assert await attempt() == "accepted"
