"""A recorded create or delete task still running when the next pass asks about it: the
pass follows it and ends, nobody waits, and its end wakes the key (docs/design/0005).

The ejection's disconnect and the adoption's marker stamp are covered in the same way
in `test_ejection.py` (the "IN_PROGRESS" section); a real vCenter's side of each, in
`tests/vcsim`.
"""

from __future__ import annotations

from agentforge import vsphere
from agentforge.api.vsphereagent import CreationRecord, DeletionRecord
from agentforge.kube.controller import Result
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm import delete_tasks as vm_delete_tasks
from agentforge.reconcilers.vm import lookup as vm_lookup
from agentforge.reconcilers.waits import TASK_RECHECK_S
from tests.unit.reconcilers import ejection_support as es

TASK = "task-1"
RUNNING = vsphere.TaskState.RUNNING
WAITING = Result(requeue_after=TASK_RECHECK_S)


def creation() -> CreationRecord:
    return CreationRecord.model_validate(
        {
            "vmName": es.VM,
            "biosUUID": es.UUID,
            "ownership": es.record()["ownership"],
            "datacenter": es.DATACENTER,
            "folder": "agent-forge",
            "phase": "CreateIssued",
            "taskRef": TASK,
            "startedAt": "2026-03-01T11:59:00Z",
        }
    )


def deletion(phase: str = "PowerOffIssued") -> DeletionRecord:
    return DeletionRecord.model_validate(
        {
            "vmName": es.VM,
            "biosUUID": es.UUID,
            "phase": phase,
            "taskRef": TASK,
            "startedAt": "2026-03-01T11:59:00Z",
        }
    )


async def test_a_recorded_create_still_running_is_followed_and_the_vm_not_looked_up() -> None:
    s = es.setup(es.vsphere_agent(), es.installed_agent())
    s.service.tasks[TASK] = RUNNING  # (started by an earlier process)
    inputs, _ = s.ctx()
    task, plan = await vm_lookup.look_up(s.service, inputs, creation())
    assert task is not None
    assert task.running
    assert plan.step is vm_decide.ResumeStep.WAIT
    assert s.service.methods() == ["task", "follow_task"]  # no VM lookup while it runs
    assert inputs.vcenter.wait_task(s.service, task.moid) == WAITING
    # a pass woken by something else meanwhile: nothing to ask vCenter
    inputs, _ = s.ctx()
    again, _ = await vm_lookup.look_up(s.service, inputs, creation())
    assert again is not None
    assert again.running
    assert s.service.methods() == ["task", "follow_task"]
    s.service.registry._task_ended(es.SERVER, TASK)  # the follow's news
    assert s.woken == [es.KEY]


async def test_a_recorded_delete_step_still_running_is_followed_and_read_once_it_ended() -> None:
    s = es.setup(es.vsphere_agent(), es.installed_agent())
    s.service.tasks[TASK] = RUNNING
    inputs, writer = s.ctx()
    service = s.service
    record = deletion("DestroyIssued")
    ended = await vm_delete_tasks.outcome(inputs, writer, service, record)
    assert ended == WAITING
    assert service.methods() == ["task", "follow_task"]
    assert s.waits.waiting(es.KEY)
    inputs, writer = s.ctx()  # woken by something else meanwhile: nothing to ask vCenter
    assert await vm_delete_tasks.outcome(inputs, writer, service, record) == WAITING
    assert service.methods() == ["task", "follow_task"]
    service.tasks[TASK] = vsphere.TaskState.SUCCESS
    s.service.registry._task_ended(es.SERVER, TASK)
    assert s.woken == [es.KEY]
    inputs, writer = s.ctx()
    assert await vm_delete_tasks.outcome(inputs, writer, service, record) is True
    assert service.methods() == ["task", "follow_task", "task"]


async def test_a_noted_power_off_still_running_is_followed_and_stays_noted_until_it_ended() -> None:
    s = es.setup(es.vsphere_agent(), es.installed_agent())
    service = s.service
    service.tasks[TASK] = RUNNING
    vm = es.vm_facts()
    inputs, writer = s.ctx()
    inputs.vcenter.note(service, vm_delete_tasks.POWER_OFF, task=TASK, about=es.UUID, vm=vm)
    noted = vm_delete_tasks.noted_power_off(inputs, service, bios_uuid=es.UUID)
    assert noted is not None
    record, note = noted
    assert (record.phase, record.task_ref) == ("PowerOffIssued", TASK)
    ended = await vm_delete_tasks.outcome(inputs, writer, service, record, noted=note)
    assert ended == WAITING
    assert service.methods() == ["task", "follow_task"]
    inputs, writer = s.ctx()  # the next pass finds it noted again (read once, kept while running)
    again = vm_delete_tasks.noted_power_off(inputs, service, bios_uuid=es.UUID)
    assert again is not None
    service.tasks[TASK] = vsphere.TaskState.SUCCESS
    s.service.registry._task_ended(es.SERVER, TASK)
    assert s.woken == [es.KEY]
    inputs, writer = s.ctx()
    assert await vm_delete_tasks.outcome(inputs, writer, service, again[0], noted=again[1]) is False
    assert writer.has_pending is False  # nothing written: the VM is looked up next
