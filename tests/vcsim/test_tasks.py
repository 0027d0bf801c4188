"""One task waiter per session: many tasks, one filter, few long polls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.vsphere import (
    CreationInFlight,
    NotFound,
    OwnershipMarkers,
    Placement,
    TaskFacts,
    TaskFailed,
    TaskState,
    VsphereService,
    task_facts,
)
from tests.vcsim import support

pytestmark = pytest.mark.vcsim


async def test_concurrent_tasks_share_one_collector_and_few_polls(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.preflight(placement=placement)
    before = await vcsim.control.counters()
    made = await asyncio.gather(
        *(service.create_vm(request=support.request(placement, markers)) for _ in range(10))
    )
    after = await vcsim.control.counters()
    assert len({vm.moid for vm in made}) == 10
    assert support.method_delta(before, after, "CreatePropertyCollector") <= 1
    assert support.method_delta(before, after, "CreateFilter") <= 1
    # 20 tasks (create + power on): far fewer long polls and registrations than tasks
    assert support.method_delta(before, after, "WaitForUpdatesEx") < 20
    assert support.method_delta(before, after, "ModifyListView") < 20


async def test_a_permanent_task_failure_is_reported_with_the_object(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.session()
    await vcsim.control.fail_next_tasks("CreateVM_Task", 1, "GenericVmConfigFault")
    req = support.request(placement, markers)
    with pytest.raises(TaskFailed, match=f"create VM {req.name}"):
        await service.create_vm(request=req)
    assert await support.vm_names_in_folder(service, placement) == []
    assert (await vcsim.control.counters())["faults_injected"] == 1


async def test_the_waiter_survives_a_session_expiry_mid_task(
    private: tuple[Any, VsphereService], placement: Placement, markers: OwnershipMarkers
) -> None:
    vcsim, service = private
    await vcsim.control.set_delay("PowerOnVM_Task", 300)
    try:
        task = asyncio.ensure_future(service.create_vm(request=support.request(placement, markers)))
        await asyncio.sleep(0.15)
        await vcsim.control.end_sessions()
        vm = await task
    finally:
        await vcsim.control.set_delay("PowerOnVM_Task", 0)
    assert vm.power_state.value == "poweredOn"


# --- a started task, recorded and asked about later ---------------------------------------


async def test_a_create_hands_its_task_over_before_waiting_and_the_task_reads_back(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 800, stage="task")
    seen: list[TaskFacts] = []

    async def on_task(moid: str) -> None:
        seen.append(await service.task(task_ref=moid))
        assert [t.moid for t in await service.creates_in_flight(placement=placement)] == [moid]

    vm = await service.create_vm(request=support.request(placement, markers), on_task=on_task)
    (started,) = seen
    assert started.running
    assert started.description_id == "Folder.createVm"
    done = await service.task(task_ref=started.moid)
    assert (done.state, done.result_moid, done.error) == (TaskState.SUCCESS, vm.moid, None)
    assert await service.creates_in_flight(placement=placement) == []


async def test_waiting_for_a_recorded_task_ends_with_its_outcome(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.fail_next_tasks("CreateVM_Task", 1, "InsufficientResourcesFault")
    refs: list[str] = []

    async def on_task(moid: str) -> None:
        refs.append(moid)

    with pytest.raises(TaskFailed):
        await service.create_vm(request=support.request(placement, markers), on_task=on_task)
    failed = await service.wait_for_task(task_ref=refs[0])
    assert failed.state is TaskState.ERROR
    assert isinstance(failed.error, TaskFailed)
    assert failed.result_moid is None


async def test_a_task_vcenter_does_not_know_is_not_found_never_an_outcome(
    service: VsphereService,
) -> None:
    with pytest.raises(NotFound):
        await service.task(task_ref="task-99999999")
    with pytest.raises(NotFound):
        await service.wait_for_task(task_ref="task-99999999")


async def test_a_stale_task_reference_fails_fast_and_never_stalls_the_other_waits(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    """One filter watches every task: a reference vCenter does not know must fail alone,
    with NotFound naming it, while a real task watched beside it still completes."""
    session = await service.session()
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 3000, stage="task")
    gone: list[asyncio.Future[Any]] = []
    started = asyncio.Event()

    def wait_for_stale(moid: str) -> asyncio.Future[Any]:
        ref = task_facts.task_ref(session, moid)
        return asyncio.ensure_future(
            session.waiter.wait(ref, subject=f"task {moid}", action="wait for")
        )

    async def on_task(_: str) -> None:
        # registered in the same tick as the real task's wait: one filter (or one
        # view change) is asked to hold both
        gone.append(wait_for_stale("task-99999991"))
        started.set()

    create = asyncio.ensure_future(
        service.create_vm(request=support.request(placement, markers), on_task=on_task)
    )
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        with pytest.raises(NotFound, match="task-99999991") as caught:
            await asyncio.wait_for(gone[0], timeout=2)
        assert caught.value.subject == "task task-99999991"
        # a stale reference joining the filter later fails just as fast
        with pytest.raises(NotFound, match="task-99999992"):
            await asyncio.wait_for(wait_for_stale("task-99999992"), timeout=2)
        assert not create.done()  # failed fast: the real task is still running
    finally:
        vm = await asyncio.wait_for(create, timeout=30)
    assert vm.power_state.value == "poweredOn"
    assert await support.vm_names_in_folder(service, placement) == [vm.name]


async def test_a_second_create_of_a_name_still_being_created_waits_not_conflicts(
    vcsim: Any, service: VsphereService, placement: Placement, markers: OwnershipMarkers
) -> None:
    await service.preflight(placement=placement)
    await vcsim.control.set_delay("CreateVM_Task", 1000, stage="task")
    req = support.request(placement, markers)
    started = asyncio.Event()

    async def on_task(_: str) -> None:
        started.set()

    first = asyncio.ensure_future(service.create_vm(request=req, on_task=on_task))
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        with pytest.raises(CreationInFlight, match="still running"):
            await service.create_vm(request=req)
    finally:
        vm = await first
    await vcsim.control.clear_delays()
    again = await service.create_vm(request=req)  # ours by name and markers: taken over
    assert again.moid == vm.moid
    assert await support.vm_names_in_folder(service, placement) == [req.name]
