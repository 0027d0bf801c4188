"""The ejection step against a fake API server and a scripted VM: checkpoints, order, refusals."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY

from agentforge import vsphere
from agentforge.api import kinds, names
from agentforge.kube.controller import Result
from agentforge.kube.store import key_for
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.ejection.status import EjectionEvent
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.reconcilers.vm.context import StatusWriter, VmInputs
from agentforge.reconcilers.waits import TASK_RECHECK_S
from tests.unit.reconcilers import ejection_support as es
from tests.unit.reconcilers import planner_support as ps
from tests.unit.reconcilers.controller_support import FakeApi

JsonObj = dict[str, Any]
STEP = ejection.Ejection()


async def reconcile(s: es.Setup) -> Result | None:
    """A pass, and another each time the registry's news woke the key (a task it waits
    for ended), as the vm controller runs them: the last pass's result."""
    for _ in range(10):
        s.woken.clear()
        inputs, writer = s.ctx()
        result = await STEP.reconcile(inputs=inputs, writer=writer)
        if not s.woken:
            return result
    raise AssertionError("woken again and again")


def status_writes(api: FakeApi) -> list[JsonObj]:
    return [c.body["status"] for c in api.calls if c.verb == "update-status"]


def phases_written(api: FakeApi) -> list[str | None]:
    return [(w.get("isoEjection") or {}).get("phase") for w in status_writes(api)]


def installed(**kw: Any) -> es.Setup:
    vm = kw.pop("vm", None)
    agent = kw.pop("agent", None) or es.installed_agent()
    eject = kw.pop("eject", True)
    return es.setup(es.vsphere_agent(**kw), agent, vm=vm, eject=eject)


def events(s: es.Setup) -> list[str]:
    return s.h.events.reasons()


# --- the order of effects ------------------------------------------------------------------


async def test_the_record_is_stored_and_read_back_before_the_disconnect() -> None:
    s = installed()
    assert await reconcile(s) is None
    assert s.service.calls == [
        ("vm_by_uuid", None),
        ("eject_cdrom", "DisconnectIssued"),
        ("vm_by_uuid", "DisconnectIssued"),  # woken by the task's end: the device is empty
    ]
    assert phases_written(s.api) == ["Recorded", "DisconnectIssued", "DisconnectIssued", None]
    assert status_writes(s.api)[2]["isoEjection"]["taskRef"] == "task-7"  # the started task
    first = status_writes(s.api)[0]
    assert first["isoEjection"]["isoPath"] == es.ISO
    assert first["isoEjection"]["deviceKey"] == 3000
    assert first["isoEjection"]["biosUUID"] == es.UUID
    assert first["isoEjection"]["datacenter"] == es.DATACENTER
    assert first["isoEjection"]["ownership"]["vsphereAgent"] == es.VA
    assert s.stored_record() is None
    assert s.condition() is not None
    assert (s.reason(), s.condition()["status"]) == ("Ejected", "True")  # type: ignore[index]
    assert events(s) == [EjectionEvent.STARTED, EjectionEvent.EJECTED]


class PruningApi(FakeApi):
    """An API server whose VsphereAgent CRD predates `status.isoEjection`."""

    async def update_status(
        self,
        kind: kinds.Kind,
        *,
        namespace: str | None = None,
        name: str,
        mutate: Callable[[JsonObj], JsonObj | None],
        attempts: int = 5,
        start: Any = None,
    ) -> JsonObj:
        def pruned(obj: JsonObj) -> JsonObj | None:
            out = mutate(obj)
            if out is not None:
                out.get("status", {}).pop("isoEjection", None)
            return out

        return await super().update_status(kind, namespace=namespace, name=name, mutate=pruned)


async def test_a_pruned_record_stops_before_any_vsphere_change_and_says_to_update_the_crds() -> (
    None
):
    s = installed()
    pruning = PruningApi(objects=s.api.objects)
    s.h.deps = dataclasses.replace(s.h.deps, client=pruning)  # type: ignore[arg-type]
    s.h.api = pruning
    s.service.api = pruning
    assert await reconcile(s) == Result(requeue=True)
    assert s.service.methods() == ["vm_by_uuid"]
    condition = s.condition()
    assert condition is not None
    assert condition["reason"] == "EjectionFailed"
    assert "Update the CRDs" in condition["message"]
    assert events(s) == [EjectionEvent.CRDS_OUTDATED]

    assert await reconcile(s) == Result(requeue=True)  # retried: the same report, no new one
    assert s.service.methods() == ["vm_by_uuid", "vm_by_uuid"]
    assert events(s) == [EjectionEvent.CRDS_OUTDATED]
    assert s.reason() == "EjectionFailed"


async def test_a_locked_door_is_answered_once_with_the_question_id_recorded_first() -> None:
    s = installed(vm=es.FakeVm(locked=True))
    assert await reconcile(s) is None
    assert s.service.calls == [
        ("vm_by_uuid", None),
        ("eject_cdrom", "DisconnectIssued"),
        ("vm_by_uuid", "DisconnectIssued"),  # woken by the question
        ("resume_eject", "DisconnectIssued"),
        ("answer:_vmx1", "QuestionRecorded"),
        ("resume_eject", "Answered"),
    ]
    recorded = [w["isoEjection"] for w in status_writes(s.api) if w.get("isoEjection")]
    assert [r.get("questionID") for r in recorded] == [None, None, None, "_vmx1", "_vmx1"]
    assert [r.get("taskRef") for r in recorded] == [None, None, "task-7", "task-7", "task-7"]
    assert s.reason() == "Ejected"
    assert EjectionEvent.QUESTION_ANSWERED in events(s)


async def test_an_unrelated_question_queued_behind_the_lock_question_is_left_unanswered() -> None:
    vm = es.FakeVm(locked=True)
    s = installed(vm=vm)

    async def raise_unrelated_with_the_lock(**kw: Any) -> vsphere.EjectOutcome:
        outcome = await es.FakeVsphere.eject_cdrom(s.service, **kw)
        vm.questions.append(es.question("_vmx9", message="msg.hbacommon.outofspace"))
        return outcome

    s.service.eject_cdrom = raise_unrelated_with_the_lock  # type: ignore[method-assign]
    assert await reconcile(s) is None
    assert [m for m in s.service.methods() if m.startswith("answer")] == ["answer:_vmx1"]
    assert [q.id for q in vm.questions] == ["_vmx9"]
    assert s.reason() == "Ejected"


async def test_a_vm_with_two_cdroms_holding_pool_isos_has_both_ejected() -> None:
    second = es.cdrom(3001, f"[iso-ds] {es.PREFIX}/{'cd' * 32}.iso")
    s = installed(vm=es.FakeVm(cdroms={3000: es.cdrom(), 3001: second}))
    first = await reconcile(s)
    assert first is not None
    assert first.requeue_after is not None
    assert s.reason() == "EjectionInProgress"
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"
    assert [m for m in s.service.methods() if m == "eject_cdrom"] == ["eject_cdrom"] * 2


async def test_an_unmarked_vm_with_the_recorded_name_is_stamped_after_the_checkpoint() -> None:
    s = installed(vm=es.FakeVm(owner=None))
    assert await reconcile(s) is None
    assert s.service.calls == [
        ("vm_by_uuid", None),
        ("start_stamp", "Recorded"),
        ("vm_by_uuid", "Recorded"),  # woken by the stamp's end
        ("task", "Recorded"),  # its outcome, read once
        ("eject_cdrom", "DisconnectIssued"),
        ("vm_by_uuid", "DisconnectIssued"),
    ]
    assert s.reason() == "Ejected"
    assert events(s) == [
        EjectionEvent.STARTED,
        EjectionEvent.MARKERS_STAMPED,
        EjectionEvent.EJECTED,
    ]


# --- a task still running (IN_PROGRESS) ----------------------------------------------------


async def test_a_running_disconnect_ends_the_pass_and_its_end_wakes_the_key() -> None:
    s = installed(vm=es.FakeVm(slow=True))
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)
    stored = s.stored_record()
    assert stored is not None
    assert (stored["phase"], stored["taskRef"]) == ("DisconnectIssued", "task-7")
    assert s.reason() == "EjectionInProgress"
    assert s.waits.waiting(es.KEY)
    # a pass woken by something else meanwhile (its own write): nothing to ask vCenter
    calls = s.service.methods()
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)
    assert s.service.methods() == calls
    s.service.end("task-7")
    assert es.KEY in s.woken
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"
    assert s.stored_record() is None
    assert s.service.methods().count("eject_cdrom") == 1


async def test_a_running_disconnect_found_after_a_restart_is_followed_not_sent_again() -> None:
    vm = es.FakeVm(running=3000, slow=True)
    s = with_record("DisconnectIssued", vm=vm, taskRef="task-7")
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)
    assert s.service.methods() == ["vm_by_uuid", "resume_eject"]  # resumed: IN_PROGRESS
    assert s.waits.waiting(es.KEY)
    s.service.end("task-7")
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"
    assert s.vsphere_writes() == []


async def test_a_running_stamp_ends_the_pass_and_is_read_once_it_ended() -> None:
    s = installed(vm=es.FakeVm(owner=None, slow=True))
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)
    assert s.vsphere_writes() == ["start_stamp"]
    # a pass woken by something else meanwhile: the stamp still runs, nothing new starts
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)
    assert s.vsphere_writes() == ["start_stamp"]
    assert s.service.methods()[-2:] == ["task", "follow_task"]
    s.service.end("task-stamp")
    assert await reconcile(s) == Result(requeue_after=TASK_RECHECK_S)  # the disconnect runs
    assert s.vsphere_writes() == ["start_stamp", "eject_cdrom"]
    assert EjectionEvent.MARKERS_STAMPED in events(s)
    s.service.end("task-7")
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"


# --- what starts, and what does not ---------------------------------------------------------------


async def test_a_pool_that_has_not_opted_in_shows_disabled_and_calls_no_vsphere() -> None:
    s = installed(eject=False)
    assert await reconcile(s) is None
    assert s.reason() == "Disabled"
    assert s.service.calls == []


async def test_bound_but_not_installed_waits_and_calls_no_vsphere() -> None:
    s = installed(agent=es.installed_agent(installed="False"))
    assert await reconcile(s) is None
    assert s.reason() == "WaitingForInstallation"
    assert s.service.calls == []


async def test_a_released_vm_gets_no_new_ejection() -> None:
    s = installed(phase="Released")
    assert await reconcile(s) is None
    assert s.reason() == "Disabled"
    assert s.service.calls == []


async def test_a_vm_whose_machine_is_deleting_gets_no_new_ejection() -> None:
    machine = ps.machine_obj("m-1", deleting=True)
    s = es.setup(es.vsphere_agent(machine_ref="m-1"), es.installed_agent(), machine)
    assert await reconcile(s) is None
    assert s.reason() == "Disabled"
    assert s.service.calls == []


async def test_an_identity_mismatch_is_ejection_failed_and_touches_nothing() -> None:
    s = installed(agent=es.installed_agent(macs=(ps.mac(9),)))
    assert await reconcile(s) == Result(requeue=True)
    assert s.reason() == "EjectionFailed"
    assert s.service.methods() == ["vm_by_uuid"]
    assert s.stored_record() is None
    writes = len(status_writes(s.api))
    assert await reconcile(s) == Result(requeue=True)
    assert len(status_writes(s.api)) == writes, "a repeated failure rewrites nothing"


async def test_a_look_alike_medium_is_no_owned_media_not_ejected_and_touches_nothing() -> None:
    alike = f"[iso-ds] agent-forge/{ps.NS}/other-pool/{es.SHA}.iso"
    s = installed(vm=es.FakeVm(cdroms={3000: es.cdrom(3000, alike)}))
    assert await reconcile(s) is None
    assert s.service.methods() == ["vm_by_uuid"]
    assert s.vsphere_writes() == []
    condition = s.condition()
    assert condition is not None
    assert (condition["reason"], condition["status"]) == ("NoOwnedMedia", "False")
    assert (
        f"CD-ROM 3000 holds {alike}: in folder agent-forge/{ps.NS}/other-pool/"
        in (condition["message"])
    )
    assert "nothing was ejected" in condition["message"]
    assert s.stored_record() is None
    assert events(s) == []

    assert await reconcile(s) is None  # kept: no second vSphere read, no write
    assert s.service.methods() == ["vm_by_uuid"]
    assert len(status_writes(s.api)) == 1


async def test_an_agent_whose_serial_changed_after_binding_is_named_in_the_message() -> None:
    changed = es.installed_agent(bios_uuid=ps.uuid(8))
    changed["metadata"]["labels"][names.LABEL_AGENT_MACHINE] = es.VA  # prepared for this VM
    s = installed(agent=changed, agent_ref=None, phase="Orphaned", reason="AgentMissing")
    assert await reconcile(s) is None
    assert s.service.calls == []
    condition = s.condition()
    assert condition is not None
    assert condition["reason"] == "WaitingForInstallation"
    assert "register" not in condition["message"]
    assert condition["message"].startswith(
        f"no Agent is matched to VM {es.VM} any more (BIOS UUID {es.UUID}, MAC {es.MAC}; phase "
        f"Orphaned/AgentMissing): Agent {ps.NS}/{es.AGENT}, bound to AgentMachine am-1, "
        "Installed=True reports serial"
    )


async def test_a_provisioning_vm_without_an_agent_waits_for_one_to_register() -> None:
    s = installed(
        agent=es.installed_agent(name="unrelated", bios_uuid=ps.uuid(8), macs=()),
        agent_ref=None,
        phase="Provisioning",
        reason="AgentPending",
    )
    assert await reconcile(s) is None
    condition = s.condition()
    assert condition is not None
    assert condition["message"] == f"waiting for an Agent to register from VM {es.VM}"


async def test_an_ejected_condition_survives_opting_out_and_costs_nothing() -> None:
    s = installed(eject=False)
    s.api.find(kinds.VSPHERE_AGENT, ps.NS, es.VA)["status"]["conditions"].append(  # type: ignore[index]
        {"type": "ISOEjected", "status": "True", "reason": "Ejected", "message": "done",
         "lastTransitionTime": "2026-03-01T11:00:00Z"}
    )  # fmt: skip
    s.api.calls.clear()
    assert await reconcile(s) is None
    assert s.api.calls == []
    assert s.service.calls == []
    assert s.reason() == "Ejected"


async def test_an_ejected_worker_costs_no_call_and_no_write_in_steady_state() -> None:
    s = installed()
    await reconcile(s)
    s.api.calls.clear()
    s.service.calls.clear()
    assert await reconcile(s) is None
    assert s.api.calls == []
    assert s.service.calls == []


async def test_a_stale_cache_that_misses_a_record_starts_nothing() -> None:
    s = installed()
    inputs, writer = s.ctx()
    s.stored()["status"]["isoEjection"] = es.record(phase="QuestionRecorded", questionID="_vmx1")
    assert await STEP.reconcile(inputs=inputs, writer=writer) == Result(requeue_after=1.0)
    assert s.service.methods() == ["vm_by_uuid"]
    assert s.stored_record()["phase"] == "QuestionRecorded"  # type: ignore[index]


# --- a present record ------------------------------------------------------------------------


def with_record(phase: str, *, vm: es.FakeVm, eject: bool = True, **kw: Any) -> es.Setup:
    return es.setup(
        es.vsphere_agent(record=es.record(phase=phase, **kw)),
        es.installed_agent(),
        vm=vm,
        eject=eject,
    )


async def test_a_recorded_question_is_answered_after_a_restart_and_nothing_else_starts() -> None:
    vm = es.FakeVm(running=3000, questions=[es.question("_vmx1")])
    s = with_record("QuestionRecorded", vm=vm, questionID="_vmx1")
    assert await reconcile(s) is None
    assert s.vsphere_writes() == ["answer:_vmx1"]
    assert s.reason() == "Ejected"
    assert s.stored_record() is None


async def test_a_recorded_ejection_finishes_after_the_pool_opts_out() -> None:
    vm = es.FakeVm(running=3000, questions=[es.question("_vmx1")])
    s = with_record("QuestionRecorded", vm=vm, eject=False, questionID="_vmx1")
    assert await reconcile(s) is None
    assert s.vsphere_writes() == ["answer:_vmx1"]
    assert s.reason() == "Ejected"


async def test_an_answer_already_given_before_a_crash_is_not_given_again() -> None:
    s = with_record("QuestionRecorded", vm=es.FakeVm(running=3000), questionID="_vmx1")
    assert await reconcile(s) is None
    assert s.vsphere_writes() == []
    assert s.reason() == "Ejected"


async def test_a_disconnect_recorded_but_never_sent_is_sent_once_after_a_restart() -> None:
    s = with_record("DisconnectIssued", vm=es.FakeVm())
    assert await reconcile(s) is None
    assert s.service.methods() == ["vm_by_uuid", "resume_eject", "eject_cdrom", "vm_by_uuid"]
    assert s.reason() == "Ejected"


async def test_restart_with_changed_media_is_refused_and_keeps_the_record() -> None:
    vm = es.FakeVm(cdroms={3000: es.cdrom(backing="[iso-ds] somebody/else.iso")})
    s = with_record("DisconnectIssued", vm=vm)
    assert await reconcile(s) == Result(requeue=True)
    assert s.vsphere_writes() == []
    assert s.reason() == "EjectionFailed"
    assert "media changed" in s.condition()["message"]  # type: ignore[index]
    assert s.stored_record()["phase"] == "DisconnectIssued"  # type: ignore[index]
    assert EjectionEvent.FAILED in events(s)


async def test_restart_with_a_different_pending_question_is_refused_and_answers_nothing() -> None:
    vm = es.FakeVm(questions=[es.question("_vmx5", message="msg.uuid.altered")])
    s = with_record("DisconnectIssued", vm=vm)
    assert await reconcile(s) == Result(requeue=True)
    assert s.vsphere_writes() == []
    assert s.reason() == "EjectionFailed"
    assert s.stored_record() is not None


async def test_a_failed_disconnect_keeps_the_record_and_is_retried() -> None:
    s = installed()
    s.service.fail["eject_cdrom"] = vsphere.TaskFailed("GenericVmConfigFault")
    assert await reconcile(s) == Result(requeue=True)
    assert s.reason() == "EjectionFailed"
    assert s.stored_record()["phase"] == "DisconnectIssued"  # type: ignore[index]
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"
    assert s.service.methods().count("eject_cdrom") == 2


async def test_a_no_answer_by_someone_else_is_respected_and_reported() -> None:
    s = with_record("QuestionRecorded", vm=es.FakeVm(), questionID="_vmx1")
    assert await reconcile(s) == Result(requeue=True)
    assert s.stored_record()["phase"] == "QuestionRecorded"  # type: ignore[index]
    assert s.reason() == "EjectionFailed"
    assert "does not override" in s.condition()["message"]  # type: ignore[index]
    assert s.vsphere_writes() == []


async def test_a_disconnect_failing_after_our_yes_restarts_the_operation_with_backoff() -> None:
    s = with_record("Answered", vm=es.FakeVm(), questionID="_vmx1")
    assert await reconcile(s) == Result(requeue=True)
    stored = s.stored_record()
    assert stored is not None
    assert (stored["phase"], stored["attempts"], stored.get("questionID")) == ("Recorded", 1, None)
    assert s.reason() == "EjectionFailed"
    assert s.vsphere_writes() == []
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"
    assert s.vsphere_writes() == ["eject_cdrom"]


async def test_an_adopted_vm_of_an_installed_worker_is_ejected() -> None:
    va = es.vsphere_agent(created_for="adopted")
    va["status"]["conditions"][0]["reason"] = "VMAdopted"
    s = es.setup(va, es.installed_agent())
    assert await reconcile(s) is None
    assert s.reason() == "Ejected"


# --- deletion -------------------------------------------------------------------------------


async def test_deletion_finishes_the_recorded_ejection_first() -> None:
    vm = es.FakeVm(running=3000, questions=[es.question("_vmx1")])
    s = with_record("QuestionRecorded", vm=vm, questionID="_vmx1")
    inputs, writer = s.ctx()
    assert await STEP.finish_before_delete(
        agent=inputs.agent, pool=inputs.pool, inputs=inputs, writer=writer
    )
    assert s.vsphere_writes() == ["answer:_vmx1"]
    assert s.stored_record() is None


async def test_deletion_waits_while_the_recorded_ejection_is_refused() -> None:
    vm = es.FakeVm(running=3000, questions=[es.question("_vmx8", message="msg.other")])
    s = with_record("QuestionRecorded", vm=vm, questionID="_vmx1")
    inputs, writer = s.ctx()
    assert not await STEP.finish_before_delete(
        agent=inputs.agent, pool=inputs.pool, inputs=inputs, writer=writer
    )
    assert s.vsphere_writes() == []
    assert s.stored_record() is not None


async def test_deletion_drops_a_record_whose_vm_is_gone() -> None:
    s = es.setup(
        es.vsphere_agent(record=es.record(phase="Answered", questionID="_vmx1")), no_vm=True
    )
    inputs, writer = s.ctx()
    assert await STEP.finish_before_delete(
        agent=inputs.agent, pool=inputs.pool, inputs=inputs, writer=writer
    )
    assert s.stored_record() is None
    assert EjectionEvent.ABANDONED in events(s)


async def test_deletion_without_a_pool_lets_the_vsphere_agent_go_and_warns() -> None:
    s = es.setup(es.vsphere_agent(record=es.record()))
    inputs, writer = s.ctx()
    assert await STEP.finish_before_delete(
        agent=inputs.agent, pool=None, inputs=inputs, writer=writer
    )
    assert s.service.calls == []
    assert events(s) == [EjectionEvent.ABANDONED]


async def test_a_deleting_vsphere_agent_starts_nothing_in_the_normal_step() -> None:
    s = es.setup(es.vsphere_agent(deleting=True), es.installed_agent())
    assert await reconcile(s) is None
    assert s.service.calls == []
    assert s.api.calls == []


def refused_ejects() -> float:
    labels = {"operation": "eject", "result": "refused"}
    return REGISTRY.get_sample_value("agent_forge_iso_operations_total", labels) or 0.0


async def test_every_refused_attempt_is_counted_so_the_failing_alert_keeps_firing() -> None:
    s = installed(agent=es.installed_agent(macs=(ps.mac(9),)))
    before = refused_ejects()
    await reconcile(s)
    await reconcile(s)
    assert refused_ejects() == before + 2


# --- the ejection controller beside the vm controller -----------------------------------------


async def test_the_vm_controller_leaves_a_recorded_ejection_to_the_ejection_controller() -> None:
    s = installed(record=es.record())
    result = await vm.VmReconciler(deps=s.h.deps, ejection=STEP).reconcile(
        key_for(namespace=ps.NS, name=es.VA)
    )
    assert result is None
    assert s.service.calls == []
    assert [c.verb for c in s.api.calls if c.verb != "get"] == []


async def test_the_vm_and_ejection_controllers_never_run_one_key_at_once() -> None:
    s = installed()
    key = key_for(namespace=ps.NS, name=es.VA)
    order: list[str] = []
    inside = asyncio.Event()
    release = asyncio.Event()

    async def holding(inputs: VmInputs, writer: StatusWriter) -> Result | None:
        order.append("ejection in")
        inside.set()
        await release.wait()
        order.append("ejection out")
        return None

    async def noting(inputs: VmInputs, writer: StatusWriter) -> Result | None:
        order.append("vm")
        return None

    ejecting = asyncio.create_task(
        vm.VmReconciler(deps=s.h.deps, name=ejection.CONTROLLER_NAME, step=holding).reconcile(key)
    )
    await inside.wait()
    creating = asyncio.create_task(vm.VmReconciler(deps=s.h.deps, step=noting).reconcile(key))
    await asyncio.sleep(0)  # the vm pass runs as far as it can: to the key's lock
    assert order == ["ejection in"]
    release.set()
    await asyncio.gather(ejecting, creating)
    assert order == ["ejection in", "ejection out", "vm"]
