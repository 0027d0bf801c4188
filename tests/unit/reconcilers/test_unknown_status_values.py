"""Status values another version wrote (docs/design/0003): reconciled, never acted on blindly.

* An unknown VM phase or planned action type is recomputed by the pool controller.
* An unknown VM phase starts no ISO ejection until it is recomputed (it may mean Released).
* An unknown creation phase changes nothing: a record is resumed by asking vCenter first.
* An unknown ISO ejection phase may have anything in flight: a running disconnect is
  followed and an emptied CD-ROM ends it, but nothing is issued, answered, restarted,
  stamped or dropped, also not while the VsphereAgent is deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.api.pool import PlannedActionType
from agentforge.api.vm import VMPhase
from agentforge.api.vsphereagent import (
    CreationPhase,
    CreationRecord,
    ISOEjectionRecord,
    Ownership,
)
from agentforge.kube.controller import Result
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.ejection.decide import Device, StepKind
from agentforge.reconcilers.pool import reconcile as pool
from agentforge.reconcilers.vm import decide as vm_decide
from tests.unit.reconcilers import ejection_support as es
from tests.unit.reconcilers import planner_support as ps
from tests.unit.reconcilers.controller_support import harness
from tests.unit.reconcilers.ejection_support import seen, step

UNKNOWN = "FromANewerVersion"
K = StepKind
STEP = ejection.Ejection()


# --- the pool controller recomputes what it does not know ----------------------------------


async def test_unknown_values_in_pool_status_are_recomputed_not_reported_invalid() -> None:
    h = harness(
        ps.pool_obj(
            status={
                "plannedActions": [{"type": "CreateVM", "reason": "an older Go release"}],
                "ownedVMs": [{"name": "vm-1", "phase": UNKNOWN, "source": UNKNOWN}],
            }
        ),
        ps.infra_env_obj(),
        ps.agent_machine_obj("am-1"),
        ps.machine_obj("am-1"),
        ps.vsphere_agent_obj(
            "am-1",
            vm_name="vm-1",
            bios_uuid=ps.uuid(1),
            phase=UNKNOWN,
            created=ps.ago(minutes=5),
        ),
        ps.agent_obj("a1", bios_uuid=ps.uuid(1)),
    )
    await pool.PoolReconciler(h.deps).reconcile(ObjectKey(f"{ps.NS}/{ps.POOL}"))
    assert "InvalidPool" not in [e.reason for e in h.events.events]
    va = h.api.find(kinds.VSPHERE_AGENT, ps.NS, "am-1")
    assert va is not None
    assert va["status"]["vm"]["phase"] == VMPhase.AVAILABLE
    written = h.api.find(kinds.VSPHERE_AGENT_POOL, ps.NS, ps.POOL)
    assert written is not None
    assert [vm["phase"] for vm in written["status"]["ownedVMs"]] == [VMPhase.AVAILABLE]
    types = {a["type"] for a in written["status"]["plannedActions"]}
    assert types <= {t.value for t in PlannedActionType}


# --- no new ejection while the VM's phase is unknown ----------------------------------------


async def test_an_unknown_vm_phase_starts_no_ejection_and_calls_no_vsphere() -> None:
    s = es.setup(es.vsphere_agent(phase=UNKNOWN), es.installed_agent())
    inputs, writer = s.ctx()
    assert await STEP.reconcile(inputs=inputs, writer=writer) is None
    assert s.service.calls == []
    assert [c for c in s.api.calls if c.verb == "update-status"] == []


# --- creation: the phase never decides ------------------------------------------------------


def creation(phase: str) -> CreationRecord:
    return CreationRecord.model_validate(
        {
            "vmName": "w-12345678",
            "biosUUID": es.UUID,
            "ownership": Ownership(
                pool_namespace="ns", pool_name="pool", pool_uid="uid-1", vsphere_agent="va-1"
            ).model_dump(by_alias=True),
            "datacenter": "dc1",
            "folder": "f",
            "phase": phase,
            "taskRef": "task-1",
            "startedAt": datetime(2026, 1, 1, tzinfo=UTC),
        }
    )


def create_task(state: vsphere.TaskState) -> vsphere.TaskFacts:
    return vsphere.TaskFacts(moid="task-1", state=state, description_id="Folder.createVm")


@pytest.mark.parametrize("phase", [*CreationPhase, UNKNOWN])
def test_a_creation_record_is_resumed_the_same_whatever_its_phase(phase: str) -> None:
    record = creation(phase)
    running = vm_decide.resume(
        record, by_uuid=None, by_name=None, task=create_task(vsphere.TaskState.RUNNING)
    )
    assert running.step is vm_decide.ResumeStep.WAIT
    in_flight = vm_decide.resume(
        record,
        by_uuid=None,
        by_name=None,
        task_gone=True,
        creates_in_flight=[create_task(vsphere.TaskState.RUNNING)],
    )
    assert in_flight.step is vm_decide.ResumeStep.WAIT


# --- ejection: the pure decision ------------------------------------------------------------


def unknown_record(**kw: Any) -> ISOEjectionRecord:
    return ISOEjectionRecord.model_validate(es.record(phase=UNKNOWN, **kw))


def test_an_unknown_ejection_phase_first_follows_what_may_be_running() -> None:
    assert step(unknown_record(), seen(running=None)).kind is K.FOLLOW


def test_an_unknown_ejection_phase_with_the_medium_still_attached_is_refused() -> None:
    result = step(unknown_record(), seen(running=False))
    assert result.kind is K.REFUSE
    assert repr(UNKNOWN) in result.message
    assert "status.isoEjection" in result.message


def test_an_unknown_ejection_phase_never_answers_even_the_recorded_question() -> None:
    lock = es.question("_vmx1")
    result = step(unknown_record(questionID="_vmx1"), seen(running=True, question=lock))
    assert result.kind is K.REFUSE


def test_an_unknown_ejection_phase_never_stamps_an_unmarked_vm() -> None:
    result = step(unknown_record(), seen(verdict=vsphere.Verdict.UNMARKED, running=False))
    assert result.kind is K.REFUSE


def test_an_unknown_ejection_phase_is_not_dropped_while_finalizing() -> None:
    assert step(unknown_record(), seen(running=False), finalizing=True).kind is K.REFUSE


def test_an_unknown_ejection_phase_ends_once_the_cdrom_is_empty() -> None:
    assert step(unknown_record(), seen(device=Device.EMPTY)).kind is K.DONE


# --- ejection: against the fake API server and a scripted VM --------------------------------


def with_unknown_record(vm: es.FakeVm, **kw: Any) -> es.Setup:
    return es.setup(
        es.vsphere_agent(record=es.record(phase=UNKNOWN, **kw)), es.installed_agent(), vm=vm
    )


async def test_a_record_in_an_unknown_phase_is_kept_and_nothing_is_sent_to_vsphere() -> None:
    s = with_unknown_record(es.FakeVm())
    inputs, writer = s.ctx()
    assert await STEP.reconcile(inputs=inputs, writer=writer) == Result(requeue=True)
    assert s.service.methods() == ["vm_by_uuid", "resume_eject"]
    assert s.vsphere_writes() == []
    assert s.reason() == "EjectionFailed"
    stored = s.stored_record()
    assert stored is not None
    assert (stored["phase"], stored["disconnectStarted"]) == (UNKNOWN, True)  # as written


async def test_a_disconnect_still_running_in_an_unknown_phase_is_followed_and_finished() -> None:
    s = with_unknown_record(es.FakeVm(running=3000))
    inputs, writer = s.ctx()
    assert await STEP.reconcile(inputs=inputs, writer=writer) == Result(requeue_after=300.0)
    assert s.woken == [es.KEY]  # its end was news
    inputs, writer = s.ctx()
    assert await STEP.reconcile(inputs=inputs, writer=writer) is None
    assert s.vsphere_writes() == []
    assert s.reason() == "Ejected"
    assert s.stored_record() is None


async def test_a_lock_question_in_an_unknown_phase_is_left_unanswered() -> None:
    vm = es.FakeVm(running=3000, questions=[es.question("_vmx1")])
    s = with_unknown_record(vm, questionID="_vmx1")
    inputs, writer = s.ctx()
    assert await STEP.reconcile(inputs=inputs, writer=writer) == Result(requeue=True)
    assert s.vsphere_writes() == []
    assert s.stored_record() is not None


async def test_deletion_waits_for_a_record_in_an_unknown_phase() -> None:
    s = with_unknown_record(es.FakeVm())
    inputs, writer = s.ctx()
    assert not await STEP.finish_before_delete(
        agent=inputs.agent, pool=inputs.pool, inputs=inputs, writer=writer
    )
    assert s.vsphere_writes() == []
    assert s.stored_record() is not None
