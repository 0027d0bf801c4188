"""Clean-up: only under Delete, never of a VM whose Agent is bound, after the grace periods."""

from __future__ import annotations

from typing import Any

from agentforge.api import names
from agentforge.api.pool import PlannedActionType
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning.planner import HANDOVER_GRACE, ORPHAN_GRACE
from agentforge.reconcilers.planning.snapshot import Claim
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NOW,
    World,
    agent_machine_obj,
    agent_obj,
    ago,
    mac,
    machine_obj,
    uuid,
    vsphere_agent_obj,
)


def released(world: World, name: str = "am-1", *, agent: str = "a1", bound: bool = False) -> World:
    """A VM whose Machine was deleted (scale-down finished) and whose Agent is unbound."""
    return world.add(
        vsphere_agent_obj(
            name,
            bios_uuid=uuid(1),
            phase="Released",
            reason="MachineDeleting",
            agent_ref=agent,
            machine_ref="machine-1",
        ),
        agent_obj(agent, bios_uuid=uuid(1), bound_to="am-1" if bound else None),
    )


def deleted(world: World) -> dict[str, str | None]:
    return {d.vsphere_agent: d.agent for d in world.plan().deletions}


def test_a_released_vm_whose_machine_is_gone_is_deleted_with_its_agent() -> None:
    world = released(World())
    plan = world.plan()
    assert {d.vsphere_agent: d.agent for d in plan.deletions} == {"am-1": "a1"}
    assert [(a.type, a.name) for a in plan.actions] == [
        (PlannedActionType.DELETE_VM, "vm-am-1"),
        (PlannedActionType.DELETE_AGENT, "a1"),
    ]


def test_retain_never_deletes_anything() -> None:
    world = released(World(cleanupPolicy="Retain"))
    world.add(vsphere_agent_obj("orphan", phase="Orphaned", reason="AgentMissing",
                                transition=ago(hours=5)))  # fmt: skip
    plan = world.plan()
    assert plan.deletions == ()
    assert plan.vms[0].phase.value in ("Bound", "Released")
    assert plan.deferrals == ()


def test_a_released_vm_whose_agent_is_still_assigned_to_a_cluster_is_kept() -> None:
    world = World().add(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1), cluster="demo"),
    )  # fmt: skip
    plan = world.plan()
    # a clusterDeploymentName still set: bound, so the VM stays (phase Bound, not deletable)
    assert plan.deletions == ()


def test_an_orphan_whose_agent_returns_bound_is_bound_not_deleted() -> None:
    world = World().add(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Orphaned", reason="AgentMissing",
            transition=ago(hours=1),
        ),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-9"),
    )  # fmt: skip
    plan = world.plan()
    assert plan.deletions == ()
    assert plan.vms[0].phase.value == "Bound"


def test_a_machine_still_deleting_keeps_the_vm() -> None:
    world = World().add(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Bound", agent_ref="a1", machine_ref="machine-1"
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
        machine_obj("machine-1", infra="am-1", deleting=True),
    )
    plan = world.plan()
    assert plan.vms[0].reason.value == "MachineDeleting"
    assert plan.deletions == ()


def test_an_orphan_is_deleted_only_after_its_grace_period() -> None:
    world = World().add(
        vsphere_agent_obj(
            "am-1", phase="Orphaned", reason="AgentMissing", transition=ago(minutes=10)
        )
    )
    plan = world.plan()
    assert plan.deletions == ()
    assert plan.wake_at == ago(minutes=10) + ORPHAN_GRACE
    world.now = ago(minutes=10) + ORPHAN_GRACE
    assert deleted(world) == {"am-1": None}


def test_orphans_are_cleaned_up_even_while_agent_machines_wait() -> None:
    world = World().add(
        vsphere_agent_obj("am-1", phase="Orphaned", reason="DiscoveryTimeout",
                          transition=ago(hours=1)),
        agent_machine_obj("am-1", waiting=True),
    )  # fmt: skip
    assert deleted(world) == {"am-1": None}


def test_a_vm_whose_agent_machine_is_gone_is_spare_then_deleted_after_the_handover_grace() -> None:
    world = World().add(
        vsphere_agent_obj("am-gone", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
        agent_machine_obj("am-2", waiting=False, ready=True, agent="a2"),
    )
    plan = world.plan()
    (record,) = plan.vms
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETED)
    assert record.handover is not None
    assert (record.handover.from_, record.handover.to) == ("am-gone", None)
    assert plan.deletions == ()
    assert plan.wake_at == NOW + HANDOVER_GRACE
    world.apply(plan)
    world.now = NOW + HANDOVER_GRACE
    plan = world.plan()
    assert {d.vsphere_agent: d.agent for d in plan.deletions} == {"am-gone": "a1"}
    assert "no AgentMachine of the pool took it within 5 minutes" in plan.deletions[0].reason


def test_a_waiting_agent_machine_takes_the_vm_of_a_gone_one_instead_of_a_new_vm() -> None:
    world = World().add(
        vsphere_agent_obj("am-gone", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
        agent_machine_obj("am-2", waiting=True),
    )
    plan = world.plan()
    assert plan.deletions == ()
    assert plan.creations == ()
    assert [(h.vsphere_agent, h.agent_machine) for h in plan.handovers] == [("am-gone", "am-2")]


def test_an_unready_agent_machine_that_does_not_wait_takes_nothing() -> None:
    world = World().add(
        vsphere_agent_obj("am-gone", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
        agent_machine_obj("am-2", waiting=False, ready=False),
    )
    plan = world.plan()
    assert (plan.handovers, plan.creations) == ((), ())
    assert plan.vms[0].phase is VMPhase.RELEASED


def test_a_vm_whose_agent_machine_got_another_agent_is_spare() -> None:
    world = World().add(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
        agent_machine_obj("am-1", waiting=False, ready=True, agent="x"),
    )
    plan = world.plan()
    assert (plan.vms[0].phase, plan.vms[0].reason) == (
        VMPhase.RELEASED,
        VMReason.AGENT_MACHINE_SERVED,
    )
    assert plan.deletions == ()


def test_adopted_vms_are_never_surplus() -> None:
    world = World().add(
        vsphere_agent_obj(
            "adopt", bios_uuid=uuid(1), agent_machine=None,
            created_for=names.CreatedFor.ADOPTED.value,
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )  # fmt: skip
    assert deleted(world) == {}


def test_cleanup_pauses_while_agent_machines_match_several_pools() -> None:
    world = released(World())
    world.competing = ["other-pool"]
    plan = world.plan()
    assert plan.deletions == ()
    assert [d.vm for d in plan.deferrals] == ["vm-am-1"]
    assert plan.actions[-1].type is PlannedActionType.NOOP


def test_a_machine_deleted_record_is_kept_while_its_agent_is_bound() -> None:
    world = World().add(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleted",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-1"),
        machine_obj("machine-1", infra="am-1", deleting=True),
    )  # fmt: skip
    plan = world.plan()
    assert plan.deletions == ()


# --- never the VM of a bound Agent, whatever the bookkeeping says --------------------------


def orphan(bios_uuid: str, mac_address: str | None = None) -> dict[str, Any]:
    """An Orphaned VM past its grace period whose agentRef was cleared."""
    return vsphere_agent_obj(
        "am-1",
        phase="Orphaned",
        reason="AgentMissing",
        transition=ago(hours=2),
        bios_uuid=bios_uuid,
        mac_address=mac_address,
    )


def test_never_delete_a_vm_a_bound_agent_identifies_by_bios_uuid_even_if_not_matched() -> None:
    # The Agent is not this pool's to match (another pool's label) and the record lost
    # its agentRef: the BIOS UUID from its serial still says it is this VM's, bound.
    world = World().add(
        orphan(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("a1", bios_uuid=uuid(1), macs=[mac(1)], bound_to="am-1",
                  labels={names.LABEL_NODEPOOL: "another-nodepool"}),
    )  # fmt: skip
    plan = world.plan()
    assert plan.deletions == ()
    assert [(d.vm, d.agent) for d in plan.deferrals] == [("vm-am-1", "a1")]
    assert f"Agent a1 is still bound to AgentMachine {CPNS}/am-1" in plan.deferrals[0].reason
    assert "BIOS UUID" in plan.deferrals[0].reason


def test_never_delete_a_vm_a_bound_agent_identifies_by_mac_without_a_bios_uuid() -> None:
    world = World().add(
        orphan(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("a1", macs=[mac(1)], cluster="another-cluster"),  # no VMware serial
    )
    plan = world.plan()
    assert plan.deletions == ()
    assert [(d.vm, d.agent) for d in plan.deferrals] == [("vm-am-1", "a1")]


def test_never_delete_a_vm_whose_bound_agent_is_claimed_by_another_pool() -> None:
    world = World().add(
        orphan(bios_uuid=uuid(1)), agent_obj("a1", bios_uuid=uuid(1), bound_to="am-7")
    )
    world.claims = [Claim("other", "theirs", "vm-theirs", None, None, "a1")]
    assert deleted(world) == {}
    assert [d.agent for d in world.plan().deferrals] == ["a1"]


def test_a_bound_agent_sharing_only_the_mac_of_another_vm_blocks_nothing() -> None:
    world = World().add(
        orphan(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("theirs", bios_uuid=uuid(2), macs=[mac(1)], bound_to="am-9",
                  labels={names.LABEL_NODEPOOL: "another-nodepool"}),
    )  # fmt: skip
    assert deleted(world) == {"am-1": None}


def _released_for(machine_uid: str) -> World:
    """A once-bound VM whose Agent was unbound, recorded for Machine machine-1 of
    `machine_uid`; Machine machine-1 exists (UID uid-machine-machine-1)."""
    va = vsphere_agent_obj(
        "am-1", bios_uuid=uuid(1), phase="Released", reason="AgentUnbound",
        agent_ref="a1", machine_ref="machine-1",
    )  # fmt: skip
    va["status"]["vm"]["machineRef"]["uid"] = machine_uid
    return World().add(va, agent_obj("a1", bios_uuid=uuid(1)), machine_obj("machine-1"))


def test_a_released_vm_whose_machine_was_recreated_under_its_name_is_deleted() -> None:
    # the namesake is another Machine: the one the VM served is gone
    plan = _released_for("uid-of-the-deleted-machine").plan()
    assert (plan.vms[0].phase, plan.vms[0].reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETED)
    assert {d.vsphere_agent: d.agent for d in plan.deletions} == {"am-1": "a1"}


def test_a_released_vm_whose_recorded_machine_still_exists_is_kept() -> None:
    plan = _released_for("uid-machine-machine-1").plan()
    assert (plan.vms[0].phase, plan.vms[0].reason) == (VMPhase.RELEASED, VMReason.AGENT_UNBOUND)
    assert plan.deletions == ()
