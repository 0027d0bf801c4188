"""One task waiter per session: many tasks, one filter, few long polls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentforge.vsphere import OwnershipMarkers, Placement, TaskFailed, VsphereService
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
