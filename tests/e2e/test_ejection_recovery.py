"""ISO ejection across kill -9: every step boundary resumes to exactly one disconnect, and a
restart that finds changed media or another question refuses and touches nothing.

Boundaries between a status checkpoint and the next vSphere call are microseconds wide,
so the operator is stopped there by its test-only crash hook (`AGENT_FORGE_TEST_CRASH_AT`,
`os._exit(137)` right after the step); a disconnect in flight is visible from outside
(a vcsim task held running) and is killed with SIGKILL. Each VM's guest locks its
CD-ROM door, so every boundary, the lock question included, is passed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentforge.reconcilers.ejection.run import CrashPoint
from sim.actors.vcenter import VmFact
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from tests.e2e import ejection_support as ej
from tests.e2e.support import OperatorHarness, consistently, eventually

# In this module the `operator` fixture is not started for the test: each test starts it
# (`ej.run_operator`), with a crash point when it wants one.
operator = ej.unstarted_operator

POOL = ej.POOL
LOCK = "msg.cdromdisconnect.locked"
STAYS_S = 3.0


async def one_installing_worker(world: World, operator: OperatorHarness, **crash: str) -> VmFact:
    """An opted-in pool with one bound worker whose installation is held back (the operator
    is restarted with the crash hook before anything exists, so no other work is cut)."""
    await ej.run_operator(operator, **crash)
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(1)
    snap = await ej.bound(world, 1)
    return ej.vm_of(snap, ej.vas_of(snap)[0])


def record_of(snap: Snapshot) -> dict[str, object] | None:
    status = ej.vas_of(snap)[0].get("status") or {}
    found = status.get("isoEjection")
    return dict(found) if isinstance(found, dict) else None


@pytest.mark.parametrize("point", [p.value for p in CrashPoint])
async def test_a_kill_at_every_step_boundary_ends_ejected_with_one_disconnect(
    point: str, world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    vm = await one_installing_worker(world, operator, crash_at=point)
    await vcsim_control.lock_cdrom(vm.moref)
    ej.release_installation(world)
    await ej.crashed(operator, point=point)
    crashed_at = record_of(await world.snapshot())
    if point == CrashPoint.QUESTION_RECORDED:
        assert crashed_at is not None
        assert crashed_at["phase"] == "QuestionRecorded"
        assert str(crashed_at["questionID"]).startswith("_vmx")

    await ej.run_operator(operator)
    snap = await ej.wait_reasons(world, {"Ejected"})
    assert record_of(snap) is None
    assert ej.pool_iso(snap) not in (snap.vm(vm.name) or vm).iso_files
    assert len(await ej.disconnects(vcsim_control, vm.moref)) == 1
    answered = await ej.answers(vcsim_control, vm.moref)
    assert len(answered) <= 1
    assert all(a["answer_choice"] == "0" for a in answered)
    assert await ej.pending_questions(vcsim_control, vm.moref) == []


async def test_a_kill_while_the_disconnect_task_runs_resumes_that_task(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    vm = await one_installing_worker(world, operator)
    await vcsim_control.set_delay("ReconfigVM_Task", 6000, stage="task")
    ej.release_installation(world)
    await eventually(
        lambda: ej.disconnects(vcsim_control, vm.moref),
        lambda found: len(found) == 1,
        within=60,
        what="the disconnect sent (its task held running)",
    )
    operator.kill()
    assert operator.process is not None
    await operator.process.wait_exit(within=10)
    await vcsim_control.set_delay("ReconfigVM_Task", 0, stage="task")

    await ej.run_operator(operator)
    snap = await ej.wait_reasons(world, {"Ejected"})
    assert record_of(snap) is None
    assert len(await ej.disconnects(vcsim_control, vm.moref)) == 1
    assert await ej.answers(vcsim_control, vm.moref) == []


async def test_a_restart_that_finds_changed_media_refuses_and_touches_nothing(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl, tmp_path: Path
) -> None:
    vm = await one_installing_worker(world, operator, crash_at=CrashPoint.RECORDED.value)
    ej.release_installation(world)
    await ej.crashed(operator, point=CrashPoint.RECORDED.value)
    recorded = record_of(await world.snapshot())
    assert recorded is not None
    other = tmp_path / "rescue.iso"
    other.write_bytes(b"someone else's medium")
    govc = world.vcsim.govc
    await asyncio.to_thread(govc, "datastore.upload", "-ds", "iso-ds", str(other), "rescue.iso")
    device = f"cdrom-{recorded['deviceKey']}"
    await asyncio.to_thread(
        govc, "device.cdrom.insert", "-vm.uuid", vm.bios_uuid, "-device", device,
        "-ds", "iso-ds", "rescue.iso",
    )  # fmt: skip
    mark = await vcsim_control.last_seq()

    await ej.run_operator(operator)
    snap = await ej.wait_reasons(world, {"EjectionFailed"})
    message = ej.iso_ejected(ej.vas_of(snap)[0])["message"]
    assert "media changed" in message
    assert "[iso-ds] rescue.iso" in message
    snap = await consistently(
        world.snapshot,
        lambda s: (
            record_of(s) == recorded and (s.vm(vm.name) or vm).iso_files == ("[iso-ds] rescue.iso",)
        ),
        duration=STAYS_S,
        what="the record kept and the changed medium left attached",
    )
    assert await ej.disconnects(vcsim_control, vm.moref, since=mark) == []
    reasons = {
        e.get("reason")
        for e in snap.events_about("VsphereAgent", ej.vas_of(snap)[0]["metadata"]["name"])
    }
    assert "ISOEjectionFailed" in reasons


async def test_a_restart_that_finds_another_question_pending_refuses_and_answers_nothing(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    point = CrashPoint.DISCONNECT_RECORDED.value
    vm = await one_installing_worker(world, operator, crash_at=point)
    ej.release_installation(world)
    await ej.crashed(operator, point=point)
    recorded = record_of(await world.snapshot())
    assert recorded is not None
    assert recorded["phase"] == "DisconnectIssued"
    other = await vcsim_control.raise_question(vm.moref, "msg.uuid.altered", "Did you move it?")

    await ej.run_operator(operator)
    snap = await ej.wait_reasons(world, {"EjectionFailed"})
    assert other in ej.iso_ejected(ej.vas_of(snap)[0])["message"]
    await consistently(
        world.snapshot,
        lambda s: record_of(s) == recorded and ej.pool_iso(s) in (s.vm(vm.name) or vm).iso_files,
        duration=STAYS_S,
        what="the record kept and the discovery ISO still attached",
    )
    assert await ej.disconnects(vcsim_control, vm.moref) == []
    assert await ej.answers(vcsim_control, vm.moref) == []
    assert [q["id"] for q in await ej.pending_questions(vcsim_control, vm.moref)] == [other]
