"""Informer rules against the real apiserver while the proxy breaks its watches.

The rule under test: whatever happens to the stream (clean ends, torn connections,
a 410 Gone), the cache converges on the server's state, and the events handlers
saw never repeat or go back in time for any object.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random
from typing import Any

from agentforge.api.kinds import Kind
from agentforge.kube import client, informer
from sim.actors.waiting import eventually
from sim.controlplane.control import ProxyControl

CONFIGMAP = Kind("", "v1", "ConfigMap", "configmaps")

History = dict[str, list[tuple[str, str, int]]]  # name -> [(event, uid, resourceVersion)]


def recording_handler(history: History) -> informer.EventHandler:
    def note(kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        history[meta["name"]].append((kind, meta["uid"], int(meta["resourceVersion"])))

    return informer.EventHandler(
        on_add=lambda o: note("add", o),
        on_update=lambda old, new: note("update", new),
        on_delete=lambda o: note("delete", o),
    )


def configmap(name: str, value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"v": value},
    }


async def churn(kube: client.KubeClient, namespace: str, *, steps: int, seed: int) -> None:
    """Create, update, delete and re-create ConfigMaps in a random but fixed order."""
    rng = random.Random(seed)
    alive: set[str] = set()
    for step in range(steps):
        name = f"cm-{rng.randrange(12)}"
        if name not in alive:
            await kube.create(CONFIGMAP, configmap(name, str(step)), namespace=namespace)
            alive.add(name)
        elif rng.random() < 0.2:
            await kube.delete(CONFIGMAP, namespace=namespace, name=name)
            alive.discard(name)
        else:
            await kube.patch_merge(
                CONFIGMAP, namespace=namespace, name=name, patch={"data": {"v": str(step)}}
            )
        await asyncio.sleep(0.005)


async def server_state(kube: client.KubeClient, namespace: str) -> dict[str, tuple[str, int]]:
    listed = await kube.list(CONFIGMAP, namespace=namespace)
    return {
        o["metadata"]["name"]: (o["metadata"]["uid"], int(o["metadata"]["resourceVersion"]))
        for o in listed.items
    }


def cache_state(inf: informer.Informer) -> dict[str, tuple[str, int]]:
    return {
        o["metadata"]["name"]: (o["metadata"]["uid"], int(o["metadata"]["resourceVersion"]))
        for o in inf.list()
    }


async def relisted(proxy: ProxyControl, *, at_least: int) -> None:
    """Wait until the informer has sent `at_least` LISTs of ConfigMaps (a relist)."""
    # polls the proxy, another process: no event to await
    await eventually(
        proxy.counts,
        lambda counts: counts.get(("list", "configmaps"), 0) >= at_least,
        what=f"{at_least} LISTs of ConfigMaps",
        interval=0.05,
    )


async def converge(inf: informer.Informer, kube: client.KubeClient, namespace: str) -> None:
    expected = await server_state(kube, namespace)
    await eventually(
        lambda: cache_state(inf) == expected,  # a cache fed by the network
        what="the informer's cache to hold the server's state",
        interval=0.05,
    )


def assert_history_is_consistent(history: History, final: dict[str, tuple[str, int]]) -> None:
    for name, events in history.items():
        for uid, group in itertools.groupby(events, key=lambda e: e[1]):
            per_uid = list(group)
            versions = [rv for _, _, rv in per_uid]
            kinds = [kind for kind, _, _ in per_uid]
            assert kinds[0] == "add", f"{name} ({uid}): first event {kinds[0]}, not add"
            assert "add" not in kinds[1:], f"{name} ({uid}) added twice: {per_uid}"
            if "delete" in kinds:
                assert kinds[-1] == "delete", f"{name} ({uid}): events after delete: {per_uid}"
                versions = versions[:-1]  # a synthetic delete repeats the last cached version
            assert versions == sorted(set(versions)), (
                f"{name} ({uid}): duplicated or out-of-order states {per_uid}"
            )
        last_kind, last_uid, last_rv = events[-1]
        if name in final:
            assert last_kind != "delete", f"{name} exists but its last event is a delete"
            assert (last_uid, last_rv) == final[name], f"{name}: last event is not the final state"
        else:
            assert last_kind == "delete", f"{name} is gone but no delete was delivered"
    assert set(final) <= set(history), "every object on the server was announced"


async def test_informer_survives_dropped_watches_and_410_without_losing_or_repeating_states(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    history: History = collections.defaultdict(list)
    inf = informer.Informer(client=kube, kind=CONFIGMAP, namespaces=[namespace])
    inf.add_handler(recording_handler(history))
    async with inf:
        await asyncio.wait_for(inf.synced(), 30)
        await proxy.wait_open_watches(1, resource="configmaps")
        writer = asyncio.create_task(churn(kube, namespace, steps=150, seed=7))
        try:
            # Each fault hits an open watch mid-churn: the next one waits until the
            # informer has reopened its watch (a torn stream is resumed after a backoff).
            await asyncio.sleep(0.2)
            await proxy.drop_watches(resource="configmaps")  # clean end: resume
            await proxy.wait_open_watches(1, resource="configmaps")
            await proxy.drop_watches(resource="configmaps", abort=True)  # torn: back off, resume
            await proxy.wait_open_watches(1, resource="configmaps")
            await proxy.gone_next_watch("configmaps")
            await proxy.drop_watches(resource="configmaps")  # the resumed watch gets 410: relist
            await relisted(proxy, at_least=2)
            await proxy.wait_open_watches(1, resource="configmaps")
            await proxy.drop_watches(resource="configmaps", abort=True)
            await writer
        finally:
            if not writer.done():
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
        counts = await proxy.counts()  # the informer's requests only: ours come below
        await converge(inf, kube, namespace)
        final = await server_state(kube, namespace)
    assert counts[("list", "configmaps")] >= 2, "the 410 must have caused a relist"
    assert counts[("watch", "configmaps")] >= 4, "every dropped watch was resumed"
    assert_history_is_consistent(history, final)


async def test_a_dropped_watch_resumes_without_relisting_or_replaying(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    for i in range(3):
        await kube.create(CONFIGMAP, configmap(f"cm-{i}", "0"), namespace=namespace)
    history: History = collections.defaultdict(list)
    inf = informer.Informer(client=kube, kind=CONFIGMAP, namespaces=[namespace])
    inf.add_handler(recording_handler(history))
    async with inf:
        await asyncio.wait_for(inf.synced(), 30)
        await proxy.wait_open_watches(1, resource="configmaps")
        await proxy.reset_counts()
        for round_ in range(3):
            await proxy.drop_watches(resource="configmaps")
            await kube.patch_merge(
                CONFIGMAP, namespace=namespace, name="cm-0", patch={"data": {"v": str(round_ + 1)}}
            )
            await proxy.wait_open_watches(1, resource="configmaps")
        counts = await proxy.counts()  # before our own LISTs below
        await converge(inf, kube, namespace)
        final = await server_state(kube, namespace)
    assert counts.get(("list", "configmaps"), 0) == 0, "a dropped stream must not relist"
    assert [kind for kind, _, _ in history["cm-0"]] == ["add", "update", "update", "update"]
    assert [kind for kind, _, _ in history["cm-1"]] == ["add"], "no replay of unchanged objects"
    assert_history_is_consistent(history, final)


async def test_watch_failures_back_off_and_recover(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    inf = informer.Informer(
        client=kube, kind=CONFIGMAP, namespaces=[namespace], backoff_initial=0.1, backoff_cap=1.0
    )
    async with inf:
        await asyncio.wait_for(inf.synced(), 30)
        await proxy.wait_open_watches(1, resource="configmaps")
        await proxy.fail_next(3, status=500, verb="watch", resource="configmaps")
        await proxy.drop_watches(resource="configmaps")
        await kube.create(CONFIGMAP, configmap("after-faults", "1"), namespace=namespace)
        await eventually(
            lambda: inf.get(namespace=namespace, name="after-faults"),
            what="ConfigMap after-faults in the cache",
            interval=0.05,
        )
    requests = [r for r in await proxy.requests() if r.verb == "watch" and r.fault]
    assert len(requests) == 3


async def test_a_label_selector_limits_the_cache(kube: client.KubeClient, namespace: str) -> None:
    chosen = configmap("chosen", "1")
    chosen["metadata"]["labels"] = {"pick": "me"}
    await kube.create(CONFIGMAP, chosen, namespace=namespace)
    await kube.create(CONFIGMAP, configmap("other", "1"), namespace=namespace)
    inf = informer.Informer(
        client=kube, kind=CONFIGMAP, namespaces=[namespace], label_selector="pick=me"
    )
    async with inf:
        await asyncio.wait_for(inf.synced(), 30)
        names = [o["metadata"]["name"] for o in inf.list()]
    assert names == ["chosen"]


async def test_an_informer_without_permission_keeps_retrying_and_is_not_synced(
    kube: client.KubeClient, namespace: str, proxy: ProxyControl
) -> None:
    await proxy.fail_next(2, status=403, verb="list", resource="configmaps")
    inf = informer.Informer(client=kube, kind=CONFIGMAP, namespaces=[namespace])
    async with inf:
        # The informer asked and was refused (the first of two refusals; it backs off
        # 0.8 s before asking again): not synced, though it looked.
        await relisted(proxy, at_least=1)
        assert not inf.has_synced
        await asyncio.wait_for(inf.synced(), 30)
    counts = await proxy.counts()
    assert counts[("list", "configmaps")] == 3, "two refused LISTs, then one that worked"
