"""Demand counts, planned actions and the pool conditions the planner decides."""

from __future__ import annotations

from agentforge.api.conditions import Condition, ConditionStatus, PoolConditionType, PoolReason
from agentforge.api.pool import PlannedActionType
from agentforge.reconcilers.planning import planner
from agentforge.reconcilers.planning.demand import Counts
from tests.unit.reconcilers.planner_support import (
    NOW,
    World,
    agent_machine_obj,
    agent_obj,
    machine_obj,
    uuid,
    vsphere_agent_obj,
)


def conditions(plan: planner.Plan) -> dict[str, tuple[str, str]]:
    return {c.type.value: (c.status.value, c.reason) for c in plan.conditions}


def test_agent_machine_demand_is_counted_from_non_deleting_agent_machines() -> None:
    world = World().add(
        agent_machine_obj("waiting-1"),
        agent_machine_obj("waiting-2"),
        agent_machine_obj("unready-with-agent", waiting=False, agent="a9"),
        agent_machine_obj("ready", waiting=False, ready=True, agent="a8"),
        agent_machine_obj("deleting", deleting=True),
        agent_machine_obj("ready-2", waiting=False, ready=True),
        machine_obj("m1"),
        machine_obj("m2", deleting=True),
    )
    counts = world.plan().counts
    assert (
        counts.agent_machines,
        counts.waiting_agent_machines,
        counts.unready_agent_machines,
        counts.agent_machines_without_agent,
        counts.desired_replicas,
    ) == (5, 2, 3, 2, 1)


def test_matching_agents_are_matched_ones_plus_those_carrying_the_pool_labels() -> None:
    world = World().add(
        vsphere_agent_obj("am-1", bios_uuid=uuid(1)),
        agent_obj("matched", bios_uuid=uuid(1)),
        agent_obj("labelled-bound", labels={"customer": "acme"}, bound_to="am-7"),
        agent_obj("unlabelled"),
        agent_obj("labelled-elsewhere", labels={"customer": "acme"}, cluster="other"),
    )
    counts = world.plan().counts
    assert (counts.matching_agents, counts.bound_agents, counts.available_agents) == (2, 1, 1)


def test_the_deficit_is_agent_machines_without_agent_minus_pending_vms() -> None:
    world = World().add(
        agent_machine_obj("am-1"),
        agent_machine_obj("am-2"),
        agent_machine_obj("am-3"),
        vsphere_agent_obj("am-1"),  # Provisioning
        vsphere_agent_obj("am-2", bios_uuid=uuid(2)),
        agent_obj("a2", bios_uuid=uuid(2)),  # Available
    )
    world.competing = ["twin"]  # nothing is created: the deficit stays
    plan = world.plan()
    assert (plan.counts.pending_owned_vms, plan.counts.demand_deficit) == (2, 1)
    assert plan.actions[0].type is PlannedActionType.DEMAND_DEFICIT
    assert conditions(plan)["CapacitySatisfied"] == ("False", PoolReason.DEMAND_DEFICIT)


def test_a_vm_the_plan_creates_is_pending_in_status_but_not_in_the_metrics() -> None:
    """The status reads as the plan leaves the pool (no flip in the pass that sees the
    new VsphereAgent); the metrics as the cluster is, so a creation that keeps failing
    keeps `demand_deficit` above zero and its alert fires."""
    world = World().add(
        agent_machine_obj("am-1"), agent_machine_obj("am-2"), vsphere_agent_obj("am-1")
    )
    counts = world.plan().counts
    assert (counts.pending_owned_vms, counts.demand_deficit, counts.creating) == (2, 0, 1)
    assert (counts.observed_pending, counts.observed_deficit) == (1, 1)


def test_capacity_is_provisioning_while_pending_vms_cover_the_waiting_ones() -> None:
    world = World().add(agent_machine_obj("am-1"), vsphere_agent_obj("am-1"))
    assert conditions(world.plan())["CapacitySatisfied"] == ("False", PoolReason.PROVISIONING)


def test_capacity_is_satisfied_when_nothing_waits_and_the_plan_is_a_noop() -> None:
    world = World().add(agent_machine_obj("am-1", waiting=False, ready=True, agent="a"))
    plan = world.plan()
    assert conditions(plan)["CapacitySatisfied"] == ("True", PoolReason.CAPACITY_SATISFIED)
    assert [(a.type, a.name) for a in plan.actions] == [(PlannedActionType.NOOP, None)]


def test_no_agent_machines_is_reported_but_does_not_make_the_pool_unready() -> None:
    plan = World().plan()
    assert conditions(plan)["AgentMachineDemandFound"] == ("False", PoolReason.NO_AGENT_MACHINES)
    assert conditions(plan)["Ready"][0] != "False"


def test_two_pools_for_one_nodepool_make_the_pool_unready() -> None:
    world = World().add(agent_machine_obj("am-1"))
    world.competing = ["twin"]
    found = conditions(world.plan())
    assert found["AgentMachineDemandFound"] == ("False", PoolReason.AMBIGUOUS_POOL_MATCH)
    assert found["Ready"] == ("False", PoolReason.AMBIGUOUS_POOL_MATCH)


def test_a_missing_infra_env_or_iso_url_makes_the_pool_unready() -> None:
    world = World()
    world.infra_env = None
    assert conditions(world.plan())["InfraEnvAvailable"] == (
        "False",
        PoolReason.INFRA_ENV_NOT_FOUND,
    )
    world.infra_env = {"metadata": {"name": "demo"}, "status": {}}
    found = conditions(world.plan())
    assert found["InfraEnvAvailable"] == ("False", PoolReason.INFRA_ENV_IMAGE_NOT_CREATED)
    assert found["Ready"] == ("False", PoolReason.INFRA_ENV_IMAGE_NOT_CREATED)


def _with_infra_conditions(world: World, vsphere: str, iso: str) -> None:
    world.pool["status"] = {
        "conditions": [
            Condition(
                type=t, status=ConditionStatus(s), reason="R", message="m", last_transition_time=NOW
            ).model_dump(mode="json", by_alias=True)
            for t, s in (
                (PoolConditionType.VSPHERE_READY, vsphere),
                (PoolConditionType.ISO_READY, iso),
            )
        ]
    }


def test_ready_combines_infra_env_with_vsphere_ready_and_iso_ready() -> None:
    world = World()
    assert conditions(world.plan())["Ready"] == ("Unknown", PoolReason.AWAITING_CHECKS)
    _with_infra_conditions(world, "True", "True")
    assert conditions(world.plan())["Ready"] == ("True", PoolReason.RECONCILED)
    _with_infra_conditions(world, "True", "False")
    assert conditions(world.plan())["Ready"] == ("False", "R")


def test_planned_actions_are_capped() -> None:
    world = World()
    for n in range(planner.MAX_PLANNED_ACTIONS + 20):
        world.add(
            agent_machine_obj(f"am-{n}"),
            vsphere_agent_obj(f"am-{n}", bios_uuid=uuid(n)),
            agent_obj(f"a{n}", bios_uuid=uuid(n)),
        )
    plan = world.plan()
    assert len(plan.patches) == planner.MAX_PLANNED_ACTIONS + 20
    assert len(plan.actions) == planner.MAX_PLANNED_ACTIONS


def test_iso_ejection_reasons_are_counted() -> None:
    world = World().add(
        vsphere_agent_obj("a", iso_ejected="Ejected"),
        vsphere_agent_obj("b", iso_ejected="Ejected"),
        vsphere_agent_obj("c", iso_ejected="Disabled"),
        vsphere_agent_obj("d"),
    )
    assert {k.value: v for k, v in world.plan().iso_ejections.items()} == {
        "Ejected": 2,
        "Disabled": 1,
    }


def test_counts_default_to_zero() -> None:
    assert World().plan().counts == Counts()
