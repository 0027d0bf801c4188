"""Resuming a recorded ISO ejection: the record alone decides, and refuses what is not its own."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api.vsphereagent import ISOEjectionPhase, ISOEjectionRecord
from agentforge.reconcilers.ejection import decide
from agentforge.reconcilers.ejection.decide import Device, Observation, StepKind
from tests.unit.reconcilers import ejection_support as es
from tests.unit.reconcilers.ejection_support import seen, step

K = StepKind
LOCK = es.question("_vmx3")
OTHER = es.question("_vmx4", message="msg.uuid.altered")


def record(phase: str = "Recorded", **kw: Any) -> ISOEjectionRecord:
    return ISOEjectionRecord.model_validate(es.record(phase=phase, **kw))


# --- issuing the disconnect ----------------------------------------------------------------


def test_a_recorded_ejection_issues_the_disconnect() -> None:
    assert step(record(), seen()).kind is K.ISSUE


def test_after_a_restart_in_disconnect_issued_a_running_reconfigure_is_looked_for_first() -> None:
    assert step(record("DisconnectIssued"), seen(running=None)).kind is K.FOLLOW


def test_a_disconnect_that_never_ran_is_issued_again() -> None:
    assert step(record("DisconnectIssued"), seen(running=False)).kind is K.ISSUE


# --- the lock question ---------------------------------------------------------------------


def test_the_lock_question_of_our_running_disconnect_is_recorded_with_its_id() -> None:
    result = step(record("DisconnectIssued"), seen(running=True, question=LOCK))
    assert result.kind is K.RECORD_QUESTION
    assert result.question_id == LOCK.id


def test_a_lock_question_seen_without_knowing_what_runs_is_followed_first() -> None:
    assert step(record("DisconnectIssued"), seen(running=None, question=LOCK)).kind is K.FOLLOW


def test_a_lock_question_without_a_disconnect_of_ours_running_is_refused() -> None:
    result = step(record("DisconnectIssued"), seen(running=False, question=LOCK))
    assert result.kind is K.REFUSE


def test_only_the_recorded_question_id_is_answered() -> None:
    rec = record("QuestionRecorded", questionID=LOCK.id)
    result = step(rec, seen(question=LOCK))
    assert result.kind is K.ANSWER
    assert result.question_id == LOCK.id


def test_a_different_lock_question_than_the_recorded_one_is_refused() -> None:
    rec = record("QuestionRecorded", questionID="_vmx1")
    result = step(rec, seen(question=LOCK))
    assert result.kind is K.REFUSE
    assert "_vmx1" in result.message


@pytest.mark.parametrize("phase", ["Recorded", "DisconnectIssued", "QuestionRecorded", "Answered"])
def test_an_unrelated_question_is_never_answered(phase: str) -> None:
    rec = record(phase, questionID=OTHER.id if phase in ("QuestionRecorded", "Answered") else None)
    result = step(rec, seen(running=True, question=OTHER))
    assert result.kind is K.REFUSE
    assert "nothing was touched" in result.message


def test_a_question_pending_before_the_disconnect_was_issued_is_refused() -> None:
    result = step(record(), seen(question=LOCK))
    assert result.kind is K.REFUSE
    assert "pending before agent-forge sent its disconnect" in result.message


def test_an_answered_question_still_shown_is_waited_for() -> None:
    rec = record("Answered", questionID=LOCK.id)
    assert step(rec, seen(question=LOCK)).kind is K.WAIT


def test_a_lock_question_answered_by_someone_else_is_not_overridden() -> None:
    rec = record("QuestionRecorded", questionID=LOCK.id)
    assert step(rec, seen(running=None)).kind is K.FOLLOW
    result = step(rec, seen(running=False))
    assert result.kind is K.REFUSE
    assert "does not override" in result.message
    assert "/status/isoEjection" in result.message


def test_a_disconnect_that_failed_after_our_yes_restarts() -> None:
    rec = record("Answered", questionID=LOCK.id)
    assert step(rec, seen(running=False)).kind is K.RESTART


# --- done, and refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Recorded", "DisconnectIssued", "QuestionRecorded", "Answered"])
@pytest.mark.parametrize(
    "obs",
    [seen(device=Device.EMPTY), seen(device=Device.GONE), seen(ejected=True)],
    ids=["empty", "device-gone", "our-task-finished"],
)
def test_an_empty_recorded_device_finishes_the_record(phase: str, obs: Observation) -> None:
    assert step(record(phase, questionID="_vmx3"), obs).kind is K.DONE


def test_the_end_says_who_emptied_the_device() -> None:
    vm = f"VM {es.VM} (BIOS UUID {es.UUID})"
    ours = step(record("DisconnectIssued"), seen(ejected=True))
    assert ours.message == (
        f"{es.ISO} was ejected from CD-ROM 3000 of {vm}: the device is disconnected and empty"
    )
    after_restart = step(record("Answered", questionID="_vmx3"), seen(device=Device.EMPTY))
    assert after_restart.message == ours.message
    someone = step(record("Recorded"), seen(device=Device.EMPTY))
    assert someone.message == (
        f"CD-ROM 3000 of {vm} was found disconnected and empty before agent-forge sent its "
        f"disconnect: {es.ISO} was removed outside agent-forge"
    )
    gone = step(record("DisconnectIssued"), seen(device=Device.GONE))
    assert gone.message == (
        f"CD-ROM 3000 of {vm} no longer exists (the device was removed from the VM), so "
        f"{es.ISO} is no longer attached"
    )


@pytest.mark.parametrize("phase", ["Recorded", "DisconnectIssued", "QuestionRecorded"])
def test_changed_media_is_refused(phase: str) -> None:
    result = step(record(phase, questionID="_vmx3"), seen(device=Device.OTHER, medium="[x] y.iso"))
    assert result.kind is K.REFUSE
    assert "media changed" in result.message


def test_a_vm_with_other_markers_is_refused_even_when_its_cdrom_is_empty() -> None:
    result = step(record(), seen(verdict=vsphere.Verdict.FOREIGN, device=Device.EMPTY))
    assert result.kind is K.REFUSE


def test_an_unmarked_vm_with_the_recorded_name_is_stamped_before_the_disconnect() -> None:
    assert step(record(), seen(verdict=vsphere.Verdict.UNMARKED)).kind is K.STAMP


def test_an_unmarked_vm_with_another_name_is_refused() -> None:
    obs = seen(verdict=vsphere.Verdict.UNMARKED, name_matches=False)
    assert step(record(), obs).kind is K.REFUSE


def test_markers_that_vanish_after_the_disconnect_was_issued_are_refused() -> None:
    obs = seen(verdict=vsphere.Verdict.UNMARKED)
    assert step(record("DisconnectIssued"), obs).kind is K.REFUSE


def test_a_record_from_another_vcenter_is_refused() -> None:
    result = decide.next_step(record(), seen(), server="other:443", finalizing=False)
    assert result.kind is K.REFUSE


def test_a_missing_vm_keeps_the_record_and_is_reported() -> None:
    result = step(record("DisconnectIssued"), Observation(exists=False))
    assert result.kind is K.REFUSE
    assert "kept" in result.message


# --- while the VsphereAgent is being deleted ---------------------------------------------------


def test_a_finalizing_agent_drops_a_record_whose_vm_is_gone() -> None:
    obs = Observation(exists=False)
    assert step(record("QuestionRecorded", questionID="_vmx3"), obs, finalizing=True).kind is K.DROP


def test_a_finalizing_agent_drops_a_refused_record_nothing_was_issued_for() -> None:
    assert step(record(), seen(question=OTHER), finalizing=True).kind is K.DROP


def test_a_finalizing_agent_still_finishes_an_issued_disconnect() -> None:
    rec = record("QuestionRecorded", questionID=LOCK.id)
    assert step(rec, seen(question=LOCK), finalizing=True).kind is K.ANSWER
    assert step(rec, seen(question=OTHER), finalizing=True).kind is K.REFUSE


# --- observations ------------------------------------------------------------------------------


def test_the_device_state_compares_with_the_exact_recorded_path() -> None:
    rec = record()
    assert decide.device_state(rec, es.cdrom()) is Device.ATTACHED
    assert decide.device_state(rec, es.cdrom(backing=None)) is Device.EMPTY
    assert decide.device_state(rec, es.cdrom(backing=es.ISO + ".old")) is Device.OTHER
    assert decide.device_state(rec, None) is Device.GONE


def test_a_go_operator_record_without_ownership_names_no_markers() -> None:
    go_record = es.record(disconnectStarted=True, questionID="q-1")
    for key in ("phase", "ownership", "server"):
        go_record.pop(key)
    rec = ISOEjectionRecord.model_validate(go_record)
    assert decide.record_markers(rec) is None
    assert isinstance(rec.phase, ISOEjectionPhase)  # a known phase, not an unknown string
    assert rec.phase.value == "QuestionRecorded"
