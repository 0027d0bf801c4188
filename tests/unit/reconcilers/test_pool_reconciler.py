"""The `pool` reconciler over a fake API server and real (unstarted) informer caches."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge.api import kinds, names
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube import errors
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common import records
from agentforge.reconcilers.planning.planner import ORPHAN_GRACE
from agentforge.reconcilers.pool import reconcile as pool
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NS,
    POOL,
    agent_machine_obj,
    agent_obj,
    ago,
    infra_env_obj,
    machine_obj,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/{POOL}")


def world(**pool_spec: object) -> Harness:
    return harness(
        pool_obj(**pool_spec),
        infra_env_obj(),
        agent_machine_obj("am-1"),
        machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="vm-1", bios_uuid=uuid(1), created=ago(minutes=5)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )


async def reconcile(h: Harness) -> object:
    return await pool.PoolReconciler(h.deps).reconcile(KEY)


def status(h: Harness) -> dict[str, Any]:
    found = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert found is not None
    return found.get("status") or {}


async def test_a_pool_gets_its_finalizer_first() -> None:
    h = world(finalizers=[])
    await reconcile(h)
    first = h.api.calls[0]
    assert (first.verb, first.kind) == ("patch", "VsphereAgentPool")
    assert first.body["metadata"]["finalizers"] == [names.FINALIZER_POOL]
    assert first.body["metadata"]["resourceVersion"]


async def test_a_plan_is_applied_and_the_status_written_once() -> None:
    h = world()
    await reconcile(h)
    assert h.api.verbs() == [
        ("patch", "Agent", "a1"),
        ("get", "VsphereAgent", "am-1"),
        ("update-status", "VsphereAgent", "am-1"),
        ("get", "VsphereAgentPool", POOL),
        ("update-status", "VsphereAgentPool", POOL),
    ]
    agent = h.api.find(kinds.AGENT, NS, "a1")
    assert agent is not None
    assert agent["spec"]["hostname"] == "vm-1"
    va = h.api.find(kinds.VSPHERE_AGENT, NS, "am-1")
    assert va is not None
    assert va["status"]["vm"]["phase"] == "Available"
    written = status(h)
    assert written["agentMachines"] == 1
    assert written["matchingAgents"] == 1
    assert [vm["phase"] for vm in written["ownedVMs"]] == ["Available"]
    assert written["ownedVMs"][0]["source"] == "VsphereAgent"
    assert written["observedGeneration"] == 1
    assert {c["type"] for c in written["conditions"]} >= {
        "Ready",
        "AgentMachineDemandFound",
        "InfraEnvAvailable",
        "CapacitySatisfied",
    }
    assert "AgentsPrepared" in h.events.reasons()


async def test_one_event_per_agent_preparation_not_planned_and_prepared() -> None:
    h = world()
    await reconcile(h)
    assert h.events.reasons() == ["AgentsPrepared"]
    assert "a1 (VM vm-1)" in h.events.events[0].message


async def test_a_clean_up_is_reported_by_cleanup_started_not_planned() -> None:
    h = world()
    h.api.put(vsphere_agent_obj("orphan", phase="Orphaned", reason="AgentMissing",
                                transition=ago(hours=2)))  # fmt: skip
    h.sync()
    await reconcile(h)
    assert [e.message for e in h.events.events if e.reason == "Planned"] == []
    (cleanup,) = [e.message for e in h.events.events if e.reason == "CleanupStarted"]
    assert "orphan (VM vm-orphan: " in cleanup


async def test_a_deletion_the_cache_does_not_show_yet_is_not_planned_again() -> None:
    h = world()
    h.api.put(vsphere_agent_obj("orphan", phase="Orphaned", reason="AgentMissing",
                                transition=ago(hours=2)))  # fmt: skip
    h.sync()
    reconciler = pool.PoolReconciler(h.deps)
    await reconciler.reconcile(KEY)
    assert ("delete", "VsphereAgent", "orphan") in h.api.verbs()
    h.api.calls.clear()
    await reconciler.reconcile(KEY)  # woken before the watch brought the deletion
    assert h.api.calls == []
    h.sync()
    await reconciler.reconcile(KEY)
    assert ("delete", "VsphereAgent", "orphan") not in h.api.verbs()


async def test_a_conflict_on_the_finalizer_patch_requeues_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = world(finalizers=[])
    h.api.faults[("patch", "VsphereAgentPool")] = errors.Conflict(
        status=409, reason="Conflict", message="the object has been modified"
    )
    with caplog.at_level(logging.DEBUG):
        result = await reconcile(h)
    assert getattr(result, "requeue", False) is True
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert h.api.verbs() == [("patch", "VsphereAgentPool", POOL)]  # nothing else this pass


async def test_a_real_failure_of_the_finalizer_patch_still_raises() -> None:
    h = world(finalizers=[])
    h.api.faults[("patch", "VsphereAgentPool")] = errors.Forbidden(
        status=403, reason="Forbidden", message="forbidden"
    )
    with pytest.raises(errors.Forbidden):
        await reconcile(h)


async def test_steady_state_costs_no_request_and_no_event() -> None:
    h = world()
    await reconcile(h)  # prepares the Agent
    h.sync()
    await reconcile(h)  # records the resulting no-op plan
    h.sync()
    h.api.calls.clear()
    h.events.events.clear()
    assert await reconcile(h) is None
    assert h.api.calls == []
    assert h.events.events == []


async def test_the_infra_controllers_conditions_are_kept_and_feed_ready() -> None:
    h = world()
    found = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert found is not None
    found["status"] = {
        "conditions": [
            {"type": t, "status": "True", "reason": "OK", "message": "",
             "lastTransitionTime": "2026-03-01T00:00:00Z"}
            for t in ("VsphereReady", "ISOReady")
        ],
        "iso": {"path": "[iso-ds] x.iso"},
    }  # fmt: skip
    h.sync()
    await reconcile(h)
    written = status(h)
    by_type = {c["type"]: c for c in written["conditions"]}
    assert by_type["Ready"]["status"] == "True"
    assert by_type["VsphereReady"]["reason"] == "OK"
    assert written["iso"] == {"path": "[iso-ds] x.iso"}


@pytest.mark.parametrize(
    ("fault", "reason", "fix"),
    [
        (
            errors.Forbidden(status=403, reason="Forbidden", message="agents is forbidden"),
            "Forbidden",
            "config/rbac",
        ),
        (
            errors.Invalid(status=422, reason="Invalid", message="denied by a webhook"),
            "ReconcileFailed",
            "admission webhooks",
        ),
    ],
)
async def test_a_failed_step_is_reported_and_retried(
    fault: errors.KubeError, reason: str, fix: str
) -> None:
    h = world()
    h.api.faults[("patch", "Agent")] = fault
    result = await reconcile(h)
    assert getattr(result, "requeue", False) is True
    ready = next(c for c in status(h)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert f"patch Agent {NS}/a1" in ready["message"]
    assert fix in ready["message"]
    warning = next(e for e in h.events.events if e.reason == "ApplyFailed")
    assert warning.type == "Warning"
    assert "a1" in warning.message


async def test_cleanup_deletes_the_vsphere_agent_with_a_uid_precondition() -> None:
    h = harness(
        pool_obj(),
        infra_env_obj(),
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )  # fmt: skip
    await reconcile(h)
    delete = next(c for c in h.api.calls if c.verb == "delete")
    assert (delete.kind, delete.name, delete.uid) == ("VsphereAgent", "am-1", "uid-va-am-1")
    assert not any(c.verb == "update-status" and c.kind == "VsphereAgent" for c in h.api.calls)
    assert status(h)["ownedVMs"] == []
    assert "CleanupStarted" in h.events.reasons()


async def test_retain_deletes_nothing() -> None:
    h = harness(
        pool_obj(cleanupPolicy="Retain"),
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted", agent_ref="a1"
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    await reconcile(h)
    assert not any(c.verb == "delete" for c in h.api.calls)


async def test_the_next_orphan_deadline_is_the_requeue_delay() -> None:
    h = harness(
        pool_obj(),
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), created=ago(minutes=10)),
    )
    result = await reconcile(h)
    expected = (ORPHAN_GRACE - ago(minutes=0).__sub__(ago(minutes=10))).total_seconds()
    assert getattr(result, "requeue_after", None) == expected + 1.0


async def test_a_deleted_pool_deletes_its_vsphere_agents_then_drops_its_finalizer() -> None:
    deleting = pool_obj()
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    va = vsphere_agent_obj("am-1", bios_uuid=uuid(1))
    va["metadata"]["finalizers"] = [names.FINALIZER_VSPHERE_AGENT]
    h = harness(deleting, va)
    await reconcile(h)
    assert ("delete", "VsphereAgent", "am-1") in h.api.verbs()
    ready = next(c for c in status(h)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Deleting")
    assert h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL) is not None  # finalizer holds it

    found = h.api.find(kinds.VSPHERE_AGENT, NS, "am-1")
    assert found is not None
    del h.api.objects[("VsphereAgent", NS, "am-1")]  # the vm controller finished
    h.sync()
    await reconcile(h)
    assert h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL) is None
    assert "Finalized" in h.events.reasons()


async def test_metrics_follow_the_pool_and_vanish_with_it() -> None:
    h = world()
    await reconcile(h)
    labels = {"namespace": NS, "pool": POOL, "state": "agent_machines"}
    assert REGISTRY.get_sample_value("agent_forge_pool_capacity", labels) == 1.0
    assert (
        REGISTRY.get_sample_value(
            "agent_forge_pool_vm_memory_bytes", {"namespace": NS, "pool": POOL}
        )
        == 16384 * 1024**2
    )
    del h.api.objects[("VsphereAgentPool", NS, POOL)]
    h.sync()
    await reconcile(h)
    assert REGISTRY.get_sample_value("agent_forge_pool_capacity", labels) is None


async def test_an_ambiguous_pool_reports_and_cleans_nothing() -> None:
    h = harness(
        pool_obj(),
        pool_obj(name="twin"),
        agent_machine_obj("am-1"),
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted", agent_ref="a1"
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    await reconcile(h)
    assert not any(c.verb == "delete" for c in h.api.calls)
    demand = next(c for c in status(h)["conditions"] if c["type"] == "AgentMachineDemandFound")
    assert demand["reason"] == "AmbiguousPoolMatch"
    assert f"{NS}/twin" in demand["message"]
    assert CPNS in demand["message"]


async def test_the_pool_is_parsed_once_per_resource_version() -> None:
    """Every reconcile of one version reads the informer's one record of it."""
    h = world()
    reconciler = pool.PoolReconciler(h.deps)
    pools = h.informers[kinds.VSPHERE_AGENT_POOL]
    await reconciler.reconcile(KEY)
    first = records.record(pools, KEY, VsphereAgentPool)
    assert first is not None
    await reconciler.reconcile(KEY)  # the same version: the parse is reused
    assert records.record(pools, KEY, VsphereAgentPool) is first
    changed = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert changed is not None
    changed["spec"]["agent"]["approve"] = not changed["spec"]["agent"].get("approve", False)
    changed["metadata"]["resourceVersion"] = "9999"
    h.sync()
    await reconciler.reconcile(KEY)  # a new version is parsed again
    second = records.record(pools, KEY, VsphereAgentPool)
    assert second is not None
    assert second is not first
    assert second.spec.agent.approve is changed["spec"]["agent"]["approve"]


async def test_an_unreadable_pool_gets_a_warning_saying_why_and_nothing_else() -> None:
    h = world()
    broken = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert broken is not None
    broken["spec"]["nodePoolRef"] = "not-a-reference"
    broken["metadata"]["resourceVersion"] = "9999"
    h.sync()
    calls = len(h.api.calls)
    assert await reconcile(h) is None
    (event,) = [e for e in h.events.events if e.reason == "InvalidPool"]
    assert event.type == "Warning"
    assert "1 errors, first: " in event.message
    assert h.api.calls[calls:] == []


def _released_with_pool_labels() -> Harness:
    """A Released VM whose Machine is gone; its Agent, unbound, still carries the pool's
    labels (an AgentMachine of the pool could bind it)."""
    return harness(
        pool_obj(),
        infra_env_obj(),
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1), labels={"customer": "acme"}, approved=True),
    )  # fmt: skip


async def test_cleanup_unlabels_the_agent_then_deletes_once_the_cache_shows_it() -> None:
    h = _released_with_pool_labels()
    seen = h.api.find(kinds.AGENT, NS, "a1")
    assert seen is not None
    version = seen["metadata"]["resourceVersion"]
    await reconcile(h)
    assert not any(c.verb == "delete" for c in h.api.calls)
    (unlabel,) = [c for c in h.api.calls if c.kind == "Agent"]
    assert (unlabel.verb, unlabel.name) == ("patch", "a1")
    assert unlabel.body == {
        "metadata": {"labels": {"customer": None}, "resourceVersion": version},
        "spec": {"approved": False},
    }
    planned = status(h)["plannedActions"]
    assert [(a["type"], a["name"]) for a in planned] == [("PatchAgent", "a1")]

    h.sync()  # the Agent's update reaches the cache (and wakes the pool)
    h.api.calls.clear()
    await reconcile(h)
    assert ("delete", "VsphereAgent", "am-1") in h.api.verbs()
    assert not any(c.kind == "Agent" for c in h.api.calls)


async def test_a_vm_on_its_way_out_gets_no_progress_only_status_write() -> None:
    """Recorded Bound, its Machine gone, its Agent released: the plan unlabels the Agent
    and writes no `Released` record (progress only: the next plan derives it again from
    the cache, and deletes)."""
    h = harness(
        pool_obj(),
        infra_env_obj(),
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Bound", reason="AgentBound",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1), labels={"customer": "acme"}, approved=True),
    )  # fmt: skip
    await reconcile(h)
    assert [c.verb for c in h.api.calls if c.kind == "Agent"] == ["patch"]
    assert not any(c.verb == "update-status" and c.kind == "VsphereAgent" for c in h.api.calls)

    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    assert ("delete", "VsphereAgent", "am-1") in h.api.verbs()
    assert not any(c.verb == "update-status" and c.kind == "VsphereAgent" for c in h.api.calls)


async def test_an_agent_changed_before_its_unlabelling_is_planned_again_not_deleted() -> None:
    """CAPI bound the Agent after the cache was read: the unlabelling's version
    precondition fails (409), nothing is deleted, the pool plans again; the next plan
    sees the Agent bound and leaves the VM (and the Agent's labels) alone."""
    h = _released_with_pool_labels()
    agent = h.api.find(kinds.AGENT, NS, "a1")
    assert agent is not None
    agent["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = "am-9"
    agent["spec"]["clusterDeploymentName"] = {"name": "demo", "namespace": CPNS}
    h.api._bump(agent)  # on the server only: the cache still shows it unbound
    result = await reconcile(h)
    assert getattr(result, "requeue", False) is True
    assert not any(c.verb == "delete" for c in h.api.calls)
    assert agent["metadata"]["labels"]["customer"] == "acme"
    assert not [e for e in h.events.events if e.reason == "ApplyFailed"]

    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    assert not any(c.verb == "delete" or c.kind == "Agent" for c in h.api.calls)
    va = h.api.find(kinds.VSPHERE_AGENT, NS, "am-1")
    assert va is not None
    assert va["status"]["vm"]["phase"] == "Bound"
