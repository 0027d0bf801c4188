"""Every reference is compared by namespace and name (docs/design/0002, "References").

Objects of one name live in many namespaces: a hosted cluster `demo` in `clusters-a`
and one in `clusters-b`, an AgentMachine `workers-x` in each control plane namespace,
an InfraEnv `demo` per tenant. Each test puts a namesake in another namespace next to
the pool's own object and checks the pool takes only its own.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from agentforge.api import kinds, names, views
from agentforge.api.meta import NamespacedName
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.common import indexes
from agentforge.reconcilers.planning import matching
from agentforge.reconcilers.planning.snapshot import Claims, agent_facts, vsphere_agent_facts
from agentforge.reconcilers.pool import observed as pool_snapshot
from tests.unit.reconcilers.controller_support import harness
from tests.unit.reconcilers.planner_support import (
    CLUSTER,
    CPNS,
    NS,
    World,
    agent_machine_obj,
    agent_obj,
    by_vm,
    infra_env_obj,
    machine_obj,
    pool,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

NOW = datetime(2026, 3, 1, tzinfo=UTC)
ELSEWHERE = "clusters-elsewhere"
"""The control plane namespace of another hosted cluster that is also called `demo`."""
OURS = NamespacedName(CPNS, CLUSTER)


def namesake_agent(name: str, **fields: object) -> dict[str, object]:
    """An Agent bound by the look-alike cluster's provider: its AgentMachine has our
    AgentMachine's name, its ClusterDeployment our cluster's name, both in ELSEWHERE."""
    return agent_obj(
        name,
        bound_to="am-1",
        bound_in=ELSEWHERE,
        cluster=CLUSTER,
        cluster_namespace=ELSEWHERE,
        **fields,  # type: ignore[arg-type]
    )


# --- the hosted cluster: spec.clusterDeploymentName -------------------------------------


def test_an_agent_of_a_same_named_cluster_in_another_namespace_is_not_the_pools() -> None:
    facts = agent_facts(namesake_agent("a"))
    assert facts.cluster_deployment == NamespacedName(ELSEWHERE, CLUSTER)
    kwargs = {"hosted_cluster": OURS, "discriminator": "workers", "claims": Claims()}
    assert matching.eligible([facts], **kwargs) == []  # type: ignore[arg-type]
    ours = agent_facts(agent_obj("b", bound_to="am-1"))
    assert matching.eligible([ours], **kwargs) == [ours]  # type: ignore[arg-type]


def test_a_vm_matched_by_a_look_alike_agent_is_not_bound_and_its_own_agent_is_prepared() -> None:
    """The issue's case: the look-alike Agent (same BIOS UUID, a name that sorts first)
    was taken as the VM's bound Agent, so the real one was never prepared and the
    AgentMachine waited for ever."""
    world = World().add(
        agent_machine_obj("am-1"),
        machine_obj("m-1", infra="am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Provisioning"),
        namesake_agent("a-look-alike", bios_uuid=uuid(1)),
        agent_obj("agent-1", bios_uuid=uuid(1)),
    )
    plan = world.plan()
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.reason) == (VMPhase.AVAILABLE, VMReason.AGENT_AVAILABLE)
    assert record.agent is not None
    assert record.agent.name == "agent-1"
    (patch,) = plan.patches
    assert patch.agent == "agent-1"
    assert patch.patch["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-1"
    assert (plan.counts.bound_agents, plan.counts.available_agents) == (0, 1)


def test_a_cluster_reference_without_namespace_names_one_in_the_agents_namespace() -> None:
    legacy = agent_obj("a", cluster=CLUSTER, cluster_namespace=None)
    view = views.Agent.model_validate(legacy)
    assert view.cluster_deployment == NamespacedName(NS, CLUSTER)
    assert view.is_bound
    kwargs = {"hosted_cluster": OURS, "discriminator": "workers", "claims": Claims()}
    assert matching.eligible([agent_facts(legacy)], **kwargs) == []  # type: ignore[arg-type]
    same_namespace = NamespacedName(NS, CLUSTER)
    assert matching.eligible(  # a pool whose control plane namespace is its own namespace
        [agent_facts(legacy)],
        hosted_cluster=same_namespace,
        discriminator="workers",
        claims=Claims(),
    ) == [agent_facts(legacy)]


# --- the AgentMachine an Agent is bound to: label agentMachineRef ------------------------


def test_the_agent_machine_namespace_comes_from_the_annotation_then_the_cluster() -> None:
    annotated = views.Agent.model_validate(agent_obj("a", bound_to="am-1", bound_in=ELSEWHERE))
    assert annotated.agent_machine_namespace == ELSEWHERE
    by_cluster = views.Agent.model_validate(agent_obj("a", bound_to="am-1"))
    assert by_cluster.agent_machine_namespace == CPNS
    label_only = agent_obj("a", bound_to="am-1")
    del label_only["spec"]["clusterDeploymentName"]
    assert views.Agent.model_validate(label_only).agent_machine_namespace is None
    assert views.Agent.model_validate(agent_obj("a")).agent_machine_namespace is None


def test_a_bound_agent_of_a_namesake_agent_machine_does_not_take_our_machine() -> None:
    """Our cluster's Agent, but bound (says the provider's annotation) to an AgentMachine
    of the same name in another namespace: the VM is Bound, not to our Machine."""
    world = World().add(
        agent_machine_obj("am-1"),
        machine_obj("m-1", infra="am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Available", agent_ref="a"),
        agent_obj("a", bios_uuid=uuid(1), bound_to="am-1", bound_in=ELSEWHERE),
    )
    record = by_vm(world.plan())["am-1"]
    assert record.phase is VMPhase.BOUND
    assert record.machine is None
    home = World().add(
        agent_machine_obj("am-1"),
        machine_obj("m-1", infra="am-1"),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), phase="Available", agent_ref="a"),
        agent_obj("a", bios_uuid=uuid(1), bound_to="am-1", bound_in=CPNS),
    )
    bound = by_vm(home.plan())["am-1"]
    assert bound.machine is not None
    assert bound.machine.name == "m-1"


# --- what a VsphereAgent recorded: status.vm.agentRef and machineRef -----------------------


def test_a_recorded_agent_ref_of_another_namespace_is_no_match() -> None:
    va = vsphere_agent_obj("am-1", phase="Available", agent_ref="a")
    va["status"]["vm"]["agentRef"]["namespace"] = "another-tenant"
    assert vsphere_agent_facts(va).agent_ref is None
    world = World().add(agent_machine_obj("am-1"), va, agent_obj("a"))  # no identity at all
    record = by_vm(world.plan())["am-1"]
    assert record.agent is None


def test_a_recorded_machine_ref_of_another_namespace_is_not_our_deleted_machine() -> None:
    """A Released VM whose record names a Machine elsewhere: that is no Machine of the
    pool, so its absence here proves no deletion and nothing is cleaned up."""
    va = vsphere_agent_obj(
        "am-1", phase="Released", reason="AgentUnbound", agent_ref="a", machine_ref="m-1"
    )
    va["status"]["vm"]["machineRef"]["namespace"] = ELSEWHERE
    facts = vsphere_agent_facts(va)
    assert (facts.machine_ref, facts.machine_ref_namespace) == ("m-1", ELSEWHERE)
    world = World().add(va, agent_obj("a"))
    plan = world.plan()
    record = by_vm(plan)["am-1"]
    assert (record.phase, record.reason) == (VMPhase.RELEASED, VMReason.AGENT_UNBOUND)
    assert plan.deletions == ()
    va["status"]["vm"]["machineRef"]["namespace"] = CPNS  # ours, and gone: deleted
    assert [d.vsphere_agent for d in World().add(va, agent_obj("a")).plan().deletions] == ["am-1"]


def test_a_machine_whose_infrastructure_is_not_an_agent_machine_is_not_its_machine() -> None:
    machine = machine_obj("m-1", infra="am-1")
    machine["spec"]["infrastructureRef"]["kind"] = "Metal3Machine"
    assert views.Machine.model_validate(machine).infrastructure_name is None
    assert views.Machine.model_validate(machine_obj("m-1", infra="am-1")).infrastructure_name == (
        "am-1"
    )


# --- InfraEnvs, pools and Secrets in the cache ---------------------------------------------


def test_an_infra_env_is_owned_by_kind_and_group_and_looked_up_in_its_namespace() -> None:
    owned = agent_obj("a")
    del owned["metadata"]["labels"][names.LABEL_INFRAENV]
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "example.com/v1", "kind": "InfraEnv", "name": "impostor", "uid": "1"},
        {"apiVersion": kinds.INFRA_ENV.api_version, "kind": "InfraEnv", "name": "demo", "uid": "2"},
    ]
    assert indexes.infra_env_of_agent(owned) == "demo"
    owned["metadata"]["ownerReferences"] = owned["metadata"]["ownerReferences"][:1]
    assert indexes.infra_env_of_agent(owned) is None
    assert views.Agent.model_validate(owned).infra_env_name is None


def _elsewhere(obj: dict[str, object], namespace: str = "another-tenant") -> dict[str, object]:
    copied = copy.deepcopy(obj)
    meta: dict[str, object] = copied["metadata"]  # type: ignore[assignment]
    meta["namespace"] = namespace
    meta["uid"] = f"{meta.get('uid', 'uid')}-elsewhere"
    return copied


def test_namesakes_in_another_namespace_are_not_in_the_pools_snapshot() -> None:
    """An InfraEnv, its Agents, a pool and its VsphereAgents, all named like ours, in
    another tenant's namespace: none of them is the pool's, and the namesake pool does
    not compete for our AgentMachines."""
    h = harness(
        pool_obj(),
        infra_env_obj(),
        agent_machine_obj("am-1"),
        agent_obj("a1"),
        vsphere_agent_obj("am-1"),
        _elsewhere(pool_obj()),
        _elsewhere(infra_env_obj()),
        _elsewhere(agent_obj("a2")),
        _elsewhere(vsphere_agent_obj("am-2", bios_uuid=uuid(2), agent_ref="a1")),
    )
    snapshot = pool_snapshot.SnapshotSource(h.deps).snapshot(pool(), now=NOW)
    assert [a.name for a in snapshot.agents] == ["a1"]
    assert [va.name for va in snapshot.vsphere_agents] == ["am-1"]
    assert snapshot.competing_pools == []
    assert not snapshot.claims  # another namespace's VsphereAgents claim nothing here


def test_vsphere_agents_of_an_earlier_pool_of_the_same_name_are_held_not_planned() -> None:
    """The pool was deleted and created again with the same name: the old VsphereAgents
    (their ownerReference holds the old UID) are not the new pool's to plan; their VMs'
    Agents are held like another pool's until the garbage collector removes them."""
    owned = vsphere_agent_obj("am-1")
    stale = vsphere_agent_obj("am-0", bios_uuid=uuid(7), agent_ref="a0")
    for va, uid in ((owned, "pool-uid"), (stale, "uid-of-the-deleted-pool")):
        va["metadata"]["ownerReferences"] = [
            {"apiVersion": kinds.VSPHERE_AGENT_POOL.api_version, "kind": "VsphereAgentPool",
             "name": "workers", "uid": uid, "controller": True}
        ]  # fmt: skip
    h = harness(pool_obj(), infra_env_obj(), owned, stale)
    snapshot = pool_snapshot.SnapshotSource(h.deps).snapshot(pool(), now=NOW)
    assert [va.name for va in snapshot.vsphere_agents] == ["am-1"]
    assert [c.vsphere_agent for c in snapshot.claims.by_uuid[uuid(7)]] == ["am-0"]


def test_a_pool_of_the_same_name_and_node_pool_in_another_namespace_does_not_compete() -> None:
    ours, theirs = pool_obj(), _elsewhere(pool_obj())
    assert indexes.pool_node_pool_key(ours) != indexes.pool_node_pool_key(theirs)


def test_a_credentials_secret_is_keyed_by_namespace_and_name() -> None:
    h = harness(pool_obj(), _elsewhere(pool_obj(), "tenant-b"))
    indexes.install(h.informers)
    pools = h.informers[kinds.VSPHERE_AGENT_POOL]
    for namespace in (NS, "tenant-b"):
        found = pools.by_index(indexes.POOLS_BY_SECRET, f"{namespace}/vsphere")
        assert [p["metadata"]["namespace"] for p in found] == [namespace]
