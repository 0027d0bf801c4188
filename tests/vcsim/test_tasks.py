"""One task waiter per session: many tasks, one filter, few long polls; every task
started, recorded, and read back once its end is news (the one task model)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.kube.store import ObjectKey
from agentforge.vsphere import (
    AlreadyExists,
    NotFound,
    OwnershipMarkers,
    Placement,
    Slot,
    TaskFailed,
    TaskState,
    VmRequest,
    VsphereService,
)
from agentforge.vsphere.vm import read_facts
from sim.vsphere_tasks import TaskDriver
from tests.vcsim import support

pytestmark = pytest.mark.vcsim


async def _start_create(
    driver: TaskDriver, service: VsphereService, key: ObjectKey, request: VmRequest
) -> str:
    """Start a create as the vm controller does: its moref, recorded by the caller."""
    slot: Slot = await driver.slot(service, key)
    started = await service.start_create(request=request, slot=slot)
    assert started.task is not None
    return started.task


async def test_concurrent_tasks_share_one_collector_and_few_polls(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    await service.preflight(placement=placement)
    before = await vcsim.control.counters()
    made = await asyncio.gather(
        *(driver.create(service, support.request(placement, markers)) for _ in range(10))
    )
    after = await vcsim.control.counters()
    assert len({vm.moid for vm in made}) == 10
    assert support.method_delta(before, after, "CreatePropertyCollector") <= 1
    assert support.method_delta(before, after, "CreateFilter") <= 1
    # 20 tasks (create + power on): far fewer long polls and registrations than tasks
    assert support.method_delta(before, after, "WaitForUpdatesEx") < 20
    assert support.method_delta(before, after, "ModifyListView") < 20


async def test_a_permanent_task_failure_is_reported_with_the_object(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    await service.session()
    await vcsim.control.fail_next_tasks("CreateVM_Task", 1, "GenericVmConfigFault")
    with pytest.raises(TaskFailed):
        await driver.create(service, support.request(placement, markers))
    assert await support.vm_names_in_folder(service, placement) == []
    assert (await vcsim.control.counters())["faults_injected"] == 1


async def test_the_waiter_survives_a_session_expiry_mid_task(
    driver: TaskDriver,
    private: tuple[Any, VsphereService],
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    vcsim, service = private
    await vcsim.control.set_delay("PowerOnVM_Task", 300)
    try:
        task = asyncio.ensure_future(driver.create(service, support.request(placement, markers)))
        await asyncio.sleep(0.15)
        await vcsim.control.end_sessions()
        vm = await task
    finally:
        await vcsim.control.set_delay("PowerOnVM_Task", 0)
    assert vm.power_state.value == "poweredOn"


# --- a started task, recorded and asked about later ---------------------------------------


async def test_a_started_create_is_in_progress_when_read_back_and_ends_with_its_vm(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 800, stage="task")
    key = ObjectKey("test/create")
    try:
        moid = await _start_create(driver, service, key, support.request(placement, markers))
        started = await service.task(task_ref=moid)
        assert started.running
        assert started.description_id == "Folder.createVm"
        assert [t.moid for t in await service.creates_in_flight(placement=placement)] == [moid]
        done = await driver.ended(service, key, moid)
    finally:
        driver.waits.forget(key)
    assert (done.state, done.error) == (TaskState.SUCCESS, None)
    assert done.result_moid is not None
    assert await service.vm_by_moid(moid=done.result_moid) is not None
    assert await service.creates_in_flight(placement=placement) == []


async def test_a_recorded_task_that_failed_reads_back_as_failed(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.fail_next_tasks("CreateVM_Task", 1, "InsufficientResourcesFault")
    key = ObjectKey("test/failed")
    try:
        moid = await _start_create(driver, service, key, support.request(placement, markers))
        failed = await driver.ended(service, key, moid)
    finally:
        driver.waits.forget(key)
    assert failed.state is TaskState.ERROR
    assert isinstance(failed.error, TaskFailed)
    assert failed.result_moid is None
    again = await service.task(task_ref=moid)  # read again: the same outcome
    assert (again.state, type(again.error), str(again.error)) == (
        failed.state,
        type(failed.error),
        str(failed.error),
    )


async def test_a_task_vcenter_does_not_know_is_not_found_never_an_outcome(
    service: VsphereService,
) -> None:
    with pytest.raises(NotFound):
        await service.task(task_ref="task-99999999")


async def test_a_stale_task_reference_fails_fast_and_never_stalls_the_other_waits(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    """One filter watches every task: a reference vCenter does not know must fail alone,
    with NotFound naming it, while a real task watched beside it still completes."""
    session = await service.session()
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 3000, stage="task")

    def wait_for_stale(moid: str) -> asyncio.Future[Any]:
        ref = read_facts.task_ref(session, moid)
        return asyncio.ensure_future(
            session.waiter.wait(ref, subject=f"task {moid}", action="wait for")
        )

    key = ObjectKey("test/real")
    request = support.request(placement, markers)
    try:
        moid = await _start_create(driver, service, key, request)
        # registered in the same tick as the real task's follow: one filter (or one
        # view change) is asked to hold both
        gone = wait_for_stale("task-99999991")
        created = asyncio.ensure_future(driver.ended(service, key, moid))
        with pytest.raises(NotFound, match="task-99999991") as caught:
            await asyncio.wait_for(gone, timeout=2)
        assert caught.value.subject == "task task-99999991"
        # a stale reference joining the filter later fails just as fast
        with pytest.raises(NotFound, match="task-99999992"):
            await asyncio.wait_for(wait_for_stale("task-99999992"), timeout=2)
        assert not created.done()  # failed fast: the real task is still running
        done = await asyncio.wait_for(created, timeout=30)
    finally:
        driver.waits.forget(key)
    assert done.state is TaskState.SUCCESS
    assert await support.vm_names_in_folder(service, placement) == [request.name]


async def test_a_second_create_of_a_name_still_being_created_is_in_flight_not_a_conflict(
    driver: TaskDriver,
    vcsim: Any,
    service: VsphereService,
    placement: Placement,
    markers: OwnershipMarkers,
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 1000, stage="task")
    req = support.request(placement, markers)
    key, second_key = ObjectKey("test/first"), ObjectKey("test/second")
    try:
        moid = await _start_create(driver, service, key, req)
        second = await _start_create(driver, service, second_key, req)
        refused = await driver.ended(service, second_key, second)
        # vCenter reserved the name for the creation still running: no VM of that name
        # yet, one create in flight in the folder (the vm controller waits for it)
        assert isinstance(refused.error, AlreadyExists)
        assert await service.vm_by_name(placement=placement, name=req.name) is None
        in_flight = await service.creates_in_flight(placement=placement)
        assert [t.moid for t in in_flight] == [moid]
        first = await driver.ended(service, key, moid)
    finally:
        driver.waits.forget(key)
        driver.waits.forget(second_key)
    await vcsim.control.clear_delays()
    again = await driver.create(service, req)  # ours by name and markers: taken over
    assert again.moid == first.result_moid
    assert await support.vm_names_in_folder(service, placement) == [req.name]
