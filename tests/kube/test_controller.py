"""A controller over a real informer: events reach reconciles, status writes land."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agentforge.api.kinds import AGENT
from agentforge.kube import client, controller, informer, queue, store
from agentforge.kube.store import ObjectKey
from sim.actors.waiting import eventually


def agent(name: str) -> dict[str, Any]:
    return {
        "apiVersion": AGENT.api_version,
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": {"approved": False, "role": "worker"},
    }


async def test_every_object_change_is_reconciled_and_its_status_written(
    kube: client.KubeClient, namespace: str
) -> None:
    for i in range(3):
        await kube.create(AGENT, agent(f"before-{i}"), namespace=namespace)
    agents = informer.Informer(client=kube, kind=AGENT, namespaces=[namespace])
    reconciled: list[ObjectKey] = []

    async def reconcile(key: ObjectKey) -> controller.Result | None:
        reconciled.append(key)
        ns, name = store.split_key(key)
        cached = agents.get_by_key(key)
        if cached is None:
            return None  # deleted: nothing to do
        approved = bool(cached["spec"].get("approved"))

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = obj.setdefault("status", {})
            wanted = {"state": "approved" if approved else "waiting"}
            if status.get("debugInfo") == wanted:
                return None
            status["debugInfo"] = wanted
            return obj

        await kube.update_status(AGENT, namespace=ns, name=name, mutate=mutate)
        return None

    ctrl = controller.Controller(
        name="agents-it",
        reconcile=reconcile,
        watches=[controller.Watch(source=agents)],
        workers=2,
    )
    async with agents:
        runner = asyncio.create_task(ctrl.run())
        try:
            await kube.create(AGENT, agent("after"), namespace=namespace)
            await kube.patch_merge(
                AGENT, namespace=namespace, name="before-0", patch={"spec": {"approved": True}}
            )

            def states() -> dict[str, Any]:
                return {
                    o["metadata"]["name"]: (o.get("status") or {}).get("debugInfo", {}).get("state")
                    for o in agents.list()
                }

            expected = {
                "before-0": "approved",
                "before-1": "waiting",
                "before-2": "waiting",
                "after": "waiting",
            }
            await eventually(
                lambda: states() == expected,  # the cache is fed by the network
                what=f"the cached states {expected}",
                interval=0.05,
            )
        finally:
            await ctrl.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(runner, 10)
    with pytest.raises(queue.ShutDown):  # stop() shut the queue down
        await ctrl.queue.get()
    assert {f"{namespace}/before-{i}" for i in range(3)} <= set(reconciled)
