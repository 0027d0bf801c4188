"""Credentials Secrets read by name: the namespace boundary, the copy's age, the sweep.

The client is a fake that serves Secrets from a dict and counts GETs (the source
uses nothing else of the API). Tests of the copy's age move an injected clock;
tests of the background sweep run it with a 50 ms interval and wait for what the
sweep does (a GET served, a listener called), never for a fixed time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.kube import errors
from agentforge.secret_credentials import (
    CredentialsError,
    CredentialsNamespaceNotAllowed,
    CredentialsNotShared,
    SecretCredentials,
    SecretUnreadable,
    allowed_namespaces,
    not_shared,
    shared_with,
)

ANNOTATION = names.ANNOTATION_ALLOWED_NAMESPACES


def secret(
    password: str = "pw", *, allowed: str | None = None, **keys: str | None
) -> dict[str, Any]:
    values = {"server": "vc.example", "username": "u", "password": password, **keys}
    meta: dict[str, Any] = {"name": "vc", "resourceVersion": "1"}
    if allowed is not None:
        meta["annotations"] = {ANNOTATION: allowed}
    return {
        "metadata": meta,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items() if v},
    }


class FakeSecrets:
    """`get` only, as the source uses the API; `fail` makes the next GETs raise."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets: list[tuple[str, str]] = []
        self.fail: errors.KubeError | None = None
        self.served = asyncio.Condition()

    async def get(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str
    ) -> dict[str, Any]:
        assert kind == kinds.SECRET
        assert namespace is not None
        self.gets.append((namespace, name))
        try:
            if self.fail is not None:
                raise self.fail
            found = self.objects.get((namespace, name))
            if found is None:
                raise errors.NotFound(status=404, reason="NotFound", message="not found")
            return found
        finally:
            async with self.served:
                self.served.notify_all()

    async def wait_gets(self, count: int, *, within: float = 5.0) -> None:
        async with asyncio.timeout(within):
            async with self.served:
                await self.served.wait_for(lambda: len(self.gets) >= count)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def source(
    api: FakeSecrets, *, interval: float = 60.0, clock: Clock | None = None
) -> AsyncIterator[SecretCredentials]:
    creds = (
        SecretCredentials(client=api, refresh_interval=interval, clock=clock)
        if clock
        else SecretCredentials(client=api, refresh_interval=interval)
    )
    try:
        yield creds
    finally:
        await creds.close()


FORBIDDEN = errors.Forbidden(status=403, reason="Forbidden", message="secrets is forbidden")


# --- the rule -----------------------------------------------------------------------------


def test_a_pool_may_use_a_secret_of_its_own_namespace_without_any_annotation() -> None:
    assert shared_with(pool_namespace="demo", secret_namespace="demo", annotations={})


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("tenant-b", True),
        ("tenant-a,tenant-b", True),
        (" tenant-a , tenant-b ", True),
        ("tenant-a tenant-b", True),
        ("tenant-a", False),
        ("tenant", False),  # names match whole, not by prefix
        ("tenant-b-2", False),
        ("*", False),  # no wildcard
        ("", False),
    ],
)
def test_another_namespace_needs_to_be_listed_by_name(value: str, allowed: bool) -> None:
    annotations = {ANNOTATION: value}
    assert (
        shared_with(pool_namespace="tenant-b", secret_namespace="demo", annotations=annotations)
        is allowed
    )


def test_the_annotation_is_split_on_commas_and_blanks() -> None:
    assert allowed_namespaces({ANNOTATION: "a, b,,c\nd"}) == {"a", "b", "c", "d"}
    assert allowed_namespaces({}) == frozenset()


def test_the_refusal_names_the_reference_the_annotation_and_who_must_add_it() -> None:
    message = str(not_shared(pool_namespace="tenant-b", secret_namespace="demo", name="vc"))
    assert "demo/vc" in message
    assert "spec.vsphere.credentialsSecretRef" in message
    assert ANNOTATION in message
    assert "whoever manages namespace demo" in message
    assert "use a Secret in namespace tenant-b" in message


# --- the boundary through the source -------------------------------------------------------


async def refusal(api: FakeSecrets) -> str:
    async with source(api) as creds:
        with pytest.raises(CredentialsNotShared) as caught:
            await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
    return str(caught.value)


async def test_a_refusal_says_the_same_whatever_the_other_secret_is() -> None:
    cases: dict[str, FakeSecrets] = {}
    cases["missing"] = FakeSecrets()
    cases["unreadable"] = FakeSecrets()
    cases["unreadable"].fail = FORBIDDEN
    cases["not annotated"] = FakeSecrets()
    cases["not annotated"].objects["demo", "vc"] = secret()
    cases["shared with others"] = FakeSecrets()
    cases["shared with others"].objects["demo", "vc"] = secret(allowed="tenant-a, *")
    cases["not annotated, lacks keys"] = FakeSecrets()
    cases["not annotated, lacks keys"].objects["demo", "vc"] = secret(password="")
    messages = {case: await refusal(api) for case, api in cases.items()}
    expected = str(not_shared(pool_namespace="tenant-b", secret_namespace="demo", name="vc"))
    assert messages == dict.fromkeys(cases, expected)
    assert all(api.gets == [("demo", "vc")] for api in cases.values())


async def test_once_shared_the_secret_is_used_and_its_problems_are_specific() -> None:
    api = FakeSecrets()
    api.objects["demo", "vc"] = secret(allowed="tenant-a,tenant-b", password="")
    async with source(api) as creds:
        with pytest.raises(CredentialsError) as caught:
            await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
        assert not isinstance(caught.value, CredentialsNotShared)
        assert "has no key 'password'" in str(caught.value)
    api.objects["demo", "vc"] = secret("right", allowed="tenant-a,tenant-b")
    async with source(api) as creds:
        found = await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
        assert found.password == "right"
        with pytest.raises(CredentialsNotShared):
            await creds.get(namespace="demo", name="vc", for_namespace="tenant-c")


async def test_the_own_namespace_is_unchanged_missing_unreadable_and_keys_are_specific() -> None:
    api = FakeSecrets()
    async with source(api) as creds:
        with pytest.raises(CredentialsError, match="Secret demo/vc not found"):
            await creds.get(namespace="demo", name="vc", for_namespace="demo")
    api.fail = FORBIDDEN
    async with source(api) as creds:
        with pytest.raises(SecretUnreadable, match="may get secrets"):
            await creds.get(namespace="demo", name="vc", for_namespace="demo")
    api.fail = None
    api.objects["demo", "vc"] = secret()  # no annotation needed in its own namespace
    async with source(api) as creds:
        found = await creds.get(namespace="demo", name="vc", for_namespace="demo")
    assert found.password == "pw"
    assert "pw" not in repr(found)


async def test_a_secret_outside_the_credentials_namespaces_is_refused_without_a_read() -> None:
    """`--credential-namespace`: the operator does not even try a Secret elsewhere (its
    RBAC would refuse it there; asking would only leak whether the name exists)."""
    api = FakeSecrets()
    api.objects["clusters-x", "admin-kubeconfig"] = secret(allowed="tenant-a")
    api.objects["tenant-a", "vc"] = secret()
    creds = SecretCredentials(client=api, namespaces=["tenant-a", "shared-creds"])
    try:
        with pytest.raises(CredentialsNamespaceNotAllowed) as caught:
            await creds.get(
                namespace="clusters-x", name="admin-kubeconfig", for_namespace="tenant-a"
            )
        assert api.gets == []
        found = await creds.get(namespace="tenant-a", name="vc", for_namespace="tenant-a")
    finally:
        await creds.close()
    assert found.password == "pw"
    assert api.gets == [("tenant-a", "vc")]
    message = str(caught.value)
    assert "clusters-x/admin-kubeconfig" in message
    assert "only in shared-creds, tenant-a (--credential-namespace)" in message
    assert names.CREDENTIALS_READER_ROLE in message


# --- the copy's age ----------------------------------------------------------------------


async def test_a_copy_is_used_until_it_is_older_than_the_interval() -> None:
    api, clock = FakeSecrets(), Clock()
    api.objects["demo", "vc"] = secret("first")
    async with source(api, interval=60.0, clock=clock) as creds:

        async def password() -> str:
            return (await creds.get(namespace="demo", name="vc", for_namespace="demo")).password

        assert await password() == "first"
        api.objects["demo", "vc"] = secret("second")
        clock.now += 59.0
        assert [await password() for _ in range(5)] == ["first"] * 5
        assert len(api.gets) == 1
        clock.now += 1.0
        assert await password() == "second"
        assert len(api.gets) == 2


async def test_max_age_zero_reads_anew_and_concurrent_callers_share_one_read() -> None:
    api, clock = FakeSecrets(), Clock()
    api.objects["demo", "vc"] = secret("first")
    async with source(api, interval=60.0, clock=clock) as creds:
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        api.objects["demo", "vc"] = secret("rotated")
        clock.now += 1.0
        found = await asyncio.gather(
            *(
                creds.get(namespace="demo", name="vc", for_namespace="demo", max_age=0.0)
                for _ in range(3)
            )
        )
    assert {c.password for c in found} == {"rotated"}
    assert len(api.gets) == 2


async def test_a_failed_read_keeps_the_last_copy_and_is_retried_sooner() -> None:
    api, clock = FakeSecrets(), Clock()
    api.objects["demo", "vc"] = secret("good")
    async with source(api, interval=60.0, clock=clock) as creds:
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        api.fail = errors.TransportError("connection refused")
        clock.now += 60.0
        found = await creds.get(namespace="demo", name="vc", for_namespace="demo")
        assert found.password == "good"
        assert len(api.gets) == 2
        clock.now += 0.5
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        assert len(api.gets) == 2  # retried after 1 s, not on every use
        clock.now += 0.5
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        assert len(api.gets) == 3


# --- the sweep -----------------------------------------------------------------------------


async def test_the_sweep_notices_a_rotation_at_rest_and_tells_subscribers_once() -> None:
    api = FakeSecrets()
    api.objects["demo", "vc"] = secret("first")
    changed: list[tuple[str, str]] = []
    async with source(api, interval=0.05) as creds:
        creds.subscribe(lambda ns, name: changed.append((ns, name)))
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        await api.wait_gets(3)  # two sweeps of an unchanged Secret
        assert changed == []
        api.objects["demo", "vc"] = secret("second")
        reads = len(api.gets)
        await api.wait_gets(reads + 2)
        assert changed == [("demo", "vc")]
        found = await creds.get(namespace="demo", name="vc", for_namespace="demo")
        assert found.password == "second"


async def test_the_sweep_notices_a_created_secret_and_a_new_annotation() -> None:
    api = FakeSecrets()
    changed: list[tuple[str, str]] = []
    async with source(api, interval=0.05) as creds:
        creds.subscribe(lambda ns, name: changed.append((ns, name)))
        with pytest.raises(CredentialsNotShared):
            await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
        api.objects["demo", "vc"] = secret()
        await api.wait_gets(len(api.gets) + 2)
        assert changed == [("demo", "vc")]
        with pytest.raises(CredentialsNotShared):
            await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
        api.objects["demo", "vc"] = secret(allowed="tenant-b")
        await api.wait_gets(len(api.gets) + 2)
        assert changed == [("demo", "vc")] * 2
        found = await creds.get(namespace="demo", name="vc", for_namespace="tenant-b")
        assert found.username == "u"


async def test_a_secret_no_pool_names_any_longer_is_dropped_not_read() -> None:
    api = FakeSecrets()
    api.objects["demo", "vc"] = secret()
    api.objects["demo", "kept"] = secret()
    in_use = {("demo", "vc"), ("demo", "kept")}
    async with source(api, interval=0.05) as creds:
        creds.set_in_use(lambda ns, name: (ns, name) in in_use)
        await creds.get(namespace="demo", name="vc", for_namespace="demo")
        await creds.get(namespace="demo", name="kept", for_namespace="demo")
        in_use.discard(("demo", "vc"))
        before = len(api.gets)
        await api.wait_gets(before + 4)
    assert ("demo", "vc") not in api.gets[before + 1 :]
    assert api.gets[before + 1 :].count(("demo", "kept")) >= 3


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SecretCredentials(client=FakeSecrets(), refresh_interval=0)
