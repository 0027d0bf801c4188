"""Which Agent is which VM: the matching rules of DOMAIN.md section 3, in linear time.

An Agent matches a VM by BIOS UUID (from the Agent's SMBIOS serial), else by MAC
when no BIOS UUID says otherwise, else by hostname equal to the VM name when no
identity conflicts, else by the VM's previous agentRef when no identity conflicts
(`snapshot.identity_conflicts`: a differing known BIOS UUID always outranks an equal
MAC, since MACs repeat across VMs); a VM name two VMs carry is no hostname match for
either. Each rule runs as one pass over all VMs, strongest first, so a strong match
always wins over a weak one no matter the order of objects, and each Agent matches
at most one VM. Lookups are dicts; the only super-linear step is one sort that makes
ties deterministic.

Which Agents may match at all is decided first (`eligible`): never one claimed by
another pool's VsphereAgent, bound to another hosted cluster, or carrying another
pool's discriminator label.

Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from operator import attrgetter
from typing import NamedTuple

from agentforge.api import names
from agentforge.reconcilers.snapshot import (
    AgentFacts,
    Claims,
    VsphereAgentFacts,
    identifies,
    identity_conflicts,
)


class MatchRule(StrEnum):
    """How a VM found its Agent, strongest first."""

    BIOS_UUID = "BIOSUUID"
    MAC = "MAC"
    HOSTNAME = "Hostname"
    AGENT_REF = "AgentRef"


class Exclusion(StrEnum):
    """Why an Agent of the InfraEnv is not this pool's to match."""

    CLAIMED = "ClaimedByOtherPool"
    OTHER_CLUSTER = "BoundToOtherCluster"
    OTHER_POOL_LABEL = "OtherPoolLabel"


class Match(NamedTuple):
    agent: AgentFacts
    rule: MatchRule


def exclusion(
    agent: AgentFacts, *, hosted_cluster: str, discriminator: str, claims: Claims
) -> Exclusion | None:
    """Why `agent` may not match this pool's VMs, or None when it may."""
    if agent.cluster_deployment and agent.cluster_deployment != hosted_cluster:
        return Exclusion.OTHER_CLUSTER
    label = agent.labels.get(names.LABEL_NODEPOOL)
    if label and label != discriminator:
        return Exclusion.OTHER_POOL_LABEL
    if claims and claims.claimant(agent) is not None:
        return Exclusion.CLAIMED
    return None


def _bucket(
    agents: Sequence[AgentFacts],
) -> tuple[
    dict[str, list[AgentFacts]],
    dict[str, list[AgentFacts]],
    dict[str, list[AgentFacts]],
    dict[str, AgentFacts],
]:
    by_uuid: dict[str, list[AgentFacts]] = defaultdict(list)
    by_mac: dict[str, list[AgentFacts]] = defaultdict(list)
    by_hostname: dict[str, list[AgentFacts]] = defaultdict(list)
    by_name: dict[str, AgentFacts] = {}
    for agent in agents:
        by_name[agent.name] = agent
        if agent.bios_uuid:
            by_uuid[agent.bios_uuid].append(agent)
        for mac in agent.macs:
            by_mac[mac].append(agent)
        if agent.hostname:
            by_hostname[agent.hostname].append(agent)
    return by_uuid, by_mac, by_hostname, by_name


def _first_free(candidates: Iterable[AgentFacts] | None, taken: set[str]) -> AgentFacts | None:
    if candidates:
        for agent in candidates:
            if agent.name not in taken:
                return agent
    return None


def match(vms: Sequence[VsphereAgentFacts], agents: Sequence[AgentFacts]) -> Mapping[str, Match]:
    """VsphereAgent name -> its Agent and the rule that matched it.

    `vms` and `agents` must already be eligible. Among several Agents with the same
    identity (a host re-registered before the old Agent was removed), one that is
    not being deleted wins, then the lowest name.
    """
    ordered_agents = sorted(agents, key=attrgetter("deleting", "name"))
    ordered_vms = sorted(vms, key=attrgetter("vm_name", "name"))
    by_uuid, by_mac, by_hostname, by_name = _bucket(ordered_agents)
    matches: dict[str, Match] = {}
    taken: set[str] = set()
    for vm in ordered_vms:
        if vm.bios_uuid:
            agent = _first_free(by_uuid.get(vm.bios_uuid), taken)
            if agent is not None:
                matches[vm.name] = Match(agent, MatchRule.BIOS_UUID)
                taken.add(agent.name)
    for vm in ordered_vms:
        if vm.mac and vm.name not in matches:
            same_mac = by_mac.get(vm.mac, ())
            agent = _first_free(
                (a for a in same_mac if identifies(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)),
                taken,
            )
            if agent is not None:
                matches[vm.name] = Match(agent, MatchRule.MAC)
                taken.add(agent.name)
    named = Counter(vm.vm_name for vm in ordered_vms)
    for vm in ordered_vms:
        # a name two VMs carry identifies neither (the agentRef pass may still keep one)
        if vm.name not in matches and vm.vm_name in by_hostname and named[vm.vm_name] == 1:
            candidates = [
                a
                for a in by_hostname[vm.vm_name]
                if not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)
            ]
            agent = _first_free(candidates, taken)
            if agent is not None:
                matches[vm.name] = Match(agent, MatchRule.HOSTNAME)
                taken.add(agent.name)
    for vm in ordered_vms:
        if vm.agent_ref and vm.name not in matches:
            agent = by_name.get(vm.agent_ref)
            if (
                agent is not None
                and agent.name not in taken
                and not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=agent)
            ):
                matches[vm.name] = Match(agent, MatchRule.AGENT_REF)
                taken.add(agent.name)
    return matches
