"""The `scaleup` reconciler: the selection label pinned into each waiting AgentMachine.

Which VM serves it (a new VsphereAgent or one handed over) is the pool's decision:
`test_pool_assignment.py`.
"""

from __future__ import annotations

from agentforge import wiring
from agentforge.api import kinds, names
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.scaleup import reconcile as scaleup
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NS,
    POOL,
    agent_machine_obj,
    pool_obj,
)

AM = "workers-7d9f8-x2x4q"
KEY = ObjectKey(f"{CPNS}/{AM}")


async def reconcile(h: Harness, key: ObjectKey = KEY) -> None:
    await scaleup.ScaleUpReconciler(h.deps).reconcile(key)


async def test_a_waiting_agent_machine_is_pinned_and_nothing_else() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM))
    await reconcile(h)
    (pin,) = h.api.calls
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
    assert h.events.events == []


async def test_reconciling_again_patches_nothing() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM))
    await reconcile(h)
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    assert h.api.calls == []


async def test_two_matching_pools_are_reported_and_nothing_is_done() -> None:
    h = harness(pool_obj(), pool_obj(name="twin"), agent_machine_obj(AM))
    await reconcile(h)
    assert h.api.calls == []
    (event,) = h.events.events
    assert (event.name, event.type, event.reason) == (AM, "Warning", "AmbiguousPoolMatch")
    assert f"{NS}/{POOL}" in event.message
    assert f"{NS}/twin" in event.message
    assert "delete one of them" in event.message


async def test_a_pool_being_deleted_pins_nothing() -> None:
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
    assert [c.verb for c in h.api.calls] == ["patch"]
    assert h.events.events == []


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


async def test_a_long_agent_machine_name_is_pinned_with_a_label_safe_value() -> None:
    long_name = "w" * 70
    h = harness(pool_obj(), agent_machine_obj(long_name))
    await reconcile(h, ObjectKey(f"{CPNS}/{long_name}"))
    selection = naming.selection_label_value(agent_machine=long_name)
    (pin,) = h.api.calls
    assert pin.body["spec"]["agentLabelSelector"]["matchLabels"] == {
        names.LABEL_AGENT_MACHINE: selection
    }
    assert len(selection) <= 63


def test_watches_map_pools_to_their_agent_machines() -> None:
    h = harness(pool_obj(), agent_machine_obj(AM), agent_machine_obj("other", node_pool="x/y"))
    mappers = scaleup._Mappers(agent_machines=h.informers[kinds.AGENT_MACHINE])
    assert list(mappers.pool(pool_obj())) == [KEY]


def test_the_registry_builds_the_scaleup_and_pool_controllers() -> None:
    h = harness(pool_obj())
    built = {c.name for c in wiring.build_controllers(h.deps)}
    assert {"scaleup", "pool"} <= built


async def test_the_scaleup_queue_takes_turns_between_node_pools() -> None:
    """A NodePool's one AgentMachine queued behind another NodePool's burst is handed
    out second, not after the burst (the queue's fairness key is its nodePool)."""
    burst = [agent_machine_obj(f"big{i}", node_pool=f"{NS}/big") for i in range(50)]
    h = harness(pool_obj(), *burst, agent_machine_obj("one", node_pool=f"{NS}/small"))
    built = scaleup.controller(h.deps)
    for i in range(50):
        built.enqueue(ObjectKey(f"{CPNS}/big{i}"))
    built.enqueue(ObjectKey(f"{CPNS}/one"))
    built.enqueue(ObjectKey(f"{CPNS}/gone"))  # not cached: the group of no NodePool
    order = [await built.queue.get() for _ in range(len(built.queue))]
    assert order[:3] == [
        ObjectKey(f"{CPNS}/big0"),
        ObjectKey(f"{CPNS}/one"),
        ObjectKey(f"{CPNS}/gone"),
    ]
    assert order[3:] == [ObjectKey(f"{CPNS}/big{i}") for i in range(1, 50)]
