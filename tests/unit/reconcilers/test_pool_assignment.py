"""The `pool` reconciler creates and hands over VsphereAgents (fake API server, real caches).

One VsphereAgent per AgentMachine that waits and that no VM of the pool can serve
(moved here from `scaleup`, which only pins the selection label now); a VsphereAgent
whose AgentMachine went away goes to a waiting one: `status.handover` first (read
back), then the selection label, then, in a later pass, the Agent.
"""

from __future__ import annotations

from typing import Any

from agentforge.api import kinds, names
from agentforge.kube import errors
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.pool import reconcile as pool
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    NS,
    POOL,
    agent_machine_obj,
    agent_obj,
    ago,
    infra_env_obj,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/{POOL}")
AM = "workers-7d9f8-x2x4q"


async def reconcile(h: Harness, reconciler: pool.PoolReconciler | None = None) -> object:
    return await (reconciler or pool.PoolReconciler(h.deps)).reconcile(KEY)


def created(h: Harness) -> list[dict[str, Any]]:
    return [c.body for c in h.api.calls if c.verb == "create"]


def vsphere_agents(h: Harness) -> dict[str, dict[str, Any]]:
    return {k[2]: v for k, v in h.api.objects.items() if k[0] == "VsphereAgent"}


# --- creation ------------------------------------------------------------------------------


async def test_a_waiting_agent_machine_gets_one_vsphere_agent_from_the_pool() -> None:
    h = harness(pool_obj(), infra_env_obj(), agent_machine_obj(AM, pinned=AM))
    await reconcile(h)
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
    (event,) = [e for e in h.events.events if e.reason == "VsphereAgentCreated"]
    assert (event.kind, event.name) == ("AgentMachine", AM)
    # a burst's later ones are combined onto the pool (the recorder's groups)
    assert event.group is not None
    assert event.group["kind"] == "VsphereAgentPool"
    assert event.group["metadata"] == {"namespace": NS, "name": POOL, "uid": "pool-uid"}


async def test_a_create_racing_an_existing_object_of_ours_is_not_duplicated() -> None:
    h = harness(pool_obj(), infra_env_obj(), agent_machine_obj(AM, pinned=AM))
    h.api.put(vsphere_agent_obj(AM, agent_machine=AM))  # created, but not yet in the cache
    await reconcile(h)
    assert [(c.verb, c.name) for c in h.api.calls if c.kind == "VsphereAgent"] == [
        ("create", AM),
        ("get", AM),
    ]
    assert list(vsphere_agents(h)) == [AM]


async def test_names_held_by_others_move_to_the_fallbacks_then_are_reported() -> None:
    fallback = naming.vsphere_agent_fallback_name(namespace=NS, pool=POOL, agent_machine=AM)
    with_uid = naming.vsphere_agent_fallback_name(
        namespace=NS, pool=POOL, agent_machine=AM, uid=f"uid-am-{AM}"
    )
    assert len({AM, fallback, with_uid}) == 3
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj(AM, pinned=AM),
        vsphere_agent_obj(AM, pool_name="other"),
    )
    await reconcile(h)
    assert [b["metadata"]["name"] for b in created(h)] == [fallback]

    # a VsphereAgent of ours named after AM that was handed to another AgentMachine
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj(AM, pinned=AM),
        agent_machine_obj("am-other", waiting=False, ready=True, agent="a-other"),
        vsphere_agent_obj(AM, agent_machine="am-other", bios_uuid=uuid(1), phase="Bound"),
        agent_obj("a-other", bios_uuid=uuid(1), bound_to="am-other"),
        vsphere_agent_obj(fallback, pool_name="other"),
    )
    await reconcile(h)
    assert [b["metadata"]["name"] for b in created(h)] == [with_uid]

    h.api.calls.clear()
    h.api.put(vsphere_agent_obj(with_uid, pool_name="other"))
    del h.api.objects[("VsphereAgent", NS, with_uid)]["metadata"]["labels"][names.LABEL_POOL]
    h.sync()
    h.events.events.clear()
    await reconcile(h, pool.PoolReconciler(h.deps))
    assert created(h) == []
    (event,) = [e for e in h.events.events if e.reason == "VsphereAgentNameTaken"]
    assert (event.kind, event.type) == ("AgentMachine", "Warning")
    assert with_uid in event.message


async def test_a_vsphere_agent_being_deleted_for_the_agent_machine_is_waited_for() -> None:
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj(AM, pinned=AM),
        vsphere_agent_obj(AM, deleting=True),
    )
    await reconcile(h)
    assert created(h) == []


async def test_nothing_is_created_while_two_pools_match() -> None:
    h = harness(pool_obj(), pool_obj(name="twin"), infra_env_obj(), agent_machine_obj(AM))
    await reconcile(h)
    assert created(h) == []


async def test_the_next_pass_waits_for_the_cache_to_show_what_the_last_one_created() -> None:
    h = harness(pool_obj(), infra_env_obj(), agent_machine_obj(AM, pinned=AM))
    reconciler = pool.PoolReconciler(h.deps)
    await reconcile(h, reconciler)
    assert len(created(h)) == 1
    h.api.calls.clear()
    result = await reconcile(h, reconciler)  # the cache has not seen the new object yet
    assert h.api.calls == []
    assert getattr(result, "requeue_after", 0) > 0
    h.sync()
    await reconcile(h, reconciler)
    assert created(h) == []


# --- hand-over ----------------------------------------------------------------------------


def replaced() -> Harness:
    """`am-old` went away while its VM booted; its replacement `am-new` waits."""
    return harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj("am-new", pinned="am-new"),
        vsphere_agent_obj(
            "am-old",
            bios_uuid=uuid(1),
            phase="Provisioning",
            reason="AgentPending",
            created=ago(minutes=5),
        ),
    )


async def test_a_vm_of_a_gone_agent_machine_is_handed_to_the_waiting_one_record_first() -> None:
    h = replaced()
    await reconcile(h)
    assert created(h) == []
    writes = [(c.verb, c.name) for c in h.api.calls if c.verb in ("update-status", "patch")]
    assert writes[:2] == [("update-status", "am-old"), ("patch", "am-old")]
    record = next(c for c in h.api.calls if c.verb == "update-status" and c.name == "am-old")
    handover = record.body["status"]["handover"]
    assert (handover["fromAgentMachine"], handover["toAgentMachine"]) == ("am-old", "am-new")
    assert handover["toAgentMachineUID"] == "uid-am-am-new"
    label = next(c for c in h.api.calls if c.verb == "patch" and c.name == "am-old")
    assert label.body["metadata"]["labels"] == {names.LABEL_AGENT_MACHINE: "am-new"}
    assert label.body["metadata"]["resourceVersion"]  # the version carrying the record
    stored = vsphere_agents(h)["am-old"]
    assert stored["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-new"
    assert {e.reason for e in h.events.events} >= {"VsphereAgentHandedOver"}
    (action,) = [a for a in status_of(h)["plannedActions"] if a["type"] == "HandOverVM"]
    assert action["name"] == "vm-am-old"


def status_of(h: Harness) -> dict[str, Any]:
    found = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert found is not None
    status: dict[str, Any] = found["status"]
    return status


async def test_a_label_move_that_fails_is_resumed_to_the_same_agent_machine() -> None:
    h = replaced()
    h.api.faults[("patch", "VsphereAgent")] = errors.ServerError(
        status=500, reason="InternalError", message="etcd timeout"
    )
    await reconcile(h)  # crashed between the checkpoint and the label
    stored = vsphere_agents(h)["am-old"]
    assert stored["status"]["handover"]["toAgentMachine"] == "am-new"
    assert stored["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-old"
    # meanwhile another AgentMachine waits, and sorts first: the record decides
    h.api.put(agent_machine_obj("am-aaa", pinned="am-aaa"))
    del h.api.faults[("patch", "VsphereAgent")]
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    label = next(c for c in h.api.calls if c.verb == "patch" and c.name == "am-old")
    assert label.body["metadata"]["labels"] == {names.LABEL_AGENT_MACHINE: "am-new"}
    assert [b["metadata"]["name"] for b in created(h)] == ["am-aaa"]


async def test_the_agent_is_relabelled_once_the_record_is_stored_in_the_same_pass() -> None:
    h = replaced()
    h.api.put(agent_obj("a1", bios_uuid=uuid(1), labels={names.LABEL_AGENT_MACHINE: "am-old"}))
    h.sync()
    va = vsphere_agents(h)["am-old"]
    va["status"]["vm"].update(phase="Available", reason="AgentAvailable")
    h.sync()
    h.api.faults[("update-status", "VsphereAgent")] = errors.ServerError(
        status=500, reason="InternalError", message="etcd timeout"
    )
    await reconcile(h)  # the record could not be stored: the Agent keeps its label
    assert "handover" not in vsphere_agents(h)["am-old"]["status"]
    agent_patches = [c for c in h.api.calls if c.kind == "Agent" and c.verb == "patch"]
    assert all(
        (p.body.get("metadata") or {}).get("labels", {}).get(names.LABEL_AGENT_MACHINE) != "am-new"
        for p in agent_patches
    )
    del h.api.faults[("update-status", "VsphereAgent")]
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    order = [(c.verb, c.kind, c.name) for c in h.api.calls]
    record = order.index(("update-status", "VsphereAgent", "am-old"))
    (patch,) = [c for c in h.api.calls if c.kind == "Agent" and c.verb == "patch"]
    assert order.index(("patch", "Agent", "a1")) > record  # the checkpoint first
    assert patch.body["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-new"
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    assert [c for c in h.api.calls if c.kind == "Agent" and c.verb == "patch"] == []
    assert "handover" not in vsphere_agents(h)["am-old"]["status"]  # done: record cleared
