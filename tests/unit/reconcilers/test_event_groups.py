"""Which events the recorder may combine onto a pool."""

from __future__ import annotations

from typing import Any

from agentforge.reconcilers.common import event_groups
from tests.unit.reconcilers.planner_support import NS, POOL, vsphere_agent_obj


def owned(owner: dict[str, Any] | None = None) -> dict[str, Any]:
    va = vsphere_agent_obj("am-1")
    va["metadata"]["ownerReferences"] = [
        owner
        or {
            "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
            "kind": "VsphereAgentPool",
            "name": POOL,
            "uid": "pool-uid",
            "controller": True,
        }
    ]
    return va


def test_a_vsphere_agents_creation_and_deletion_may_be_combined_onto_its_pool() -> None:
    for reason in ("VMCreating", "VMCreated", "VMDeleted", "AgentDeleted"):
        group = event_groups.pool_of(owned(), "Normal", reason)
        assert group == {
            "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
            "kind": "VsphereAgentPool",
            "metadata": {"namespace": NS, "name": POOL, "uid": "pool-uid"},
        }


def test_warnings_and_other_reasons_stay_on_their_object() -> None:
    va = owned()
    assert event_groups.pool_of(va, "Warning", "VMCreated") is None
    for reason in ("VMRetained", "VMAdopted", "ISOEjected"):
        assert event_groups.pool_of(va, "Normal", reason) is None


def test_a_vsphere_agent_without_a_pool_as_controller_owner_keeps_its_events() -> None:
    user_made = vsphere_agent_obj("am-1")  # adoption: made by a user, no owner
    assert event_groups.pool_of(user_made, "Normal", "VMCreated") is None
    not_controller = owned({"apiVersion": "v1", "kind": "VsphereAgentPool", "name": POOL,
                            "uid": "pool-uid", "controller": False})  # fmt: skip
    assert event_groups.pool_of(not_controller, "Normal", "VMCreated") is None
    am = {"kind": "AgentMachine", "metadata": {"name": "am-1", "namespace": "cp"}}
    assert event_groups.pool_of(am, "Normal", "VMCreated") is None
