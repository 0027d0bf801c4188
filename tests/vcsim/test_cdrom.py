"""CD-ROM ejection: only our VM, only the expected ISO, and only the lock question answered."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.vsphere import (
    Credentials,
    EjectState,
    MediaMismatch,
    OwnershipMarkers,
    OwnershipMismatch,
    Placement,
    QuestionRefused,
    SessionRegistry,
    TaskState,
    VmFacts,
    VsphereService,
)
from sim.vsphere_tasks import TaskDriver
from tests.vcsim import support
from tests.vcsim.conftest import FAST

pytestmark = pytest.mark.vcsim

LOCK = "msg.cdromdisconnect.locked"


async def _vm(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> VmFacts:
    return await driver.create(service, support.request(placement, markers))


async def test_eject_disconnects_the_cdrom_and_clears_its_medium(
    driver: TaskDriver, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    outcome = await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=support.ISO,
        markers=markers,
    )
    assert outcome.state is EjectState.EJECTED
    assert outcome.cdrom is not None
    assert outcome.cdrom.backing_file is None
    assert not outcome.cdrom.connected
    assert not outcome.cdrom.start_connected
    again = await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=support.ISO,
        markers=markers,
    )
    assert again.state is EjectState.EJECTED
    assert again.already


async def test_a_started_disconnect_runs_on_followed_and_is_resumed_once_it_ended(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    vm_uuid = vm.bios_uuid or ""
    await vcsim.control.set_delay("ReconfigVM_Task", 3000, stage="task")
    try:
        slot = service.claim_task_slot(group="test", token="test")
        started = await service.eject_cdrom(
            datacenter="dc1",
            vm_uuid=vm_uuid,
            device_key=cd.key,
            expected_backing=support.ISO,
            markers=markers,
            slot=slot,
        )
        assert started.state is EjectState.IN_PROGRESS
        assert started.task_id is not None
        assert slot.task == started.task_id  # the slot is the followed task's until it ends
        running = await service.resume_eject(
            datacenter="dc1", vm_uuid=vm_uuid, device_key=cd.key
        )  # a pass woken by something else
        assert (running.state, running.task_id) == (EjectState.IN_PROGRESS, started.task_id)
    finally:
        await vcsim.control.clear_delays()
    done = await driver.settle(service, datacenter="dc1", vm_uuid=vm_uuid, device_key=cd.key)
    assert done.state is EjectState.EJECTED
    assert done.cdrom is not None
    assert done.cdrom.backing_file is None
    task = await service.task(task_ref=started.task_id)
    assert (task.state, task.error) == (TaskState.SUCCESS, None)


async def test_a_cdrom_whose_backing_changed_is_not_ejected(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    before = await vcsim.control.counters()
    with pytest.raises(MediaMismatch):
        await driver.eject(
            service,
            datacenter="dc1",
            vm_uuid=vm.bios_uuid or "",
            device_key=cd.key,
            expected_backing="[iso-ds] agent-forge/ns1/pool1/" + "cd" * 32 + ".iso",
            markers=markers,
        )
    after = await vcsim.control.counters()
    assert support.method_delta(before, after, "ReconfigVM_Task") == 0
    got = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert got is not None
    assert got.cdrom(cd.key) == cd


async def test_a_vm_without_our_markers_is_not_ejected(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    other = OwnershipMarkers(pool_namespace="x", pool_name="y", pool_uid="z", vsphere_agent="w")
    vm = await _vm(driver, service, placement, other)
    (cd,) = vm.cdroms
    before = await vcsim.control.counters()
    with pytest.raises(OwnershipMismatch):
        await driver.eject(
            service,
            datacenter="dc1",
            vm_uuid=vm.bios_uuid or "",
            device_key=cd.key,
            expected_backing=support.ISO,
            markers=markers,
        )
    after = await vcsim.control.counters()
    assert support.method_delta(before, after, "ReconfigVM_Task") == 0


async def test_the_locked_door_question_is_returned_then_answered_by_id(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    await vcsim.control.lock_cdrom(vm.moid)
    outcome = await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=support.ISO,
        markers=markers,
    )
    assert outcome.state is EjectState.QUESTION_PENDING
    assert outcome.question is not None
    assert outcome.question.message_ids == (LOCK,)
    assert outcome.task_id
    assert await vcsim.control.request_log("AnswerVM") == []  # returned, not answered

    await service.answer_cdrom_lock_question(
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        question_id=outcome.question.id,
        markers=markers,
    )
    done = await driver.settle(
        service, datacenter="dc1", vm_uuid=vm.bios_uuid or "", device_key=cd.key
    )
    assert done.state is EjectState.EJECTED
    answers = await vcsim.control.request_log("AnswerVM")
    assert len(answers) == 1


async def test_a_restarted_caller_resumes_the_recorded_disconnect(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    credentials: Credentials,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    await vcsim.control.lock_cdrom(vm.moid)
    first = await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=support.ISO,
        markers=markers,
    )
    assert first.question is not None
    # A new process: new registry, new session, nothing remembered but the record.
    registry = SessionRegistry(options=FAST)
    try:
        restarted = VsphereService(registry=registry, credentials=credentials)
        seen = await restarted.resume_eject(
            datacenter="dc1", vm_uuid=vm.bios_uuid or "", device_key=cd.key
        )
        assert seen.state is EjectState.QUESTION_PENDING
        assert seen.question == first.question
        assert seen.task_id == first.task_id
        await restarted.answer_cdrom_lock_question(
            datacenter="dc1",
            vm_uuid=vm.bios_uuid or "",
            question_id=first.question.id,
            markers=markers,
        )
        again = TaskDriver(registry)
        try:
            done = await again.settle(
                restarted, datacenter="dc1", vm_uuid=vm.bios_uuid or "", device_key=cd.key
            )
        finally:
            again.close()
    finally:
        await registry.close()
    assert done.state is EjectState.EJECTED


async def test_an_unrelated_question_is_left_alone(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    raised = await vcsim.control.raise_question(vm.moid, "msg.uuid.altered", "Did you move it?")
    got = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert got is not None
    assert got.question is not None
    with pytest.raises(QuestionRefused, match="not the CD-ROM lock question"):
        await service.answer_cdrom_lock_question(
            datacenter="dc1",
            vm_uuid=vm.bios_uuid or "",
            question_id=got.question.id,
            markers=markers,
        )
    assert await vcsim.control.request_log("AnswerVM") == []
    still = await service.vm_by_uuid(datacenter="dc1", bios_uuid=vm.bios_uuid or "")
    assert still is not None
    assert still.question == got.question
    assert raised


async def test_a_question_id_other_than_the_recorded_one_is_refused(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vm = await _vm(driver, service, placement, markers)
    (cd,) = vm.cdroms
    await vcsim.control.lock_cdrom(vm.moid)
    outcome = await driver.eject(
        service,
        datacenter="dc1",
        vm_uuid=vm.bios_uuid or "",
        device_key=cd.key,
        expected_backing=support.ISO,
        markers=markers,
    )
    assert outcome.question is not None
    with pytest.raises(QuestionRefused, match="not the recorded question"):
        await service.answer_cdrom_lock_question(
            datacenter="dc1", vm_uuid=vm.bios_uuid or "", question_id="_vmx999", markers=markers
        )
    assert await vcsim.control.request_log("AnswerVM") == []
