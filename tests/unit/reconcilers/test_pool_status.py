"""Status rendering: the pool controller writes its fields only, and only when they differ."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from agentforge.api.conditions import ConditionStatus, PoolConditionType
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning import pool_conditions
from agentforge.reconcilers.planning.planner import Ref, VMRecord
from agentforge.reconcilers.pool import status as pool_status
from tests.unit.reconcilers.planner_support import NOW, WHERE, World, agent_machine_obj

EARLIER = datetime(2026, 2, 1, tzinfo=UTC)


def record(**changes: Any) -> VMRecord:
    return VMRecord(
        vsphere_agent="va",
        name="vm-1",
        phase=VMPhase.BOUND,
        reason=VMReason.AGENT_BOUND,
        agent=Ref("a1", "uid-a1"),
        machine=Ref("m1", "uid-m1"),
        last_transition=NOW,
        changed=True,
    )._replace(**changes)


def test_the_vm_fields_of_the_vm_controller_are_kept() -> None:
    vm: dict[str, Any] = {
        "name": "vm-1",
        "biosUUID": "u",
        "macAddress": "00-50-56-00-00-01",
        "moRef": "vm-7",
    }
    assert pool_status.apply_vm(vm, record(), where=WHERE)
    assert vm["biosUUID"] == "u"
    assert vm["moRef"] == "vm-7"
    assert vm["phase"] == "Bound"
    assert vm["reason"] == "AgentBound"
    assert vm["agentRef"] == {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "name": "a1",
        "namespace": "demo",
        "uid": "uid-a1",
    }
    assert vm["machineRef"]["namespace"] == "clusters-demo"
    assert vm["lastTransitionTime"] == "2026-03-01T12:00:00Z"


def test_applying_the_same_record_again_changes_nothing() -> None:
    vm = {"name": "vm-1"}
    pool_status.apply_vm(vm, record(), where=WHERE)
    assert not pool_status.apply_vm(vm, record(last_transition=EARLIER), where=WHERE)


def test_the_transition_time_stays_while_the_phase_stays() -> None:
    vm = {"name": "vm-1", "phase": "Bound", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    pool_status.apply_vm(vm, record(), where=WHERE)
    assert vm["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_references_are_removed_when_the_record_has_none() -> None:
    vm = {"name": "vm-1"}
    pool_status.apply_vm(vm, record(), where=WHERE)
    pool_status.apply_vm(vm, record(phase=VMPhase.ORPHANED, agent=None, machine=None), where=WHERE)
    assert "agentRef" not in vm
    assert "machineRef" not in vm


def test_a_gone_machines_reference_is_kept_as_recorded() -> None:
    previous = {"kind": "Machine", "name": "m1", "namespace": "clusters-demo", "uid": "old"}
    vm = {"name": "vm-1", "machineRef": dict(previous)}
    pool_status.apply_vm(vm, record(machine=Ref("m1")), where=WHERE)
    assert vm["machineRef"] == previous


def test_a_missing_vm_name_is_filled_in() -> None:
    vm: dict[str, Any] = {}
    pool_status.apply_vm(vm, record(), where=WHERE)
    assert vm["name"] == "vm-1"


def _desired() -> pool_status.DesiredPoolStatus:
    plan = World().add(agent_machine_obj("am-1")).plan()
    return pool_status.desired_from_plan(plan, generation=3, owned_vms=[])


def test_a_dry_run_never_touches_the_cached_status() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    cached = {"conditions": [ready]}
    snapshot = copy.deepcopy(cached)
    assert pool_status.pool_would_change(cached, _desired(), now=NOW)
    assert cached == snapshot


def test_a_written_status_needs_no_second_write() -> None:
    status: dict[str, Any] = {}
    desired = _desired()
    assert pool_status.apply_pool(status, desired, now=NOW)
    assert not pool_status.pool_would_change(status, desired, now=NOW)
    assert status["observedGeneration"] == 3


def test_fields_and_conditions_of_the_infra_controller_are_kept() -> None:
    status: dict[str, Any] = {
        "iso": {"path": "[iso-ds] a.iso"},
        "conditions": [{"type": "ISOReady", "status": "False", "reason": "ISOCacheFailed",
                        "message": "upload failed", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }  # fmt: skip
    pool_status.apply_pool(status, _desired(), now=NOW)
    assert status["iso"] == {"path": "[iso-ds] a.iso"}
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["ISOReady"]["reason"] == "ISOCacheFailed"
    assert by_type["Ready"]["status"] == "False"
    assert "upload failed" in by_type["Ready"]["message"]


def test_a_controller_decided_ready_wins() -> None:
    desired = pool_status.desired_from_plan(
        World().plan(),
        generation=1,
        owned_vms=[],
        ready=pool_conditions.failed(message="could not patch Agent demo/a1"),
    )
    status: dict[str, Any] = {}
    pool_status.apply_pool(status, desired, now=NOW)
    ready = next(c for c in status["conditions"] if c["type"] == PoolConditionType.READY)
    assert (ready["status"], ready["reason"]) == (ConditionStatus.FALSE, "ReconcileFailed")
