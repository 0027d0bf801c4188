"""Pool status writes paced (transitions at once, routine changes at most once per interval)
and the pool's reports held in a burst."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from agentforge.api import kinds, names
from agentforge.api.conditions import ConditionStatus, PoolConditionType
from agentforge.api.fields import format_time
from agentforge.api.pool import PlannedActionType
from agentforge.kube.controller import Result
from agentforge.kube.events import FLUSH_INTERVAL_S
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning.planner_actions import Action
from agentforge.reconcilers.planning.pool_conditions import ConditionDecision
from agentforge.reconcilers.pool import plan_reports, status_pacing
from agentforge.reconcilers.pool import reconcile as pool
from agentforge.reconcilers.pool import status as pool_status
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    NOW,
    NS,
    POOL,
    agent_machine_obj,
    agent_obj,
    ago,
    infra_env_obj,
    machine_obj,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/{POOL}")
INTERVAL = status_pacing.ROUTINE_STATUS_INTERVAL_S


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def pool_writes(h: Harness) -> int:
    return sum(1 for c in h.api.calls if c.verb == "update-status" and c.kind == "VsphereAgentPool")


def written(h: Harness) -> dict[str, Any]:
    found = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert found is not None
    return found.get("status") or {}


async def settled() -> tuple[Harness, pool.PoolReconciler, Clock]:
    """One reconciler (its pacing memory) over a pool whose status is written and steady."""
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj("am-1"),
        machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="vm-1", bios_uuid=uuid(1), created=ago(minutes=5)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    clock = Clock()
    reconciler = pool.PoolReconciler(dataclasses.replace(h.deps, now=clock))
    for _ in range(3):
        await reconciler.reconcile(KEY)
        h.sync()
        clock.advance(INTERVAL)
    h.api.calls.clear()
    assert await reconciler.reconcile(KEY) is None  # steady: nothing to write
    assert h.api.calls == []
    return h, reconciler, clock


async def one_routine_write() -> tuple[Harness, pool.PoolReconciler, Clock]:
    """`settled`, then a routine change written at once (the last write is an interval
    old): the pacing's clock starts now."""
    h, reconciler, clock = await settled()
    h.api.put(agent_machine_obj("am-2", waiting=False, ready=True))
    h.sync()
    await reconciler.reconcile(KEY)
    h.sync()
    assert pool_writes(h) == 1
    return h, reconciler, clock


async def test_routine_changes_inside_the_interval_are_written_once_at_its_end() -> None:
    h, reconciler, clock = await one_routine_write()
    assert written(h)["agentMachines"] == 2

    clock.advance(1.0)
    h.api.put(agent_machine_obj("am-3", waiting=False, ready=True))
    h.sync()
    result = await reconciler.reconcile(KEY)
    assert pool_writes(h) == 1  # paced: counts only
    assert result == Result(requeue_after=INTERVAL - 1.0)

    clock.advance(2.0)
    h.api.put(agent_machine_obj("am-4", waiting=False, ready=True))
    h.sync()
    result = await reconciler.reconcile(KEY)
    assert pool_writes(h) == 1
    assert result == Result(requeue_after=INTERVAL - 3.0)
    assert written(h)["agentMachines"] == 2  # the intermediate 3 is never written

    clock.advance(INTERVAL - 3.0)  # the requeue: the state of then is written
    assert await reconciler.reconcile(KEY) is None
    assert pool_writes(h) == 2
    assert written(h)["agentMachines"] == 4


async def test_a_condition_transition_is_written_at_once_inside_the_interval() -> None:
    h, reconciler, clock = await settled()
    h.api.put(agent_machine_obj("am-2", waiting=False, ready=True))
    h.sync()
    await reconciler.reconcile(KEY)
    h.sync()
    assert pool_writes(h) == 1

    clock.advance(1.0)
    h.api.objects.pop(next(k for k in h.api.objects if k[0] == "InfraEnv"))
    h.sync()
    assert await reconciler.reconcile(KEY) is None
    assert pool_writes(h) == 2
    conditions = {c["type"]: c for c in written(h)["conditions"]}
    assert conditions["InfraEnvAvailable"]["status"] == "False"
    assert conditions["Ready"]["status"] == "False"


async def test_a_planned_event_is_not_repeated_while_its_status_write_is_paced() -> None:
    h, reconciler, clock = await settled()
    h.api.put(agent_machine_obj("am-2", waiting=False, ready=True))
    h.sync()
    await reconciler.reconcile(KEY)  # a routine write: the next one is paced
    h.sync()
    assert pool_writes(h) == 1
    h.events.events.clear()

    clock.advance(1.0)  # an orphan a bound Agent of another pool identifies: clean-up deferred
    h.api.put(
        vsphere_agent_obj("am-9", phase="Orphaned", reason="AgentMissing",
                          transition=ago(hours=2), bios_uuid=uuid(9)),
        agent_obj("a9", bios_uuid=uuid(9), bound_to="am-9",
                  labels={names.LABEL_NODEPOOL: "another-nodepool"}),
    )  # fmt: skip
    h.sync()
    await reconciler.reconcile(KEY)
    assert pool_writes(h) == 1  # paced
    (planned,) = h.events.events
    assert planned.reason == "Planned"
    assert "Noop/vm-am-9" in planned.message

    clock.advance(1.0)  # woken again before the paced write: the plan is the same
    await reconciler.reconcile(KEY)
    assert pool_writes(h) == 1
    assert len(h.events.events) == 1


def test_a_deficit_whose_numbers_move_is_the_same_plan() -> None:
    # The pool creates the VsphereAgents a deficit asks for in the same pass, so a
    # deficit stays in the plan only while no VM can be made (e.g. names taken): its
    # numbers move with demand, and that is not a new plan to report.
    reports = plan_reports.PlannedReports()

    def deficit(n: int) -> tuple[Action, ...]:
        return (Action(PlannedActionType.DEMAND_DEFICIT, None, f"{n} more VM(s) needed"),)

    messages = [reports.message(KEY, deficit(n), None, now=NOW) for n in (1, 2, 3)]
    assert messages == ["planned 1 action(s): DemandDeficit", None, None]


def test_a_plan_flipping_back_to_the_one_just_reported_is_not_reported_again() -> None:
    reports = plan_reports.PlannedReports(interval=30.0)
    deficit = (Action(PlannedActionType.DEMAND_DEFICIT, None, "1 more VM(s) needed"),)
    nothing = (Action(PlannedActionType.NOOP, None, "nothing to do"),)
    deferred = (Action(PlannedActionType.NOOP, "vm-1", "clean-up paused"),)
    at = [NOW + timedelta(seconds=s) for s in range(0, 200, 10)]
    # a burst: every AgentMachine flips the plan to a deficit and back
    flips = [reports.message(KEY, deficit if i % 2 == 0 else nothing, None, now=at[i])
             for i in range(8)]  # fmt: skip
    assert flips == ["planned 1 action(s): DemandDeficit", *[None] * 7]
    # another plan in between is reported, and so is the deficit after it
    assert reports.message(KEY, deferred, None, now=at[8]) == "planned 1 action(s): Noop/vm-1"
    assert reports.message(KEY, deficit, None, now=at[9]) == "planned 1 action(s): DemandDeficit"
    # the deficit again long after it was last planned: a new scale-up, reported
    assert reports.message(KEY, nothing, None, now=at[10]) is None
    assert reports.message(KEY, deficit, None, now=at[19]) == "planned 1 action(s): DemandDeficit"


def test_the_pacer_waits_only_for_routine_changes_of_a_recently_written_key() -> None:
    pacer = status_pacing.StatusPacer(interval=5.0)
    key = ObjectKey("ns/p")
    routine, transition = pool_status.Change.ROUTINE, pool_status.Change.TRANSITION
    assert pacer.delay(key, routine, now=NOW) is None  # never written by this process
    pacer.wrote(key, now=NOW)
    assert pacer.delay(key, transition, now=NOW + timedelta(seconds=1)) is None
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=1)) == 4.0
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=5)) is None
    assert pacer.delay(key, routine, now=NOW - timedelta(seconds=1)) is None  # clock set back
    pacer.forget(key)
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=1)) is None


def test_pool_change_tells_transitions_from_routine_changes() -> None:
    def desired(
        status: ConditionStatus, reason: str, message: str, machines: int
    ) -> pool_status.DesiredPoolStatus:
        return pool_status.DesiredPoolStatus(
            generation=2,
            fields={"agentMachines": machines},
            conditions=(
                ConditionDecision(PoolConditionType.CAPACITY_SATISFIED, status, reason, message),
            ),
        )

    base = desired(ConditionStatus.TRUE, "Satisfied", "agentMachines=1", 1)
    status: dict[str, object] = {}
    assert pool_status.pool_change(status, base, now=NOW) is pool_status.Change.TRANSITION
    pool_status.apply_pool(status, base, now=NOW)
    assert pool_status.pool_change(status, base, now=NOW) is pool_status.Change.NONE
    more = desired(ConditionStatus.TRUE, "Satisfied", "agentMachines=2", 2)
    assert pool_status.pool_change(status, more, now=NOW) is pool_status.Change.ROUTINE
    flipped = desired(ConditionStatus.FALSE, "DemandDeficit", "agentMachines=2", 2)
    assert pool_status.pool_change(status, flipped, now=NOW) is pool_status.Change.TRANSITION
    pool_status.apply_pool(status, flipped, now=NOW)
    # the reason alone, the status staying False: routine (paced), as in a burst
    provisioning = desired(ConditionStatus.FALSE, "Provisioning", "agentMachines=3", 3)
    assert pool_status.pool_change(status, provisioning, now=NOW) is pool_status.Change.ROUTINE
    newer = dataclasses.replace(base, generation=3)
    assert pool_status.pool_change(status, newer, now=NOW) is pool_status.Change.TRANSITION


async def test_agents_prepared_in_a_burst_are_reported_together() -> None:
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj("am-1"),
        machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="vm-1", bios_uuid=uuid(1), created=ago(minutes=5)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    clock = Clock()
    reconciler = pool.PoolReconciler(dataclasses.replace(h.deps, now=clock))
    await reconciler.reconcile(KEY)  # the first preparation: reported at once
    h.sync()
    assert [e.message for e in h.events.events if e.reason == "AgentsPrepared"] == [
        "prepared 1 Agent(s) for their VMs (pool labels, role, hostname, approval): a1 (VM vm-1)"
    ]
    for i in (2, 3):
        clock.advance(5.0)
        h.api.put(
            agent_machine_obj(f"am-{i}"),
            machine_obj(f"am-{i}"),
            vsphere_agent_obj(f"am-{i}", vm_name=f"vm-{i}", bios_uuid=uuid(i),
                              created=ago(minutes=5)),
            agent_obj(f"a{i}", bios_uuid=uuid(i)),
        )  # fmt: skip
        h.sync()
        result = await reconciler.reconcile(KEY)
        h.sync()
        assert result is not None
        assert result.requeue_after is not None
        assert result.requeue_after <= FLUSH_INTERVAL_S - 5.0 * (i - 1)
        assert h.api.find(kinds.AGENT, NS, f"a{i}")["spec"]["approved"]  # type: ignore[index]
    assert len([e for e in h.events.events if e.reason == "AgentsPrepared"]) == 1  # held

    clock.advance(FLUSH_INTERVAL_S - 10.0)
    await reconciler.reconcile(KEY)
    assert [e.message for e in h.events.events if e.reason == "AgentsPrepared"][1:] == [
        "prepared 2 Agent(s) for their VMs (pool labels, role, hostname, approval): "
        "a2 (VM vm-2), a3 (VM vm-3)"
    ]


def test_prepared_reports_hold_a_burst_and_report_a_failure_at_once() -> None:
    reports = plan_reports.BurstReports(interval=30.0)
    key = ObjectKey("ns/p")
    assert reports.due(key, [], now=NOW) == ([], None)
    assert reports.due(key, ["a1"], now=NOW) == (["a1"], None)
    later = NOW + timedelta(seconds=10)
    assert reports.due(key, ["a2"], now=later) == ([], 20.0)
    assert reports.due(key, [], now=later, at_once=True) == (["a2"], None)
    assert reports.due(key, ["a3"], now=later + timedelta(seconds=30)) == (["a3"], None)
    reports.forget(key)
    assert reports.due(key, ["a4"], now=later) == (["a4"], None)


def test_prepared_reports_wait_for_the_end_of_a_burst_or_the_interval() -> None:
    reports = plan_reports.BurstReports(interval=30.0)
    key = ObjectKey("ns/p")
    # more VMs on their way: held, however quiet the pool was before
    assert reports.due(key, ["a1"], now=NOW, more_coming=True) == ([], 30.0)
    later = NOW + timedelta(seconds=10)
    assert reports.due(key, ["a2"], now=later, more_coming=True) == ([], 20.0)
    # the burst's last one: all of them together
    assert reports.due(key, ["a3"], now=later) == (["a1", "a2", "a3"], None)
    # a long burst is reported every 30 s counted from the oldest held one
    start = later + timedelta(seconds=40)
    assert reports.due(key, ["a4"], now=start, more_coming=True) == ([], 30.0)
    assert reports.due(key, ["a5"], now=start + timedelta(seconds=30), more_coming=True) == (
        ["a4", "a5"],
        None,
    )
    # a lone one right after a report waits for the rest of the interval
    assert reports.due(key, ["a6"], now=start + timedelta(seconds=35)) == ([], 25.0)


def test_the_first_status_write_waits_for_the_checks_at_most_the_quiet_time() -> None:
    pacer = status_pacing.StatusPacer(interval=INTERVAL, first_quiet=10.0)
    assert pacer.first_delay(None, now=NOW) is None  # no creation time: at once
    assert pacer.first_delay(NOW - timedelta(seconds=4), now=NOW) == 6.0
    assert pacer.first_delay(NOW - timedelta(seconds=10), now=NOW) is None
    assert pacer.first_delay(NOW + timedelta(seconds=2), now=NOW) is None  # clock behind


def _checked(obj: dict[str, Any]) -> dict[str, Any]:
    """The pool as the `infra` controller leaves it after checks that passed."""
    when = format_time(NOW)
    obj["status"] = {
        "conditions": [
            {"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": when}
            for t, r in (("VsphereReady", "VsphereConnected"), ("ISOReady", "ISOCached"))
        ],
        "iso": {"path": "[iso-ds] agent-forge/x.iso"},
    }
    return obj


async def test_a_new_pool_writes_its_first_status_once_its_checks_are_reported() -> None:
    fresh = pool_obj()
    fresh["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(seconds=3))
    h = harness(fresh, infra_env_obj(), agent_machine_obj("am-1"), machine_obj("am-1"))
    clock = Clock()
    reconciler = pool.PoolReconciler(dataclasses.replace(h.deps, now=clock))
    result = await reconciler.reconcile(KEY)
    h.sync()
    assert pool_writes(h) == 0, "Ready=Unknown is not worth a write of its own"
    assert result is not None
    assert result.requeue_after is not None
    assert result.requeue_after <= status_pacing.FIRST_STATUS_QUIET_S - 3.0

    clock.advance(1.0)  # the infra controller reports its checks: the pool is woken
    h.api.put(_checked(h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL) or {}))
    h.sync()
    await reconciler.reconcile(KEY)
    h.sync()
    assert pool_writes(h) == 1
    ready = {c["type"]: c["status"] for c in written(h)["conditions"]}
    assert ready["Ready"] == "True"
    assert written(h)["agentMachines"] == 1


async def test_a_new_pool_whose_checks_take_long_says_so_after_the_quiet_time() -> None:
    fresh = pool_obj()
    fresh["metadata"]["creationTimestamp"] = format_time(NOW)
    h = harness(fresh, infra_env_obj())
    clock = Clock()
    reconciler = pool.PoolReconciler(dataclasses.replace(h.deps, now=clock))
    await reconciler.reconcile(KEY)
    assert pool_writes(h) == 0
    clock.advance(status_pacing.FIRST_STATUS_QUIET_S)
    await reconciler.reconcile(KEY)
    h.sync()
    assert pool_writes(h) == 1
    ready = next(c for c in written(h)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("Unknown", "AwaitingChecks")


def test_the_pacer_waits_the_burst_interval_while_vms_are_on_their_way() -> None:
    pacer = status_pacing.StatusPacer(interval=5.0, burst_interval=15.0)
    key = ObjectKey("ns/p")
    routine = pool_status.Change.ROUTINE
    pacer.wrote(key, now=NOW)
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=6), busy=True) == 9.0
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=6)) is None  # the burst ended
    assert pacer.delay(key, routine, now=NOW + timedelta(seconds=15), busy=True) is None
    assert (
        status_pacing.StatusPacer(interval=5.0, burst_interval=1.0).delay(
            key, routine, now=NOW, busy=True
        )
        is None
    )  # (never written) and never shorter than the routine interval
    short = status_pacing.StatusPacer(interval=5.0, burst_interval=1.0)
    short.wrote(key, now=NOW)
    assert short.delay(key, routine, now=NOW + timedelta(seconds=2), busy=True) == 3.0


async def test_routine_changes_wait_the_burst_interval_while_a_vm_boots() -> None:
    h, reconciler, clock = await one_routine_write()

    clock.advance(INTERVAL + 1.0)
    h.api.put(agent_machine_obj("am-3"))
    h.api.put(machine_obj("am-3"))
    h.api.put(vsphere_agent_obj("am-3", vm_name="vm-3", bios_uuid=uuid(3), created=ago(minutes=1)))
    h.sync()
    result = await reconciler.reconcile(KEY)  # vm-3 boots: the pool is busy
    h.sync()
    assert pool_writes(h) == 1
    burst = status_pacing.BURST_STATUS_INTERVAL_S
    assert result == Result(requeue_after=burst - INTERVAL - 1.0)

    h.api.put(agent_obj("a3", bios_uuid=uuid(3)))  # vm-3's Agent registers
    h.sync()
    await reconciler.reconcile(KEY)  # prepares it: the next reconcile has the plan after
    h.sync()
    assert pool_writes(h) == 1
    assert await reconciler.reconcile(KEY) is None  # nothing to do: the burst's end, at once
    assert pool_writes(h) == 2
    assert written(h)["plannedActions"][0]["type"] == "Noop"
    assert written(h)["agentMachines"] == 3
    assert [v["phase"] for v in written(h)["ownedVMs"]] == ["Available", "Available"]
