"""The fast paths of `matching` against the plain rules they implement (hypothesis).

`matching` sorts only tied Agents, builds the MAC/hostname/agentRef indexes only for
the VMs the BIOS UUID pass leaves over, orders VMs by two stable sorts and filters
eligible Agents in one inlined loop. Each must give exactly what the plain version
gives: four passes over all VMs with full indexes, one tuple-key sort, one test
per rule for each Agent.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from operator import attrgetter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentforge.api import names
from agentforge.api.meta import NamespacedName
from agentforge.reconcilers.planning import matching
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    Claim,
    Claims,
    VsphereAgentFacts,
    agent_facts,
    identifies,
    identity_conflicts,
    vsphere_agent_facts,
)
from tests.unit.reconcilers.planner_support import CPNS, agent_obj, mac, uuid, vsphere_agent_obj

identity = st.one_of(st.none(), st.integers(0, 4))
vm_names = st.one_of(st.none(), st.sampled_from(["vm-0", "vm-1", "vm-2"]))
hostnames = st.sampled_from(["", "vm-0", "vm-1", "vm-2", "vm-va-0", "vm-va-1"])


@st.composite
def vms(draw: st.DrawFn) -> list[VsphereAgentFacts]:
    found = []
    for index in range(draw(st.integers(0, 8))):
        n_uuid, n_mac = draw(identity), draw(identity)
        obj = vsphere_agent_obj(
            f"va-{index}",
            vm_name=draw(vm_names),
            bios_uuid=uuid(n_uuid) if n_uuid is not None else None,
            mac_address=mac(n_mac) if n_mac is not None else None,
            agent_ref=draw(st.sampled_from([None, "a-0", "a-1", "a-2", "a-3"])),
            phase="Available",
        )
        found.append(vsphere_agent_facts(obj))
    return draw(st.permutations(found))


@st.composite
def agents(draw: st.DrawFn) -> list[AgentFacts]:
    found = []
    for index in range(draw(st.integers(0, 8))):
        n_uuid = draw(identity)
        macs = draw(st.lists(st.integers(0, 4), max_size=2))
        obj = agent_obj(
            f"a-{index}",
            bios_uuid=uuid(n_uuid) if n_uuid is not None else None,
            macs=[mac(n) for n in macs],
            hostname=draw(hostnames),
            deleting=draw(st.booleans()),
            cluster=draw(st.sampled_from([None, None, "demo", "other-cluster"])),
            cluster_namespace=draw(st.sampled_from([CPNS, CPNS, "other-ns", None])),
            labels=draw(
                st.sampled_from(
                    [{}, {names.LABEL_NODEPOOL: "workers"}, {names.LABEL_NODEPOOL: "other"}]
                )
            ),
        )
        found.append(agent_facts(obj))
    return draw(st.permutations(found))


def plain_match(
    vms: list[VsphereAgentFacts], agents: list[AgentFacts]
) -> dict[str, tuple[str, str]]:
    """The matching rules as four plain passes over all VMs with full indexes."""
    ordered_agents = sorted(agents, key=attrgetter("deleting", "name"))
    ordered_vms = sorted(vms, key=attrgetter("vm_name", "name"))
    by_uuid: dict[str, list[AgentFacts]] = defaultdict(list)
    by_mac: dict[str, list[AgentFacts]] = defaultdict(list)
    by_hostname: dict[str, list[AgentFacts]] = defaultdict(list)
    by_name: dict[str, AgentFacts] = {}
    for agent in ordered_agents:
        by_name[agent.name] = agent
        if agent.bios_uuid:
            by_uuid[agent.bios_uuid].append(agent)
        for one in agent.macs:
            by_mac[one].append(agent)
        if agent.hostname:
            by_hostname[agent.hostname].append(agent)
    found: dict[str, tuple[str, str]] = {}
    taken: set[str] = set()

    def first_free(candidates: Any) -> AgentFacts | None:
        return next((a for a in candidates if a.name not in taken), None)

    def take(vm: VsphereAgentFacts, agent: AgentFacts | None, rule: str) -> None:
        if agent is not None:
            found[vm.name] = (agent.name, rule)
            taken.add(agent.name)

    for vm in ordered_vms:
        if vm.bios_uuid:
            take(vm, first_free(by_uuid.get(vm.bios_uuid, ())), "BIOSUUID")
    for vm in ordered_vms:
        if vm.mac and vm.name not in found:
            same = [
                a
                for a in by_mac.get(vm.mac, ())
                if identifies(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)
            ]
            take(vm, first_free(same), "MAC")
    named = Counter(vm.vm_name for vm in ordered_vms)
    for vm in ordered_vms:
        if vm.name not in found and vm.vm_name in by_hostname and named[vm.vm_name] == 1:
            same = [
                a
                for a in by_hostname[vm.vm_name]
                if not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)
            ]
            take(vm, first_free(same), "Hostname")
    for vm in ordered_vms:
        if vm.agent_ref and vm.name not in found:
            previous = by_name.get(vm.agent_ref)
            if (
                previous is not None
                and previous.name not in taken
                and not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=previous)
            ):
                take(vm, previous, "AgentRef")
    return found


PATHS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PATHS
@given(vms(), agents())
def test_match_gives_what_the_plain_four_passes_give(
    vms: list[VsphereAgentFacts], agents: list[AgentFacts]
) -> None:
    found = matching.match(vms, agents)
    assert {vm: (m.agent.name, m.rule.value) for vm, m in found.items()} == plain_match(vms, agents)


@PATHS
@given(vms())
def test_vm_order_is_the_order_of_the_name_pair(vms: list[VsphereAgentFacts]) -> None:
    assert matching.in_vm_order(vms) == sorted(vms, key=attrgetter("vm_name", "name"))
    assert matching.in_vm_order(vms) == sorted(vms, key=lambda v: (v.vm_name, v.name))


@PATHS
@given(agents(), st.booleans(), st.integers(0, 4), st.sampled_from([None, "a-0", "a-1"]))
def test_eligible_keeps_exactly_the_agents_of_this_cluster_pool_and_unclaimed(
    agents: list[AgentFacts], claimed: bool, n_uuid: int, agent_ref: str | None
) -> None:
    claims = Claims.of(
        [Claim("other", "x", "vm-1", uuid(n_uuid), None, agent_ref)] if claimed else []
    )
    hosted_cluster = NamespacedName(CPNS, "demo")

    def excluded(agent: AgentFacts) -> bool:
        return (
            agent.cluster_deployment not in (None, hosted_cluster)
            or agent.labels.get(names.LABEL_NODEPOOL) not in (None, "", "workers")
            or claims.claimant(agent) is not None
        )

    assert matching.eligible(
        agents, hosted_cluster=hosted_cluster, discriminator="workers", claims=claims
    ) == [a for a in agents if not excluded(a)]
