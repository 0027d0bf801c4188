"""Agent preparation: the patch sets what the pool wants and nothing that already holds."""

from __future__ import annotations

from typing import Any

from agentforge.api import names
from tests.unit.reconcilers.planner_support import (
    World,
    agent_machine_obj,
    agent_obj,
    uuid,
    vsphere_agent_obj,
)


def patches(world: World) -> dict[str, dict[str, Any]]:
    return {p.agent: dict(p.patch) for p in world.plan().patches}


def test_an_available_vms_agent_gets_labels_role_hostname_selection_and_approval() -> None:
    world = World().add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="demo-worker-1a2b3c4d", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    assert patches(world) == {
        "a1": {
            "metadata": {
                "labels": {
                    "customer": "acme",
                    names.LABEL_NODEPOOL: "workers",
                    names.LABEL_NODEPOOL_ROLE: "worker",
                    names.LABEL_AGENT_MACHINE: "am-1",
                }
            },
            "spec": {"role": "worker", "hostname": "demo-worker-1a2b3c4d", "approved": True},
        }
    }


def test_only_the_fields_that_differ_are_patched() -> None:
    world = World().add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="vm-1", bios_uuid=uuid(1)),
        agent_obj(
            "a1",
            bios_uuid=uuid(1),
            labels={"customer": "acme", names.LABEL_NODEPOOL: "workers"},
            role="worker",
            approved=True,
        ),
    )
    assert patches(world) == {
        "a1": {
            "metadata": {
                "labels": {names.LABEL_NODEPOOL_ROLE: "worker", names.LABEL_AGENT_MACHINE: "am-1"}
            },
            "spec": {"hostname": "vm-1"},
        }
    }


def test_approve_false_never_touches_spec_approved() -> None:
    world = World(agent={"approve": False}).add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    assert "approved" not in patches(world)["a1"]["spec"]


def test_a_discriminator_in_the_pool_labels_is_kept_as_written() -> None:
    world = World(agent={"labels": {"customer": "acme", names.LABEL_NODEPOOL: "blue"}}).add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    assert patches(world)["a1"]["metadata"]["labels"][names.LABEL_NODEPOOL] == "blue"


def test_an_adopted_vms_agent_is_selected_by_the_vm_name() -> None:
    world = World().add(
        vsphere_agent_obj(
            "adopt-1",
            vm_name="legacy-vm",
            bios_uuid=uuid(1),
            agent_machine=None,
            created_for=names.CreatedFor.ADOPTED.value,
        ),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    assert patches(world)["a1"]["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "legacy-vm"


def test_bound_released_and_deleting_agents_are_never_patched() -> None:
    world = World().add(
        vsphere_agent_obj("bound", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1), bound_to="bound"),
        vsphere_agent_obj("released", bios_uuid=uuid(2), phase="Bound", agent_ref="a2"),
        agent_obj("a2", bios_uuid=uuid(2)),
        vsphere_agent_obj("deleting", bios_uuid=uuid(3)),
        agent_obj("a3", bios_uuid=uuid(3), deleting=True),
    )
    assert patches(world) == {}


def test_agents_not_matched_to_an_owned_vm_are_never_patched() -> None:
    world = World().add(agent_obj("stray", bios_uuid=uuid(1), labels={"customer": "acme"}))
    plan = world.plan()
    assert plan.patches == ()
    assert plan.counts.matching_agents == 1  # it carries the pool labels, so it counts


def test_a_prepared_agent_needs_no_patch() -> None:
    world = World().add(
        agent_machine_obj("am-1"),
        vsphere_agent_obj("am-1", vm_name="vm-1", bios_uuid=uuid(1)),
        agent_obj("a1", bios_uuid=uuid(1)),
    )
    world.apply(world.plan())
    assert patches(world) == {}
