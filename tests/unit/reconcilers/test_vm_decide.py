"""What the vm controller may do to a VM, given its record and what vSphere reports."""

from __future__ import annotations

from datetime import UTC, datetime

from agentforge import vsphere
from agentforge.api import names, wire
from agentforge.api.vsphereagent import CreationRecord, Ownership, VsphereAgent
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm.decide import AdoptStep, ResumeStep

UUID = "4211aa00-1111-2222-3333-444455556666"
OTHER_UUID = "4211aa00-9999-2222-3333-444455556666"
MARKERS = vsphere.OwnershipMarkers(
    pool_namespace="ns", pool_name="pool", pool_uid="uid-1", vsphere_agent="va-1"
)


def facts(
    *,
    name: str = "w-12345678",
    uuid: str | None = UUID,
    markers: dict[str, str] | None = None,
    power: vsphere.PowerState = vsphere.PowerState.ON,
) -> vsphere.VmFacts:
    return vsphere.VmFacts(
        moid="vm-1",
        name=name,
        bios_uuid=uuid,
        instance_uuid=None,
        primary_mac="00:50:56:00:00:01",
        macs=("00:50:56:00:00:01",),
        power_state=power,
        markers=MARKERS.to_extra_config() if markers is None else markers,
        cdroms=(),
        question=None,
    )


def foreign() -> dict[str, str]:
    other = vsphere.OwnershipMarkers(
        pool_namespace="ns", pool_name="pool", pool_uid="uid-OLD", vsphere_agent="va-1"
    )
    return other.to_extra_config()


def record() -> CreationRecord:
    return CreationRecord(
        vm_name="w-12345678",
        bios_uuid=UUID,
        ownership=Ownership(
            pool_namespace="ns", pool_name="pool", pool_uid="uid-1", vsphere_agent="va-1"
        ),
        datacenter="dc1",
        folder="f",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


# --- ownership ------------------------------------------------------------------------


def test_a_vm_with_our_exact_markers_is_ours() -> None:
    got = vm_decide.ownership(facts(), expected=MARKERS, recorded_uuid=None, recorded_name=None)
    assert got is vm_decide.Ownership.OURS


def test_markers_of_a_recreated_pool_of_the_same_name_are_not_ours() -> None:
    got = vm_decide.ownership(
        facts(markers=foreign()), expected=MARKERS, recorded_uuid=UUID, recorded_name="w-12345678"
    )
    assert got is vm_decide.Ownership.NOT_OURS


def test_an_unmarked_vm_is_ours_only_when_uuid_and_name_match_the_record() -> None:
    unmarked = facts(markers={})
    assert (
        vm_decide.ownership(
            unmarked, expected=MARKERS, recorded_uuid=UUID.upper(), recorded_name="w-12345678"
        )
        is vm_decide.Ownership.UNMARKED_MATCH
    )
    for uuid, name in ((OTHER_UUID, "w-12345678"), (UUID, "other"), (None, "w-12345678")):
        got = vm_decide.ownership(
            unmarked, expected=MARKERS, recorded_uuid=uuid, recorded_name=name
        )
        assert got is vm_decide.Ownership.NOT_OURS


# --- resuming a recorded creation -------------------------------------------------------


def test_no_vm_by_uuid_or_name_means_create() -> None:
    assert vm_decide.resume(record(), by_uuid=None, by_name=None).step is ResumeStep.CREATE


def test_our_running_vm_found_by_uuid_is_recorded_without_another_call() -> None:
    got = vm_decide.resume(record(), by_uuid=facts(), by_name=None)
    assert got.step is ResumeStep.RECORD


def test_our_powered_off_vm_is_finished_through_the_idempotent_create() -> None:
    got = vm_decide.resume(record(), by_uuid=facts(power=vsphere.PowerState.OFF), by_name=None)
    assert got.step is ResumeStep.FINISH


def test_our_vm_found_only_by_name_is_finished() -> None:
    got = vm_decide.resume(record(), by_uuid=None, by_name=facts(uuid=OTHER_UUID))
    assert got.step is ResumeStep.FINISH


def test_a_vm_with_our_name_but_other_markers_is_a_conflict_never_touched() -> None:
    got = vm_decide.resume(record(), by_uuid=None, by_name=facts(markers=foreign()))
    assert got.step is ResumeStep.CONFLICT
    got = vm_decide.resume(record(), by_uuid=None, by_name=facts(markers={}))
    assert got.step is ResumeStep.CONFLICT


def test_a_vm_holding_our_uuid_without_our_markers_is_a_conflict() -> None:
    got = vm_decide.resume(record(), by_uuid=facts(markers={}), by_name=None)
    assert got.step is ResumeStep.CONFLICT


# --- resuming after a restart: the recorded create task first ---------------------------------


def task(
    state: vsphere.TaskState,
    *,
    moid: str = "task-7",
    result: str | None = None,
    error: vsphere.VsphereError | None = None,
) -> vsphere.TaskFacts:
    return vsphere.TaskFacts(
        moid=moid,
        state=state,
        description_id="Folder.createVm",
        result_moid=result,
        error=error,
    )


def recorded_task(ref: str = "task-7") -> CreationRecord:
    return record().model_copy(update={"task_ref": ref})


def test_a_recorded_create_task_still_running_means_wait_whatever_the_lookups_say() -> None:
    for state in (vsphere.TaskState.QUEUED, vsphere.TaskState.RUNNING):
        got = vm_decide.resume(recorded_task(), by_uuid=None, by_name=None, task=task(state))
        assert got.step is ResumeStep.WAIT
        assert "task-7" in got.why


def test_the_vm_a_succeeded_task_made_is_finished_not_created_again() -> None:
    done = task(vsphere.TaskState.SUCCESS, result="vm-1")
    got = vm_decide.resume(
        recorded_task(), by_uuid=facts(power=vsphere.PowerState.OFF), by_name=None, task=done
    )
    assert got.step is ResumeStep.FINISH
    got = vm_decide.resume(recorded_task(), by_uuid=facts(), by_name=None, task=done)
    assert got.step is ResumeStep.RECORD


def test_a_duplicate_name_failure_takes_over_our_vm_found_by_name() -> None:
    dup = task(vsphere.TaskState.ERROR, error=vsphere.AlreadyExists("DuplicateName"))
    got = vm_decide.resume(recorded_task(), by_uuid=None, by_name=facts(uuid=OTHER_UUID), task=dup)
    assert got.step is ResumeStep.FINISH


def test_a_duplicate_name_failure_with_someone_elses_vm_is_a_conflict_left_alone() -> None:
    dup = task(vsphere.TaskState.ERROR, error=vsphere.AlreadyExists("DuplicateName"))
    for markers in (foreign(), {}):
        got = vm_decide.resume(
            recorded_task(), by_uuid=None, by_name=facts(markers=markers), task=dup
        )
        assert got.step is ResumeStep.CONFLICT


def test_a_failed_task_whose_vm_is_absent_is_created_again_naming_the_failure() -> None:
    failed = task(vsphere.TaskState.ERROR, error=vsphere.TaskFailed("no room on ds1"))
    got = vm_decide.resume(recorded_task(), by_uuid=None, by_name=None, task=failed)
    assert got.step is ResumeStep.CREATE
    assert "no room on ds1" in got.why


def test_a_task_vcenter_forgot_is_not_absence_while_a_create_runs_in_the_folder() -> None:
    running = [task(vsphere.TaskState.RUNNING, moid="task-99")]
    got = vm_decide.resume(
        recorded_task(), by_uuid=None, by_name=None, task_gone=True, creates_in_flight=running
    )
    assert got.step is ResumeStep.WAIT
    assert "no longer knows" in got.why
    assert "task-99" in got.why


def test_a_task_vcenter_forgot_is_created_again_only_when_absent_by_uuid_and_name() -> None:
    got = vm_decide.resume(recorded_task(), by_uuid=None, by_name=None, task_gone=True)
    assert got.step is ResumeStep.CREATE
    got = vm_decide.resume(recorded_task(), by_uuid=facts(), by_name=None, task_gone=True)
    assert got.step is ResumeStep.RECORD
    got = vm_decide.resume(
        recorded_task(), by_uuid=None, by_name=facts(uuid=OTHER_UUID), task_gone=True
    )
    assert got.step is ResumeStep.FINISH


def test_without_a_recorded_task_a_create_running_in_the_folder_is_waited_for() -> None:
    running = [task(vsphere.TaskState.RUNNING, moid="task-3")]
    got = vm_decide.resume(record(), by_uuid=None, by_name=None, creates_in_flight=running)
    assert got.step is ResumeStep.WAIT
    assert "no create task was recorded" in got.why


def test_a_found_vm_is_decided_on_even_while_other_creates_run_in_the_folder() -> None:
    running = [task(vsphere.TaskState.RUNNING, moid="task-3")]
    got = vm_decide.resume(record(), by_uuid=facts(), by_name=None, creates_in_flight=running)
    assert got.step is ResumeStep.RECORD


# --- adoption --------------------------------------------------------------------------


def test_adopting_a_vm_that_is_not_there_creates_nothing() -> None:
    got = vm_decide.adoption(None, name="legacy", bios_uuid=None, expected=MARKERS)
    assert got.step is AdoptStep.UNAVAILABLE


def test_an_unmarked_vm_whose_name_and_uuid_match_is_stamped() -> None:
    got = vm_decide.adoption(
        facts(name="legacy", markers={}), name="legacy", bios_uuid=UUID, expected=MARKERS
    )
    assert got.step is AdoptStep.STAMP


def test_a_vm_whose_uuid_or_name_differs_from_the_record_is_not_stamped() -> None:
    unmarked = facts(name="legacy", markers={})
    assert (
        vm_decide.adoption(unmarked, name="legacy", bios_uuid=OTHER_UUID, expected=MARKERS).step
        is AdoptStep.UNAVAILABLE
    )
    assert (
        vm_decide.adoption(unmarked, name="other", bios_uuid=UUID, expected=MARKERS).step
        is AdoptStep.UNAVAILABLE
    )


def test_a_vm_with_another_owners_markers_is_left_alone() -> None:
    got = vm_decide.adoption(
        facts(name="legacy", markers=foreign()), name="legacy", bios_uuid=None, expected=MARKERS
    )
    assert got.step is AdoptStep.MISMATCH


def test_a_vm_already_carrying_our_markers_is_adopted_as_is() -> None:
    got = vm_decide.adoption(facts(name="legacy"), name="legacy", bios_uuid=None, expected=MARKERS)
    assert got.step is AdoptStep.ADOPTED


# --- the recorded identity ---------------------------------------------------------------


def agent(status: dict[str, object], annotations: dict[str, str] | None = None) -> VsphereAgent:
    return VsphereAgent.model_validate(
        {
            "metadata": {"name": "va-1", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"poolRef": {"name": "pool"}},
            "status": status,
        }
    )


def test_the_creation_record_names_the_vm_before_status_vm_does() -> None:
    va = agent({"creation": wire.to_wire(record()), "vm": {"name": "stale"}})
    assert vm_decide.recorded_identity(va) == ("w-12345678", UUID)


def test_the_vm_name_annotation_is_the_last_resort() -> None:
    va = agent({}, {names.ANNOTATION_VM_NAME: "legacy"})
    assert vm_decide.recorded_identity(va) == ("legacy", None)
    assert vm_decide.recorded_identity(agent({})) == (None, None)


# --- a noted power-on's outcome ----------------------------------------------------------


def ended(state: vsphere.TaskState, error: vsphere.VsphereError | None = None) -> vsphere.TaskFacts:
    return vsphere.TaskFacts(moid="task-7", state=state, error=error)


def test_a_noted_power_on_that_succeeded_is_done_without_a_lookup() -> None:
    assert vm_decide.power_on_ended(ended(vsphere.TaskState.SUCCESS)) is vm_decide.PowerOnEnd.DONE


def test_a_noted_power_on_still_queued_or_running_is_waited_for() -> None:
    for state in (vsphere.TaskState.QUEUED, vsphere.TaskState.RUNNING):
        assert vm_decide.power_on_ended(ended(state)) is vm_decide.PowerOnEnd.WAIT


def test_a_power_on_refused_as_already_on_or_busy_or_forgotten_leaves_it_to_the_vm() -> None:
    already_on = vsphere.InvalidState("power on VM w-1 failed", fault="InvalidPowerState")
    busy = vsphere.TransientError("power on VM w-1 failed", fault="TaskInProgress")
    for error in (already_on, busy):
        outcome = vm_decide.power_on_ended(ended(vsphere.TaskState.ERROR, error))
        assert outcome is vm_decide.PowerOnEnd.LOOK_UP, error.fault
    assert vm_decide.power_on_ended(None) is vm_decide.PowerOnEnd.LOOK_UP  # vCenter forgot it
    # An error state without a fault says nothing about the VM: the VM decides too.
    assert vm_decide.power_on_ended(ended(vsphere.TaskState.ERROR)) is vm_decide.PowerOnEnd.LOOK_UP


def test_any_other_power_on_fault_is_a_failure_to_report() -> None:
    for error in (
        vsphere.TaskFailed("power on VM w-1 failed", fault="InsufficientResourcesFault"),
        vsphere.PermissionDenied("power on VM w-1 failed", fault="NoPermission"),
        vsphere.NotFound("power on VM w-1 failed", fault="ManagedObjectNotFound"),
    ):
        outcome = vm_decide.power_on_ended(ended(vsphere.TaskState.ERROR, error))
        assert outcome is vm_decide.PowerOnEnd.FAILED, error.fault
