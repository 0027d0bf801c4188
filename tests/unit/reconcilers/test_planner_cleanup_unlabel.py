"""Clean-up unlabels first: a VM is deleted only once its unbound Agent carries none of the
pool's selector labels, so CAPI cannot bind the Agent of a VM on its way out."""

from __future__ import annotations

from typing import Any

from agentforge.api import names
from agentforge.api.pool import PlannedActionType
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.planning.planner import HANDOVER_GRACE, Ref, Unlabel
from tests.unit.reconcilers.planner_support import (
    LABELS,
    NOW,
    World,
    agent_machine_obj,
    agent_obj,
    machine_obj,
    uuid,
    vsphere_agent_obj,
)

PREPARED = {
    **LABELS,
    names.LABEL_NODEPOOL: "workers",
    names.LABEL_NODEPOOL_ROLE: "worker",
    names.LABEL_AGENT_MACHINE: "am-1",
}
"""What preparation left on the Agent of `am-1`'s VM."""


def released(**pool_spec: object) -> World:
    """A VM whose Machine is gone (scale-down finished): its Agent, unbound by CAPI,
    still carries everything preparation set, the pool's selector labels included."""
    agent = agent_obj("a1", bios_uuid=uuid(1), labels=PREPARED, approved=True)
    agent["metadata"]["resourceVersion"] = "7"
    return World(**pool_spec).add(
        vsphere_agent_obj(
            "am-1", bios_uuid=uuid(1), phase="Released", reason="MachineDeleting",
            agent_ref="a1", machine_ref="machine-1",
        ),
        agent,
    )  # fmt: skip


def left_behind(spec_hostname: str = "", role: str = "") -> dict[str, Any]:
    """The Agent of a VM made for `am-gone`, prepared before that AgentMachine went away."""
    labels = {**PREPARED, names.LABEL_AGENT_MACHINE: "am-gone"}
    return agent_obj(
        "a1",
        bios_uuid=uuid(1),
        labels=labels,
        approved=True,
        spec_hostname=spec_hostname,
        role=role,
    )


def bind(world: World, agent: str, agent_machine: str) -> None:
    """CAPI binds `agent` to `agent_machine` (which it then serves)."""
    obj = world.agents[agent]
    obj["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = agent_machine
    obj["spec"]["clusterDeploymentName"] = {"name": "demo", "namespace": "clusters-demo"}
    world.add(
        agent_machine_obj(agent_machine, waiting=False, ready=True, agent=agent),
        machine_obj(f"m-{agent_machine}", infra=agent_machine),
    )


def test_the_pool_labels_are_removed_on_the_version_seen_before_the_vm_is_deleted() -> None:
    world = released()
    first = world.plan()
    assert first.deletions == ()
    assert first.unlabels == (
        Unlabel("a1", "vm-am-1", "am-1", ("customer",), "7", "its Machine machine-1 was deleted"),
    )
    assert first.unlabels[0].patch == {
        "metadata": {"labels": {"customer": None}, "resourceVersion": "7"},
        "spec": {"approved": False},  # the vm controller's unapproval, folded in
    }
    (record,) = first.vms
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.MACHINE_DELETED)
    (action,) = [a for a in first.actions if a.name == "a1"]
    assert action.type is PlannedActionType.PATCH_AGENT
    assert "remove the pool's labels (customer)" in action.reason
    assert "before the VM is deleted" in action.reason

    world.apply(first)
    labels = world.agents["a1"]["metadata"]["labels"]
    assert "customer" not in labels  # only the selector labels go: the rest stays
    assert labels[names.LABEL_NODEPOOL] == "workers"
    assert labels[names.LABEL_AGENT_MACHINE] == "am-1"
    # the next plan (after a crash too: it reads only the cache) sees them gone: deletes
    second = world.plan()
    assert second.unlabels == ()
    assert [(d.vsphere_agent, d.agent) for d in second.deletions] == [("am-1", "a1")]
    assert second.patches == ()


def test_an_agent_bound_before_the_unlabelling_landed_keeps_its_vm() -> None:
    """CAPI's bind came first: the unlabelling (conditional on the version the plan saw)
    fails with a 409 and changes nothing; the next plan sees the Agent bound, so the VM
    is Bound, serves that AgentMachine and is neither unlabelled nor deleted."""
    world = released()
    assert world.plan().unlabels != ()
    bind(world, "a1", "am-9")  # the plan above is not applied: its precondition failed
    plan = world.plan()
    assert (plan.unlabels, plan.deletions, plan.deferrals) == ((), (), ())
    (record,) = plan.vms
    assert (record.phase, record.reason) == (VMPhase.BOUND, VMReason.AGENT_BOUND)
    assert record.machine == Ref("m-am-9", "uid-machine-m-am-9")
    assert plan.counts.bound_agents == 1


def test_an_agent_bound_after_the_unlabelling_keeps_its_vm_too() -> None:
    """Whatever binds it after the labels went (a writer without CAPI's optimistic
    lock), the plan that would delete sees it bound: the VM stays, as capacity."""
    world = released()
    world.apply(world.plan())
    bind(world, "a1", "am-9")
    plan = world.plan()
    assert (plan.unlabels, plan.deletions) == ((), ())
    assert plan.vms[0].phase is VMPhase.BOUND


def test_a_spare_past_its_grace_is_unlabelled_then_deleted() -> None:
    """A VM whose AgentMachine went away before binding (spare) keeps the pool's labels
    (and its old selection label: an unpinned AgentMachine could bind it) until its
    clean-up is due."""
    world = World().add(vsphere_agent_obj("am-gone", bios_uuid=uuid(1)), left_behind())
    world.apply(world.plan())  # spare: Released, status.handover
    world.now = NOW + HANDOVER_GRACE
    first = world.plan()
    assert [(u.vsphere_agent, u.labels) for u in first.unlabels] == [("am-gone", ("customer",))]
    assert first.deletions == ()
    world.apply(first)
    assert [d.vsphere_agent for d in world.plan().deletions] == ["am-gone"]


def test_an_unlabelled_spare_an_agent_machine_needs_is_handed_over_and_labelled_again() -> None:
    """The deletion is decided again by the next plan: an AgentMachine that waits by then
    gets the spare, and its Agent gets the pool's labels back (after the record)."""
    world = World().add(
        vsphere_agent_obj("am-gone", bios_uuid=uuid(1)),
        left_behind(spec_hostname="vm-am-gone", role="worker"),
    )
    world.apply(world.plan())
    world.now = NOW + HANDOVER_GRACE
    world.apply(world.plan())  # unlabelled
    world.add(agent_machine_obj("am-2"))
    plan = world.plan()
    assert plan.deletions == ()
    assert [(h.vsphere_agent, h.agent_machine) for h in plan.handovers] == [("am-gone", "am-2")]
    (patch,) = plan.patches
    assert patch.after_record == "am-gone"
    assert patch.patch["metadata"]["labels"] == {
        "customer": "acme",
        names.LABEL_AGENT_MACHINE: "am-2",
    }


def test_a_label_with_another_value_is_no_selector_label_and_stays() -> None:
    world = released()
    world.agents["a1"]["metadata"]["labels"]["customer"] = "other"
    plan = world.plan()
    assert plan.unlabels == ()
    assert [d.vsphere_agent for d in plan.deletions] == ["am-1"]


def test_a_warm_spares_agent_carries_no_pool_label_and_its_surplus_vm_goes_at_once() -> None:
    spare = vsphere_agent_obj(
        "workers-spare-0", bios_uuid=uuid(1), phase="Available", reason="AgentAvailable",
        agent_ref="a1", agent_machine="spare_0123456789abcdef",
        created_for=names.CreatedFor.SPARE.value,
    )  # fmt: skip
    world = World().add(
        spare,
        agent_obj("a1", bios_uuid=uuid(1), approved=True,
                  labels={names.LABEL_AGENT_MACHINE: "spare_0123456789abcdef"}),
    )  # fmt: skip
    plan = world.plan()
    assert plan.unlabels == ()
    assert [d.vsphere_agent for d in plan.deletions] == ["workers-spare-0"]


def test_nothing_is_unlabelled_while_clean_up_is_paused_or_retained() -> None:
    retained = released(cleanupPolicy="Retain").plan()
    assert (retained.unlabels, retained.deletions) == ((), ())
    world = released()
    world.competing = ["twin"]
    paused = world.plan()
    assert (paused.unlabels, paused.deletions) == ((), ())
    assert [d.vm for d in paused.deferrals] == ["vm-am-1"]


def test_a_bound_agent_is_never_unlabelled() -> None:
    world = released()
    world.agents["a1"]["spec"]["clusterDeploymentName"] = {
        "name": "demo",
        "namespace": "clusters-demo",
    }
    plan = world.plan()
    assert (plan.unlabels, plan.deletions) == ((), ())
