"""Owned VM phases: every transition of DOMAIN.md section 3 as made precise in 0002."""

from __future__ import annotations

from typing import Any

from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning.planner import ORPHAN_GRACE
from tests.unit.reconcilers.planner_support import (
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


def one(world: World, name: str = "am-1"):  # type: ignore[no-untyped-def]
    return by_vm(world.plan())[name]


def served(*objs: dict[str, Any]) -> World:
    """A world whose VsphereAgent `am-1` serves its AgentMachine (waiting unless the
    test adds another `am-1`): the phases of a VM nobody needs are `assignment`'s."""
    return World().add(agent_machine_obj("am-1"), *objs)


def test_a_vsphere_agent_without_a_vm_is_provisioning_and_never_times_out() -> None:
    world = served(vsphere_agent_obj("am-1", created=ago(hours=5)))
    plan = world.plan()
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.reason) == (VMPhase.PROVISIONING, VMReason.AGENT_PENDING)
    assert plan.wake_at is None


def test_creation_progress_is_not_the_planners_to_record_one_reason_for_provisioning() -> None:
    # The vm controller reports pending/creating/created in Ready and status.creation;
    # mirroring it into status.vm.reason cost two VsphereAgent writes per VM.
    world = served(vsphere_agent_obj("am-1", phase="Provisioning", reason="AgentPending"))
    assert not one(world).changed
    world.add(vsphere_agent_obj("am-1", phase="Provisioning", reason="AgentPending", creating=True))
    assert not one(world).changed
    world.add(
        vsphere_agent_obj(
            "am-1",
            phase="Provisioning",
            reason="AgentPending",
            bios_uuid=uuid(1),
            created=ago(minutes=1),
            ready_since=ago(minutes=1),
        )
    )
    record = one(world)
    assert (record.phase, record.reason, record.changed) == (
        VMPhase.PROVISIONING,
        VMReason.AGENT_PENDING,
        False,
    )


def test_a_legacy_creation_reason_is_rewritten_once() -> None:
    world = served(vsphere_agent_obj("am-1", phase="Provisioning", reason="VMCreated"))
    record = one(world)
    assert (record.reason, record.changed) == (VMReason.AGENT_PENDING, True)


def test_an_adopted_vm_without_agent_is_provisioning_vm_adopted() -> None:
    world = served(
        vsphere_agent_obj("am-1", created_for="adopted", agent_machine=None, created=ago(minutes=1))
    )
    assert (one(world).phase, one(world).reason) == (VMPhase.PROVISIONING, VMReason.VM_ADOPTED)


def test_a_created_vm_without_agent_is_provisioning_until_the_discovery_deadline() -> None:
    world = served(vsphere_agent_obj("am-1", bios_uuid=uuid(1), created=ago(minutes=10)))
    plan = world.plan()
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.reason) == (VMPhase.PROVISIONING, VMReason.AGENT_PENDING)
    assert plan.wake_at == ago(minutes=10) + ORPHAN_GRACE


def test_a_vm_without_discovery_for_30_minutes_is_orphaned() -> None:
    world = served(vsphere_agent_obj("am-1", bios_uuid=uuid(1), created=ago(minutes=30)))
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.ORPHANED, VMReason.DISCOVERY_TIMEOUT)
    assert record.last_transition == NOW


def test_the_discovery_clock_starts_when_the_vm_became_ready_not_at_request_time() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), created=ago(hours=2), ready_since=ago(minutes=5)
        )
    )
    plan = world.plan()
    assert by_vm(plan)["am-1"].phase is VMPhase.PROVISIONING
    assert plan.wake_at == ago(minutes=5) + ORPHAN_GRACE


def test_a_matched_unbound_agent_makes_the_vm_available() -> None:
    world = served(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Provisioning", transition=ago(hours=1)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.AVAILABLE, VMReason.AGENT_AVAILABLE)
    assert record.agent is not None
    assert record.agent.name == "a1"
    assert record.last_transition == NOW
    assert record.changed


def test_a_bound_agent_makes_the_vm_bound_with_its_machine() -> None:
    world = served(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Available", agent_ref="a1"),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-1"),
        agent_machine_obj("am-1", waiting=False, ready=True, agent="a1"),
        machine_obj("machine-1", infra="am-1"),
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.BOUND, VMReason.AGENT_BOUND)
    assert record.machine is not None
    assert (record.machine.name, record.machine.uid) == ("machine-1", "uid-machine-machine-1")


def test_an_agent_unbound_after_being_bound_releases_the_vm() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Bound", agent_ref="a1", machine_ref="machine-1"
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
        machine_obj("machine-1", infra="am-1"),
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.AGENT_UNBOUND)
    assert record.machine is not None
    assert record.machine.name == "machine-1"


def test_a_deleting_machine_releases_the_vm_even_while_its_agent_is_bound() -> None:
    world = served(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Bound", agent_ref="a1"),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="am-1"),
        machine_obj("machine-1", infra="am-1", deleting=True),
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETING)


def test_a_released_vm_whose_machine_is_gone_is_released_machine_deleted() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1",
            bios_uuid=uuid(1),
            phase="Released",
            reason="MachineDeleting",
            agent_ref="a1",
            machine_ref="machine-1",
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETED)
    assert record.machine is not None
    assert record.machine.name == "machine-1"
    assert record.last_transition == ago(hours=1)  # same phase: the time stays


def test_a_released_machine_deleting_record_without_machine_ref_becomes_machine_deleted() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleting", agent_ref="a1"
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    assert one(world).reason == VMReason.MACHINE_DELETED


def test_a_vanished_agent_orphans_the_vm_and_clears_its_references() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Bound", agent_ref="a1", machine_ref="machine-1"
        )
    )
    record = one(world)
    assert (record.phase, record.reason) == (VMPhase.ORPHANED, VMReason.AGENT_MISSING)
    assert record.agent is None
    assert record.machine is None


def test_an_orphan_whose_agent_reappears_becomes_available_again() -> None:
    world = served(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Orphaned", reason="AgentMissing"),
        agent_obj("a1-new", bios_uuid=uuid(1)),
    )
    record = one(world)
    assert record.phase is VMPhase.AVAILABLE
    assert record.agent is not None
    assert record.agent.name == "a1-new"


def test_an_orphan_stays_an_orphan_with_its_transition_time() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Orphaned", reason="AgentMissing",
            transition=ago(minutes=3),
        )
    )  # fmt: skip
    record = one(world)
    assert (record.phase, record.reason, record.changed) == (
        VMPhase.ORPHANED,
        VMReason.AGENT_MISSING,
        False,
    )
    assert record.last_transition == ago(minutes=3)


def test_an_unchanged_vm_is_not_marked_changed() -> None:
    world = served(
        vsphere_agent_obj(
            "am-1",
            bios_uuid=uuid(1),
            phase="Available",
            reason="AgentAvailable",
            agent_ref="a1",
            transition=ago(minutes=7),
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    record = one(world)
    assert not record.changed
    assert record.last_transition == ago(minutes=7)


def test_deleting_vsphere_agents_get_no_record() -> None:
    world = served(vsphere_agent_obj("am-1", bios_uuid=uuid(1), deleting=True))
    assert world.plan().vms == ()
