"""The `scaleup` reconciler: one pinned AgentMachine and one VsphereAgent per demand."""

from __future__ import annotations

from agentforge.api import kinds, names
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers import naming, scaleup
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NS,
    POOL,
    agent_machine_obj,
    pool_obj,
    vsphere_agent_obj,
)

AM = "workers-7d9f8-x2x4q"
KEY = ObjectKey(f"{CPNS}/{AM}")


async def reconcile(h: Harness, key: ObjectKey = KEY) -> None:
    await scaleup.ScaleUpReconciler(h.deps).reconcile(key)


def created(h: Harness) -> list[dict]:  # type: ignore[type-arg]
    return [c.body for c in h.api.calls if c.verb == "create"]


async def test_a_waiting_agent_machine_is_pinned_and_gets_one_vsphere_agent() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM))
    await reconcile(h)
    pin = h.api.calls[0]
    assert (pin.verb, pin.kind, pin.name) == ("patch", "AgentMachine", AM)
    assert pin.body == {
        "spec": {"agentLabelSelector": {"matchLabels": {names.LABEL_AGENT_MACHINE: AM}}}
    }
    am = h.api.find(kinds.AGENT_MACHINE, CPNS, AM)
    assert am is not None
    assert am["spec"]["agentLabelSelector"]["matchLabels"] == {
        "customer": "acme",
        names.LABEL_AGENT_MACHINE: AM,
    }
    (body,) = created(h)
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == (AM, NS)
    assert meta["labels"] == {
        names.LABEL_POOL: POOL,
        names.LABEL_CREATED_FOR: "agent-machine",
        names.LABEL_AGENT_MACHINE: AM,
    }
    assert meta["annotations"][names.ANNOTATION_VM_NAME] == naming.vm_name(
        name_prefix="demo-worker", namespace=NS, vsphere_agent=AM
    )
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "VsphereAgentPool",
        POOL,
        "pool-uid",
        True,
    )
    assert owner["blockOwnerDeletion"] is False
    assert body["spec"] == {"poolRef": {"name": POOL}}
    # created with the vm controller's finalizer: no later patch to add it
    assert meta["finalizers"] == [names.FINALIZER_VSPHERE_AGENT]
    (created_event,) = h.events.events
    assert created_event.reason == "VsphereAgentCreated"
    assert (created_event.kind, created_event.name) == ("AgentMachine", AM)
    # a burst's later ones are combined onto the pool (the recorder's groups)
    assert created_event.group is not None
    assert created_event.group["kind"] == "VsphereAgentPool"
    assert created_event.group["metadata"] == {"namespace": NS, "name": POOL, "uid": "pool-uid"}


async def test_reconciling_again_creates_nothing_and_patches_nothing() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM))
    await reconcile(h)
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    assert h.api.calls == []


async def test_a_create_racing_an_existing_object_of_ours_is_not_duplicated() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM, pinned=AM))
    h.api.put(vsphere_agent_obj(AM, agent_machine=AM))  # created, but not yet in the cache
    await reconcile(h)
    assert [c.verb for c in h.api.calls] == ["create", "get"]
    assert len([k for k in h.api.objects if k[0] == "VsphereAgent"]) == 1


async def test_a_name_held_by_another_pool_moves_to_the_fallback_name() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM, pinned=AM))
    h.api.put(vsphere_agent_obj(AM, pool_name="other", agent_machine=AM))
    await reconcile(h)
    names_ = [b["metadata"]["name"] for b in created(h)]
    fallback = naming.vsphere_agent_fallback_name(namespace=NS, pool=POOL, agent_machine=AM)
    assert names_ == [AM, fallback]
    assert h.api.find(kinds.VSPHERE_AGENT, NS, fallback) is not None


async def test_both_names_taken_is_reported_on_the_agent_machine() -> None:
    fallback = naming.vsphere_agent_fallback_name(namespace=NS, pool=POOL, agent_machine=AM)
    h = harness(
        pool_obj(),
        agent_machine_obj(AM, pinned=AM),
        vsphere_agent_obj(AM, pool_name="other"),
        vsphere_agent_obj(fallback, pool_name="other"),
    )
    await reconcile(h)
    assert created(h) == []
    (event,) = h.events.events
    assert (event.kind, event.type, event.reason) == (
        "AgentMachine",
        "Warning",
        "VsphereAgentNameTaken",
    )
    assert fallback in event.message


async def test_two_matching_pools_are_reported_and_nothing_is_done() -> None:
    h = harness(pool_obj(), pool_obj(name="twin"), agent_machine_obj(AM))
    await reconcile(h)
    assert h.api.calls == []
    (event,) = h.events.events
    assert (event.name, event.type, event.reason) == (AM, "Warning", "AmbiguousPoolMatch")
    assert f"{NS}/{POOL}" in event.message
    assert f"{NS}/twin" in event.message
    assert "delete one of them" in event.message


async def test_a_pool_being_deleted_creates_nothing() -> None:
    deleting = pool_obj()
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    h = harness(deleting, agent_machine_obj(AM))
    await reconcile(h)
    assert h.api.calls == []


async def test_a_deleting_twin_leaves_the_live_pool_in_charge() -> None:
    twin = pool_obj(name="twin")
    twin["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    h = harness(pool_obj(), twin, agent_machine_obj(AM))
    await reconcile(h)
    assert [b["metadata"]["labels"][names.LABEL_POOL] for b in created(h)] == [POOL]


async def test_agent_machines_that_do_not_wait_are_left_alone() -> None:
    for am in (
        agent_machine_obj(AM, waiting=False, ready=True, agent="a"),
        agent_machine_obj(AM, waiting=False),
        agent_machine_obj(AM, deleting=True),
        agent_machine_obj(AM, node_pool="demo/another-nodepool"),
    ):
        h = harness(pool_obj(), am)
        await reconcile(h)
        assert h.api.calls == [], am


async def test_a_vsphere_agent_being_deleted_is_waited_for_not_duplicated() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM, pinned=AM), vsphere_agent_obj(AM, deleting=True))
    await reconcile(h)
    assert h.api.calls == []


async def test_a_long_agent_machine_name_is_pinned_with_a_label_safe_value() -> None:
    long_name = "w" * 70
    h = harness(pool_obj(), agent_machine_obj(long_name))
    await reconcile(h, ObjectKey(f"{CPNS}/{long_name}"))
    selection = naming.selection_label_value(agent_machine=long_name)
    (body,) = created(h)
    assert body["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == selection
    assert len(selection) <= 63


def test_watches_map_pools_and_vsphere_agents_to_agent_machines() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM), agent_machine_obj("other", node_pool="x/y"))
    mappers = scaleup._Mappers(
        pools=h.informers[kinds.VSPHERE_AGENT_POOL],
        agent_machines=h.informers[kinds.AGENT_MACHINE],
    )
    assert list(mappers.pool(pool_obj())) == [KEY]
    assert list(mappers.vsphere_agent(vsphere_agent_obj("va", agent_machine=AM))) == [KEY]
    long_name = "w" * 70
    h2 = harness(pool_obj(), agent_machine_obj(long_name))
    mappers2 = scaleup._Mappers(
        pools=h2.informers[kinds.VSPHERE_AGENT_POOL],
        agent_machines=h2.informers[kinds.AGENT_MACHINE],
    )
    selection = naming.selection_label_value(agent_machine=long_name)
    assert list(mappers2.vsphere_agent(vsphere_agent_obj("va", agent_machine=selection))) == [
        ObjectKey(f"{CPNS}/{long_name}")
    ]


def test_the_registry_builds_the_scaleup_and_pool_controllers() -> None:
    from agentforge.reconcilers import registry  # noqa: PLC0415 - the module under test

    h = harness(pool_obj())
    built = {c.name for c in registry.controllers(h.deps)}
    assert {"scaleup", "pool"} <= built
