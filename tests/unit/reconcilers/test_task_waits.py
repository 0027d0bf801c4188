"""Keys waiting for a vCenter task or a task slot are woken by the registry's news."""

from __future__ import annotations

import pytest

from agentforge import vsphere
from agentforge.kube.controller import Result
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.waits import (
    SLOT_RECHECK_S,
    TASK_RECHECK_S,
    Noted,
    TaskWaits,
)

VC = "vc.example.test:443"
KEY = ObjectKey("ns/va1")


def waits() -> tuple[vsphere.SessionRegistry, TaskWaits, list[ObjectKey]]:
    registry = vsphere.SessionRegistry(options=vsphere.SessionOptions(max_tasks_in_flight=1))
    woken: list[ObjectKey] = []
    tasks = TaskWaits(registry, controller="vm")
    tasks.bind(woken.append)
    return registry, tasks, woken


def test_a_key_waiting_for_a_task_is_woken_when_the_task_ends_and_only_then() -> None:
    registry, tasks, woken = waits()
    assert tasks.wait_task(KEY, vcenter=VC, task="task-1") == Result(requeue_after=TASK_RECHECK_S)
    registry._task_ended(VC, "task-2")
    registry._task_ended("other.example.test:443", "task-1")  # same moref, other vCenter
    assert woken == []
    registry._task_ended(VC, "task-1")
    assert woken == [KEY]
    assert not tasks.waiting(KEY)


def test_a_task_that_ended_before_the_key_registered_wakes_it_at_once() -> None:
    registry, tasks, woken = waits()
    registry._task_ended(VC, "task-1")  # while the key was still writing its taskRef
    tasks.wait_task(KEY, vcenter=VC, task="task-1")
    assert woken == [KEY]


def test_a_key_waiting_for_a_slot_is_woken_when_one_is_reserved_for_it() -> None:
    registry, tasks, woken = waits()
    first = registry.claim_task_slot(VC, group="ns/pool", token=tasks.token(ObjectKey("ns/a")))
    with pytest.raises(vsphere.TaskSlotPending, match="at most 1") as pending:
        registry.claim_task_slot(VC, group="ns/pool", token=tasks.token(KEY))
    assert tasks.wait_slot(KEY, pending.value) == Result(requeue_after=SLOT_RECHECK_S)
    first.release()
    assert woken == [KEY]
    assert registry.claim_task_slot(VC, group="ns/pool", token=tasks.token(KEY)) is not None


def test_another_controllers_tokens_wake_nothing_here() -> None:
    registry, _tasks, woken = waits()
    other = TaskWaits(registry, controller="other")
    first = registry.claim_task_slot(VC, group="g", token=other.token(ObjectKey("ns/x")))
    with pytest.raises(vsphere.TaskSlotPending):
        registry.claim_task_slot(VC, group="g", token=other.token(KEY))
    first.release()
    assert woken == []


def test_a_forgotten_key_gives_its_turn_away() -> None:
    registry, tasks, woken = waits()
    held = registry.claim_task_slot(VC, group="g", token="vm:ns/holder")
    with pytest.raises(vsphere.TaskSlotPending):
        registry.claim_task_slot(VC, group="g", token=tasks.token(KEY))
    tasks.wait_task(KEY, vcenter=VC, task="task-1")
    tasks.forget(KEY)  # its VsphereAgent is gone
    held.release()
    registry._task_ended(VC, "task-1")
    assert woken == []
    assert registry.task_slots(VC).waiting == 0


def test_a_noted_task_carries_what_its_next_pass_needs_and_is_read_once() -> None:
    _registry, tasks, _woken = waits()
    vm = vsphere.VmFacts(
        moid="vm-1",
        name="w-1",
        bios_uuid="4211aa00-1111-2222-3333-444455556666",
        instance_uuid=None,
        primary_mac="00:50:56:00:00:01",
        macs=("00:50:56:00:00:01",),
        power_state=vsphere.PowerState.OFF,
        markers={},
        cdroms=(),
        question=None,
    )
    tasks.note(KEY, "power-on", vcenter=VC, task="task-1", about="uuid-1", vm=vm)
    tasks.note(KEY, "stamp", vcenter=VC, task="task-2")
    noted = tasks.take(KEY, "power-on", vcenter=VC)
    assert noted == Noted(vcenter=VC, task="task-1", about="uuid-1", vm=vm)
    assert tasks.take(KEY, "power-on", vcenter=VC) is None  # read once
    assert tasks.noted(KEY, "stamp", vcenter=VC) == "task-2"  # the other purpose kept


def test_a_note_about_another_vcenter_is_dropped_and_forget_clears_the_notes() -> None:
    _registry, tasks, _woken = waits()
    tasks.note(KEY, "power-on", vcenter=VC, task="task-1")
    assert tasks.take(KEY, "power-on", vcenter="other.example.test:443") is None
    assert tasks.take(KEY, "power-on", vcenter=VC) is None  # dropped, not kept for VC
    tasks.note(KEY, "power-on", vcenter=VC, task="task-2")
    tasks.forget(KEY)  # its VsphereAgent is gone
    assert tasks.take(KEY, "power-on", vcenter=VC) is None
