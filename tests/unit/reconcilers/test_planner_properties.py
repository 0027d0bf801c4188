"""Properties of the planner over random worlds (hypothesis)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentforge.api import names
from agentforge.api.meta import NamespacedName
from agentforge.api.vm import VMPhase
from agentforge.reconcilers.planning.phases import Ref
from agentforge.reconcilers.planning.snapshot import Claim, agent_facts
from tests.unit.reconcilers.planner_support import (
    CPNS,
    World,
    agent_machine_obj,
    agent_obj,
    ago,
    mac,
    machine_obj,
    uuid,
    vsphere_agent_obj,
)

PHASES = [None, "Provisioning", "Available", "Bound", "Released", "Orphaned"]
REASONS = [None, "AgentMissing", "DiscoveryTimeout", "MachineDeleting", "MachineDeleted"]
identity = st.one_of(st.none(), st.integers(0, 5))


@st.composite
def vsphere_agents(draw: st.DrawFn, index: int) -> dict[str, Any]:
    n_uuid, n_mac = draw(identity), draw(identity)
    return vsphere_agent_obj(
        f"am-{index}",
        vm_name=f"vm-{draw(st.integers(0, 6))}" if draw(st.booleans()) else None,
        bios_uuid=uuid(n_uuid) if n_uuid is not None else None,
        mac_address=mac(n_mac) if n_mac is not None else None,
        phase=draw(st.sampled_from(PHASES)),
        reason=draw(st.sampled_from(REASONS)),
        agent_ref=draw(st.sampled_from([None, "a-0", "a-1", "a-2"])),
        machine_ref=draw(st.sampled_from([None, "m-0", "m-1"])),
        transition=ago(minutes=draw(st.integers(0, 120))),
        created=ago(minutes=draw(st.integers(0, 120))),
        ready_since=ago(minutes=draw(st.integers(0, 120))) if draw(st.booleans()) else None,
        deleting=draw(st.booleans()) and draw(st.booleans()),
        created_for=draw(st.sampled_from(["agent-machine", "agent-machine", "adopted"])),
    )


@st.composite
def agents(draw: st.DrawFn, index: int) -> dict[str, Any]:
    n_uuid, n_mac = draw(identity), draw(identity)
    labels = draw(
        st.sampled_from(
            [
                {},
                {"customer": "acme"},
                {names.LABEL_NODEPOOL: "other"},
                {names.LABEL_NODEPOOL: "workers"},
            ]
        )
    )
    return agent_obj(
        f"a-{index}",
        bios_uuid=uuid(n_uuid) if n_uuid is not None else None,
        macs=[mac(n_mac)] if n_mac is not None else [],
        hostname=draw(st.sampled_from(["", "vm-0", "vm-1", "vm-am-0", "vm-am-1"])),
        bound_to=draw(st.sampled_from([None, None, "am-0", "am-1"])),
        cluster=draw(st.sampled_from([None, None, "other-cluster", "demo"])),
        cluster_namespace=draw(st.sampled_from([CPNS, "other-ns", None])),
        labels=labels,
        approved=draw(st.booleans()),
        role=draw(st.sampled_from(["", "worker"])),
        deleting=draw(st.booleans()) and draw(st.booleans()),
    )


@st.composite
def worlds(draw: st.DrawFn) -> World:
    world = World(cleanupPolicy=draw(st.sampled_from(["Delete", "Retain"])))
    for i in range(draw(st.integers(0, 6))):
        world.add(draw(vsphere_agents(i)))
    for i in range(draw(st.integers(0, 6))):
        world.add(draw(agents(i)))
    for i in range(draw(st.integers(0, 3))):
        state = draw(st.sampled_from(["waiting", "ready", "unready"]))
        world.add(
            agent_machine_obj(
                f"am-{i}",
                waiting=state == "waiting",
                ready=state == "ready",
                agent="a-0" if state == "ready" else None,
                deleting=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    for i in range(draw(st.integers(0, 2))):
        world.add(machine_obj(f"m-{i}", infra=f"am-{i}", deleting=draw(st.booleans())))
    if draw(st.booleans()):
        world.claims = [Claim("other", "x", "vm-1", uuid(draw(st.integers(0, 5))), None, "a-2")]
    if draw(st.booleans()) and draw(st.booleans()):
        world.competing = ["twin"]
    world.now = world.now + timedelta(minutes=draw(st.integers(0, 60)))
    return world


FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(worlds())
def test_a_vm_whose_agent_is_bound_is_never_deleted(world: World) -> None:
    plan = world.plan()
    records = {r.vsphere_agent: r for r in plan.vms}
    for deletion in plan.deletions:
        record = records[deletion.vsphere_agent]
        if record.agent is not None:
            assert not agent_facts(world.agents[record.agent.name]).bound
    for unlabel in plan.unlabels:  # nor is a bound Agent unlabelled
        assert not agent_facts(world.agents[unlabel.agent]).bound


@FAST
@given(worlds())
def test_retain_and_ambiguous_pools_never_delete(world: World) -> None:
    plan = world.plan()
    if world.pool["spec"].get("cleanupPolicy") == "Retain" or world.competing:
        assert plan.deletions == ()


@FAST
@given(worlds())
def test_each_agent_backs_at_most_one_vm_and_excluded_agents_none(world: World) -> None:
    snapshot = world.snapshot()
    plan = world.plan()
    used = [r.agent.name for r in plan.vms if r.agent is not None]
    assert len(used) == len(set(used))
    for name in used + [p.agent for p in plan.patches]:
        facts = agent_facts(world.agents[name])
        shared = {va.vm_name for va in snapshot.vsphere_agents}
        assert snapshot.claims.claimant(facts, shared_names=shared) is None
        assert facts.cluster_deployment in (None, NamespacedName(CPNS, "demo"))
        assert facts.labels.get(names.LABEL_NODEPOOL) in (None, "workers")


@FAST
@given(worlds())
def test_applying_a_plan_yields_an_empty_plan(world: World) -> None:
    """... but for the clean-ups the plan started by unlabelling an Agent: the next plan,
    which sees the labels gone, deletes exactly those VMs (and nothing is left after)."""
    first = world.plan()
    world.apply(first)
    second = world.plan()
    assert (second.patches, second.unlabels) == ((), ())
    assert {d.vsphere_agent for d in second.deletions} == {u.vsphere_agent for u in first.unlabels}
    assert [r for r in second.vms if r.changed] == []
    world.apply(second)
    third = world.plan()
    assert (third.patches, third.unlabels, third.deletions, third.changed_vms) == ((), (), (), ())


@FAST
@given(worlds())
def test_a_hand_over_is_done_by_the_next_plan(world: World) -> None:
    """With the hand-overs' label moves applied too, the next plan only clears the
    hand-over records (their checkpoint is cleared once the labels name the target,
    which a plan cannot both write and see), and the one after that plans nothing."""
    first = world.plan()
    world.apply(first, handovers=True)
    second = world.plan()
    assert (second.patches, second.unlabels, second.handovers) == ((), (), ())
    assert {d.vsphere_agent for d in second.deletions} == {
        u.vsphere_agent for u in first.unlabels
    }  # clean-ups the first plan started by unlabelling the Agent
    before = {r.vsphere_agent: r for r in first.vms}
    for record in second.changed_vms:
        assert record.handover is None
        assert record._replace(handover=None, changed=True) == before[
            record.vsphere_agent
        ]._replace(handover=None, changed=True)
    world.apply(second, handovers=True)
    third = world.plan()
    assert (third.patches, third.deletions, third.handovers, third.changed_vms) == ((), (), (), ())
    assert third.unlabels == ()


@FAST
@given(worlds())
def test_the_plan_does_not_depend_on_input_order(world: World) -> None:
    forward = world.plan()
    for bucket in (world.agents, world.vsphere_agents, world.agent_machines):
        items = list(bucket.items())
        bucket.clear()
        bucket.update(reversed(items))
    assert world.plan() == forward


# --- counterexamples the idempotence property found, kept as explicit cases -----------


def test_a_vm_name_another_pool_claims_does_not_take_the_agent_the_plan_prepared() -> None:
    """Our VM `vm-1` keeps its Agent by agentRef; preparation sets `spec.hostname` to
    `vm-1`, which another pool's VM is named too. That name identifies neither VM, so
    it is no claim: the next plan keeps the match (it once turned Orphaned)."""
    world = World().add(
        vsphere_agent_obj(
            "am-3", vm_name="vm-1", agent_ref="a-0", created_for="adopted", phase="Available",
            reason="AgentAvailable",
        ),
        agent_obj("a-0"),  # no BIOS UUID, no MAC: only the agentRef says which VM
    )  # fmt: skip
    world.claims = [Claim("other", "x", "vm-1", uuid(0), None, "a-2")]
    first = world.plan()
    assert [(r.vsphere_agent, r.agent) for r in first.vms] == [
        ("am-3", Ref("a-0", "uid-agent-a-0"))
    ]
    assert first.patches[0].patch["spec"]["hostname"] == "vm-1"
    world.apply(first)
    second = world.plan()
    assert (second.changed_vms, second.patches) == ((), ())
    assert second.vms[0].phase is VMPhase.AVAILABLE


def test_a_shared_vm_name_is_no_hostname_match_either() -> None:
    """An Agent whose hostname is a VM name of ours and of another pool's VM is
    neither pool's by hostname (nor claimed by the other): nothing matches it."""
    world = World().add(
        vsphere_agent_obj("am-0", vm_name="vm-1"), agent_obj("a-0", hostname="vm-1")
    )
    world.claims = [Claim("other", "x", "vm-1", uuid(0), None, None)]
    plan = world.plan()
    assert plan.vms[0].agent is None
    world.claims = []
    assert world.plan().vms[0].agent == Ref("a-0", "uid-agent-a-0")  # unambiguous: matched


def test_the_agent_of_a_vm_handed_over_gets_the_new_selection_in_the_same_plan() -> None:
    """`am-1` (its AgentMachine gone) is handed to the waiting `am-0`: the Agent's
    selection label names `am-0` at once (it was once patched to `am-1` first, then
    to `am-0` by the next plan), held back until the record is stored (`after_record`)."""
    world = World().add(
        vsphere_agent_obj("am-0", created_for="adopted"),
        vsphere_agent_obj("am-1"),
        agent_obj("a-3", hostname="vm-am-1"),
        agent_machine_obj("am-0"),
    )
    first = world.plan()
    assert [(h.vsphere_agent, h.agent_machine) for h in first.handovers] == [("am-1", "am-0")]
    (patch,) = first.patches
    assert patch.patch["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-0"
    assert patch.after_record == "am-1"
    world.apply(first)
    second = world.plan()
    assert (second.patches, second.changed_vms) == ((), ())
