"""Agent <-> VM matching: each rule, its conflicts, and claims across pools."""

from __future__ import annotations

from typing import Any

from agentforge.api import names
from agentforge.reconcilers.planning import matching
from agentforge.reconcilers.planning.snapshot import (
    Claim,
    Claims,
    agent_facts,
    claim_of,
    vsphere_agent_facts,
)
from tests.unit.reconcilers.planner_support import (
    NS,
    POOL,
    World,
    agent_machine_obj,
    agent_obj,
    ago,
    by_vm,
    mac,
    uuid,
    vsphere_agent_obj,
)


def matched(world: World) -> dict[str, str | None]:
    return {
        name: record.agent.name if record.agent else None
        for name, record in by_vm(world.plan()).items()
    }


def rules(vas: list[dict[str, Any]], agents: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    found = matching.match([vsphere_agent_facts(v) for v in vas], [agent_facts(a) for a in agents])
    return {vm: (m.agent.name, m.rule.value) for vm, m in found.items()}


def test_bios_uuid_from_the_agent_serial_matches() -> None:
    found = rules([vsphere_agent_obj("va", bios_uuid=uuid(1))], [agent_obj("a", bios_uuid=uuid(1))])
    assert found == {"va": ("a", "BIOSUUID")}


def test_mac_matches_when_no_bios_uuid_is_known() -> None:
    found = rules(
        [vsphere_agent_obj("va", mac_address=mac(7))],
        [agent_obj("a", macs=["00:11:22:33:44:55", mac(7).upper()])],
    )
    assert found == {"va": ("a", "MAC")}


def test_hostname_equal_to_the_vm_name_matches_without_identities() -> None:
    found = rules([vsphere_agent_obj("va", vm_name="vm-x")], [agent_obj("a", hostname="vm-x")])
    assert found == {"va": ("a", "Hostname")}


def test_hostname_never_matches_when_identities_conflict() -> None:
    found = rules(
        [vsphere_agent_obj("va", vm_name="vm-x", bios_uuid=uuid(1))],
        [agent_obj("a", hostname="vm-x", bios_uuid=uuid(2))],
    )
    assert found == {}


def test_the_previous_agent_ref_matches_when_nothing_else_does() -> None:
    found = rules(
        [vsphere_agent_obj("va", agent_ref="a", phase="Available")], [agent_obj("a", hostname="h")]
    )
    assert found == {"va": ("a", "AgentRef")}


def test_the_previous_agent_ref_is_dropped_when_identities_conflict() -> None:
    found = rules(
        [vsphere_agent_obj("va", agent_ref="a", mac_address=mac(1), phase="Available")],
        [agent_obj("a", macs=[mac(2)])],
    )
    assert found == {}


def test_a_stronger_rule_wins_over_a_weaker_one_regardless_of_order() -> None:
    # Agent "a" carries the hostname of VM "va-1" but the BIOS UUID of VM "va-2".
    found = rules(
        [
            vsphere_agent_obj("va-1", vm_name="vm-1"),
            vsphere_agent_obj("va-2", vm_name="vm-2", bios_uuid=uuid(2)),
        ],
        [agent_obj("a", hostname="vm-1", bios_uuid=uuid(2))],
    )
    assert found == {"va-2": ("a", "BIOSUUID")}


def test_each_agent_matches_at_most_one_vm() -> None:
    found = rules(
        [
            vsphere_agent_obj("va-1", mac_address=mac(1)),
            vsphere_agent_obj("va-2", mac_address=mac(1)),
        ],
        [agent_obj("a", macs=[mac(1)])],
    )
    assert list(found.values()) == [("a", "MAC")]


def test_of_two_agents_with_one_identity_the_live_one_wins() -> None:
    found = rules(
        [vsphere_agent_obj("va", bios_uuid=uuid(1))],
        [
            agent_obj("a-old", bios_uuid=uuid(1), deleting=True),
            agent_obj("b-new", bios_uuid=uuid(1)),
        ],
    )
    assert found == {"va": ("b-new", "BIOSUUID")}


def test_an_agent_claimed_by_another_pools_vsphere_agent_is_never_matched() -> None:
    world = World().add(
        vsphere_agent_obj("va", bios_uuid=uuid(1)), agent_obj("a", bios_uuid=uuid(1))
    )
    world.claims = [Claim("other", "their-va", "their-vm", None, None, "a")]
    assert matched(world) == {"va": None}


def test_claims_by_identity_and_by_hostname_exclude_the_agent_too() -> None:
    for claim in (
        Claim("other", "x", "vm-x", uuid(1), None, None),
        Claim("other", "x", "vm-x", None, mac(1), None),
        Claim("other", "x", "host-a", None, None, None),
    ):
        world = World().add(
            vsphere_agent_obj("va", bios_uuid=uuid(1)),
            agent_obj("a", bios_uuid=uuid(1), macs=[mac(1)], hostname="host-a"),
        )
        world.claims = [claim]
        assert matched(world) == {"va": None}, claim


def test_a_hostname_claim_with_a_conflicting_identity_does_not_exclude() -> None:
    world = World().add(
        vsphere_agent_obj("va", bios_uuid=uuid(1)),
        agent_obj("a", bios_uuid=uuid(1), hostname="host-a"),
    )
    world.claims = [Claim("other", "x", "host-a", uuid(9), None, None)]
    assert matched(world) == {"va": "a"}


def test_an_agent_bound_to_another_hosted_cluster_is_never_matched() -> None:
    world = World().add(
        vsphere_agent_obj("va", bios_uuid=uuid(1)),
        agent_obj("a", bios_uuid=uuid(1), cluster="another-cluster"),
    )
    assert matched(world) == {"va": None}


def test_an_agent_prepared_by_another_pool_is_never_matched() -> None:
    world = World().add(
        vsphere_agent_obj("va", bios_uuid=uuid(1)),
        agent_obj("a", bios_uuid=uuid(1), labels={names.LABEL_NODEPOOL: "other-nodepool"}),
    )
    assert matched(world) == {"va": None}


def test_agents_of_deleting_vsphere_agents_stay_reserved() -> None:
    world = World().add(
        vsphere_agent_obj("va-old", bios_uuid=uuid(1), deleting=True),
        vsphere_agent_obj("va-new", vm_name="host-a"),
        agent_obj("a", bios_uuid=uuid(1), hostname="host-a"),
    )
    assert matched(world) == {"va-new": None}
    assert world.plan().counts.matching_agents == 0


def test_claims_index_prefers_a_stable_claimant() -> None:
    a = Claim("p-b", "x", "vm", uuid(1), None, "agent")
    b = Claim("p-a", "y", "vm", uuid(1), None, "agent")
    world = World()
    world.claims = [a, b]
    claimant = world.snapshot().claims.claimant(agent_facts(agent_obj("agent")))
    assert claimant == b
    assert POOL not in (a.pool, b.pool)


# --- identity precedence: a shared MAC never outranks a differing BIOS UUID ----------------


def test_a_mac_match_never_overrides_a_differing_known_bios_uuid() -> None:
    # Two VMs sharing a MAC (vcsim derives MACs from 3 hex digits of the UUID): the
    # Agent of the other VM must not be taken by MAC, whatever the order of arrival.
    found = rules(
        [vsphere_agent_obj("va", bios_uuid=uuid(1), mac_address=mac(7))],
        [agent_obj("theirs", bios_uuid=uuid(2), macs=[mac(7)])],
    )
    assert found == {}


def test_a_mac_match_counts_when_either_side_lacks_a_bios_uuid() -> None:
    found = rules(
        [vsphere_agent_obj("va", bios_uuid=uuid(1), mac_address=mac(7))],
        [agent_obj("a", macs=[mac(7)])],  # a non-VMware serial: no BIOS UUID
    )
    assert found == {"va": ("a", "MAC")}


def test_a_previous_agent_ref_with_a_differing_bios_uuid_is_dropped_despite_an_equal_mac() -> None:
    found = rules(
        [vsphere_agent_obj("va", bios_uuid=uuid(1), mac_address=mac(7), agent_ref="theirs",
                           phase="Available")],
        [agent_obj("theirs", bios_uuid=uuid(2), macs=[mac(7)])],
    )  # fmt: skip
    assert found == {}


def test_a_mac_claim_counts_only_when_identities_do_not_conflict() -> None:
    ours = agent_facts(agent_obj("ours", bios_uuid=uuid(1), macs=[mac(7)]))
    differing = Claims.of([Claim("other", "x", "vm-x", uuid(2), mac(7), None)])
    assert differing.claimant(ours) is None
    unknown_uuid = Claims.of([Claim("other", "x", "vm-x", None, mac(7), None)])
    assert unknown_uuid.claimant(ours) is not None
    # several claims on one MAC: the one that agrees wins, in a stable order
    both = Claims.of(
        [Claim("a-pool", "x", "vm-x", uuid(2), mac(7), None),
         Claim("b-pool", "y", "vm-y", uuid(1), mac(7), None)]
    )  # fmt: skip
    claimant = both.claimant(ours)
    assert claimant is not None
    assert claimant.vsphere_agent == "y"


def test_an_agent_ref_claim_with_a_conflicting_identity_does_not_exclude() -> None:
    ours = agent_facts(agent_obj("ours", bios_uuid=uuid(1), macs=[mac(7)]))
    stale = Claims.of([Claim("other", "x", "vm-x", uuid(2), mac(7), "ours")])
    assert stale.claimant(ours) is None
    unrecorded = Claims.of([Claim("other", "x", "vm-x", None, None, "ours")])
    assert unrecorded.claimant(ours) is not None


def _pool_world(pool: str, n: int, *, shared_mac: str) -> World:
    world = World(name=pool, node_pool=pool)
    world.add(
        agent_machine_obj(f"va-{pool}", node_pool=f"{NS}/{pool}"),
        vsphere_agent_obj(f"va-{pool}", pool_name=pool, vm_name=f"vm-{pool}", bios_uuid=uuid(n),
                          mac_address=shared_mac, created=ago(minutes=5)),
    )  # fmt: skip
    return world


def _claims_of(world: World) -> list[Claim]:
    found = (claim_of(vsphere_agent_facts(va)) for va in world.vsphere_agents.values())
    return [c for c in found if c is not None]


def test_two_pools_whose_vms_share_a_mac_each_prepare_their_own_agent() -> None:
    """The benchmark's failure: each pool saw its own Agent claimed by the other pool,
    so one VM went Orphaned/AgentMissing while its Agent was prepared and bound, and
    the other never got its Agent prepared."""
    shared = mac(7)
    blue, green = (
        _pool_world("blue", 1, shared_mac=shared),
        _pool_world("green", 2, shared_mac=shared),
    )
    agents = [
        agent_obj("agent-blue", bios_uuid=uuid(1), macs=[shared]),
        agent_obj("agent-green", bios_uuid=uuid(2), macs=[shared]),
    ]
    for world in (blue, green):
        world.add(*agents)  # one InfraEnv: the same Agent objects in both worlds
    for _ in range(3):  # a few rounds of both controllers, each seeing the other's status
        for world, other in ((blue, green), (green, blue)):
            world.claims = _claims_of(other)
            world.apply(world.plan())
    for world, pool in ((blue, "blue"), (green, "green")):
        record = by_vm(world.plan())[f"va-{pool}"]
        assert (record.phase.value, record.agent and record.agent.name) == (
            "Available",
            f"agent-{pool}",
        )
        labels = world.agents[f"agent-{pool}"]["metadata"]["labels"]
        assert labels[names.LABEL_AGENT_MACHINE] == f"va-{pool}"
        assert labels[names.LABEL_NODEPOOL] == pool
    # CAPI binds both: each pool counts exactly its own bound Agent
    for pool in ("blue", "green"):
        blue.agents[f"agent-{pool}"]["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = pool
    for world, other in ((blue, green), (green, blue)):
        world.claims = _claims_of(other)
        plan = world.plan()
        assert plan.counts.bound_agents == 1
        assert [r.phase.value for r in plan.vms] == ["Bound"]


def test_a_vm_name_two_vms_carry_is_no_hostname_match_for_either() -> None:
    # e.g. two adopted VMs of one name in different folders: the name tells nothing,
    # and a plan applied must not move the Agent to the other VM on the next pass
    found = rules(
        [
            vsphere_agent_obj("va-1", vm_name="vm-x"),
            vsphere_agent_obj("va-2", vm_name="vm-x", agent_ref="a", phase="Available"),
        ],
        [agent_obj("a", hostname="vm-x")],
    )
    assert found == {"va-2": ("a", "AgentRef")}
