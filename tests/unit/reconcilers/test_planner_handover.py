"""Which VM serves which AgentMachine (`assignment`, through the planner).

Each test is one situation CAPI creates: an AgentMachine replaced while its VM boots,
a scale-down, a rollout, a name that comes back, an Agent bound by an AgentMachine
that was not pinned yet, a VM taken by another cluster.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentforge.api import names
from agentforge.api.pool import PlannedActionType
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning.planner import HANDOVER_GRACE, Plan
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NOW,
    World,
    agent_machine_obj,
    agent_obj,
    ago,
    by_vm,
    machine_obj,
    uuid,
    vsphere_agent_obj,
)


def booting(name: str, n: int, *, agent_machine: str | None = "") -> dict[str, Any]:
    """A VsphereAgent whose VM exists and boots (no Agent yet)."""
    return vsphere_agent_obj(
        name,
        bios_uuid=uuid(n),
        phase="Provisioning",
        reason="AgentPending",
        created=ago(minutes=5),
        agent_machine=agent_machine,
    )


def handed(plan: Plan) -> dict[str, str]:
    return {h.vsphere_agent: h.agent_machine for h in plan.handovers}


def test_the_replacement_gets_the_booting_vm_of_the_replaced_agent_machine() -> None:
    world = World().add(booting("am-old", 1), agent_machine_obj("am-new"))
    plan = world.plan()
    assert handed(plan) == {"am-old": "am-new"}
    assert plan.creations == ()
    record = by_vm(plan)["am-old"]
    assert (record.phase, record.reason) == (VMPhase.PROVISIONING, VMReason.AGENT_PENDING)
    assert record.handover is not None
    assert (record.handover.from_, record.handover.to) == ("am-old", "am-new")
    assert record.handover.to_uid == "uid-am-am-new"
    assert plan.counts.demand_deficit == 0
    (action,) = [a for a in plan.actions if a.type is PlannedActionType.HAND_OVER_VM]
    assert "serves AgentMachine am-new" in action.reason


def test_the_oldest_waiting_agent_machines_get_the_vms_furthest_along_the_rest_new_ones() -> None:
    late, early = agent_machine_obj("am-late"), agent_machine_obj("am-early")
    late["metadata"]["creationTimestamp"] = "2026-03-01T11:59:00Z"
    early["metadata"]["creationTimestamp"] = "2026-03-01T11:00:00Z"
    newest = agent_machine_obj("am-newest")
    newest["metadata"]["creationTimestamp"] = "2026-03-01T11:59:30Z"
    world = World().add(
        vsphere_agent_obj("gone-1", created=ago(minutes=1)),  # no VM yet
        booting("gone-2", 2),
        agent_obj("a2", bios_uuid=uuid(2)),  # discovered: furthest along
        late,
        early,
        newest,
    )
    plan = world.plan()
    assert handed(plan) == {"gone-2": "am-early", "gone-1": "am-late"}
    assert [c.agent_machine for c in plan.creations] == ["am-newest"]


def test_with_nobody_waiting_the_vm_is_spare_then_deleted_after_the_grace() -> None:
    world = World().add(booting("am-old", 1))
    plan = world.plan()
    record = by_vm(plan)["am-old"]
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETED)
    assert plan.deletions == ()
    assert plan.wake_at == NOW + HANDOVER_GRACE
    assert plan.counts.pending_owned_vms == 0
    world.apply(plan)
    world.now = NOW + HANDOVER_GRACE - timedelta(seconds=1)
    assert world.plan().deletions == ()
    world.now = NOW + HANDOVER_GRACE
    assert [d.vsphere_agent for d in world.plan().deletions] == ["am-old"]


def test_a_spare_is_handed_over_when_a_replacement_comes_within_the_grace() -> None:
    world = World().add(booting("am-old", 1))
    world.apply(world.plan())
    world.now = NOW + HANDOVER_GRACE / 2
    world.add(agent_machine_obj("am-new"))
    plan = world.plan()
    assert handed(plan) == {"am-old": "am-new"}
    record = by_vm(plan)["am-old"]
    assert record.phase is VMPhase.PROVISIONING  # spare, never bound: back in service
    assert record.handover is not None
    assert record.handover.to == "am-new"


def test_retain_keeps_a_spare_and_still_hands_it_over() -> None:
    world = World(cleanupPolicy="Retain").add(
        booting("am-old", 1), agent_obj("a1", bios_uuid=uuid(1))
    )
    world.apply(world.plan())
    world.now = NOW + HANDOVER_GRACE * 10
    plan = world.plan()
    assert plan.deletions == ()
    assert plan.wake_at is None
    world.add(agent_machine_obj("am-new"))
    assert handed(world.plan()) == {"am-old": "am-new"}


def test_a_machine_being_deleted_frees_its_vm_for_the_replacement_at_once() -> None:
    """A remediation: CAPI deletes the Machine, the AgentMachine goes after the drain,
    the MachineSet makes the replacement meanwhile."""
    world = World().add(
        agent_machine_obj("am-old"),
        machine_obj("m-old", infra="am-old", deleting=True),
        booting("am-old", 1),
        agent_machine_obj("am-new"),
    )
    plan = world.plan()
    assert handed(plan) == {"am-old": "am-new"}
    assert plan.creations == ()
    lone = World().add(
        agent_machine_obj("am-old"),
        machine_obj("m-old", infra="am-old", deleting=True),
        booting("am-old", 1),
    )
    record = by_vm(lone.plan())["am-old"]
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETING)


def test_a_vm_whose_agent_is_or_was_bound_is_never_handed_over() -> None:
    world = World().add(
        vsphere_agent_obj("am-old", bios_uuid=uuid(1), phase="Bound", agent_ref="a1"),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-old"),  # CAPI has not unbound it yet
        agent_machine_obj("am-new"),
    )
    plan = world.plan()
    assert handed(plan) == {}
    assert [c.agent_machine for c in plan.creations] == ["am-new"]
    released = World().add(
        vsphere_agent_obj(
            "am-old", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted",
            agent_ref="a1", machine_ref="m-old",
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
        agent_machine_obj("am-new"),
    )  # fmt: skip
    plan = released.plan()
    assert handed(plan) == {}
    assert [c.agent_machine for c in plan.creations] == ["am-new"]
    assert [d.vsphere_agent for d in plan.deletions] == ["am-old"]  # as before: at once


def test_an_agent_machine_back_under_its_name_takes_its_spare_back() -> None:
    world = World().add(booting("am-1", 1))
    world.apply(world.plan())
    assert world.vsphere_agents["am-1"]["status"]["handover"]["fromAgentMachine"] == "am-1"
    world.add(agent_machine_obj("am-1"))
    plan = world.plan()
    assert handed(plan) == {}  # its label already names it
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.handover) == (VMPhase.PROVISIONING, None)
    assert plan.creations == ()


def test_a_hand_over_to_an_agent_machine_re_created_under_its_name_is_not_resumed() -> None:
    va = booting("am-old", 1)
    va["status"]["handover"] = {
        "fromAgentMachine": "am-old",
        "toAgentMachine": "am-new",
        "toAgentMachineUID": "uid-of-the-deleted-am-new",
        "since": "2026-03-01T11:59:00Z",
    }
    world = World().add(va, agent_machine_obj("am-new"))  # uid-am-am-new: another object
    plan = world.plan()
    # the new am-new waits too: it gets the VM by a fresh hand-over, with its own UID
    (handover,) = plan.handovers
    record = by_vm(plan)["am-old"]
    assert record.handover is not None
    assert record.handover.to_uid == "uid-am-am-new"
    assert handover.agent_machine == "am-new"


def test_the_binding_decides_which_agent_machine_a_vm_serves() -> None:
    """`am-b` was not pinned yet when CAPI bound it to the Agent prepared for `am-a`:
    that VM serves `am-b` now, and `am-a` gets another VM instead of waiting for ever."""
    world = World().add(
        agent_machine_obj("am-a"),
        agent_machine_obj("am-b", waiting=False, agent="a1"),
        vsphere_agent_obj("am-a", bios_uuid=uuid(1), phase="Available", agent_ref="a1"),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-b",
                  labels={names.LABEL_AGENT_MACHINE: "am-a"}),
    )  # fmt: skip
    plan = world.plan()
    assert by_vm(plan)["am-a"].phase is VMPhase.BOUND
    assert [c.agent_machine for c in plan.creations] == ["am-a"]


def test_a_vm_taken_by_a_namesake_cluster_serves_nothing_and_its_agent_machine_gets_another() -> (
    None
):
    world = World().add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Available", agent_ref="a1"),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-1", bound_in="clusters-elsewhere",
                  cluster_namespace="clusters-elsewhere"),
    )  # fmt: skip
    plan = world.plan()
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.reason) == (VMPhase.ORPHANED, VMReason.AGENT_BOUND_ELSEWHERE)
    assert [c.agent_machine for c in plan.creations] == ["am-1"]
    world.apply(plan)
    world.now = NOW + HANDOVER_GRACE * 10  # past the orphan grace: due, but held
    plan = world.plan()
    assert plan.deletions == ()
    (deferral,) = plan.deferrals
    assert "bound to another cluster or pool" in deferral.reason
    assert "AgentMachine clusters-elsewhere/am-1" in deferral.reason
    assert CPNS not in deferral.reason


def test_an_orphaned_vm_keeps_its_agent_machine_until_it_is_cleaned_up() -> None:
    world = World().add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Orphaned",
                          reason="DiscoveryTimeout", transition=ago(minutes=1)),
    )  # fmt: skip
    plan = world.plan()
    assert (plan.creations, plan.handovers, plan.deletions) == ((), (), ())


def test_an_agent_machine_whose_vsphere_agent_is_being_deleted_gets_no_new_one() -> None:
    world = World().add(agent_machine_obj("am-1"), vsphere_agent_obj("am-1", deleting=True))
    plan = world.plan()
    assert (plan.creations, plan.handovers) == ((), ())  # waited for, never duplicated


def test_an_agent_machine_whose_vsphere_agent_is_being_deleted_takes_a_free_vm() -> None:
    """The deleted one serves it no more: a spare waiting for its finalizer while the
    AgentMachine waits too is a VM too many (and deleted `HANDOVER_GRACE` later)."""
    world = World().add(
        agent_machine_obj("am-1"), vsphere_agent_obj("am-1", deleting=True), booting("spare", 2)
    )
    plan = world.plan()
    assert handed(plan) == {"spare": "am-1"}
    assert plan.creations == ()


def orphan_of_am_1(minutes: float) -> dict[str, object]:
    return vsphere_agent_obj(
        "am-1", bios_uuid=uuid(1), phase="Orphaned", reason="DiscoveryTimeout",
        transition=ago(minutes=minutes), created=ago(minutes=minutes + 30),
    )  # fmt: skip


def test_the_plan_that_deletes_an_orphan_hands_a_free_vm_to_its_agent_machine() -> None:
    """Regression (the churn property, `start(n=2)`, `plan`, `progress(0)`, `tick(40)`,
    `plan`, `tick(40)`, `delete(1, via_machine=False)`, `plan`): am-1's VM was Orphaned
    40 minutes ago and am-2 went away while its VM was still being made. The plan
    deleted the orphan but counted it as serving am-1, so am-2's VM became spare while
    am-1 waited; the next plans saw am-1's VsphereAgent being deleted and handed it
    nothing either, so the spare waited for the finalizer (or its grace)."""
    world = World().add(
        agent_machine_obj("am-1"),
        orphan_of_am_1(40),
        vsphere_agent_obj("am-2", created=ago(minutes=80)),  # no VM yet, am-2 gone
    )
    plan = world.plan()
    assert [d.vsphere_agent for d in plan.deletions] == ["am-1"]
    assert handed(plan) == {"am-2": "am-1"}
    assert plan.creations == ()
    assert by_vm(plan)["am-2"].phase is VMPhase.PROVISIONING


def test_the_plan_that_deletes_an_orphan_makes_no_new_vm_for_its_agent_machine() -> None:
    world = World().add(agent_machine_obj("am-1"), orphan_of_am_1(40))
    plan = world.plan()
    assert [d.vsphere_agent for d in plan.deletions] == ["am-1"]
    assert (plan.creations, plan.handovers) == ((), ())  # the next plans wait for it


def test_an_orphan_kept_by_retain_or_its_grace_keeps_its_agent_machine() -> None:
    for world in (
        World(cleanupPolicy="Retain").add(agent_machine_obj("am-1"), orphan_of_am_1(40)),
        World().add(agent_machine_obj("am-1"), orphan_of_am_1(29)),
    ):
        world.add(vsphere_agent_obj("am-2", created=ago(minutes=80)))
        plan = world.plan()
        assert (plan.deletions, plan.handovers, plan.creations) == ((), (), ())
        assert by_vm(plan)["am-2"].phase is VMPhase.RELEASED


def test_adopted_vms_serve_no_agent_machine() -> None:
    world = World().add(
        vsphere_agent_obj(
            "adopt", bios_uuid=uuid(1), agent_machine=None,
            created_for=names.CreatedFor.ADOPTED.value, created=ago(minutes=5),
        ),
        agent_machine_obj("am-1"),
    )  # fmt: skip
    plan = world.plan()
    assert handed(plan) == {}
    assert [c.agent_machine for c in plan.creations] == ["am-1"]
    assert by_vm(plan)["adopt"].phase is VMPhase.PROVISIONING
