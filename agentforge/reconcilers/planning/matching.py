"""Which Agent is which VM: the matching rules of DOMAIN.md section 3, in O(n log n).

An Agent matches a VM by BIOS UUID (from the Agent's SMBIOS serial), else by MAC
when no BIOS UUID says otherwise, else by hostname equal to the VM name when no
identity conflicts, else by the VM's previous agentRef when no identity conflicts
(`snapshot.identity_conflicts`: a differing known BIOS UUID always outranks an equal
MAC, since MACs repeat across VMs); a VM name two VMs carry (of this pool, or one
of ours and one another pool claims) is no hostname match for either, and such a
name makes no hostname claim either (`Claims.claimant`). Each rule runs as one pass
over the VMs still unmatched, strongest first, so a strong match always wins over a
weak one no matter the order of objects, and each Agent matches at most one VM.

Lookups are dicts; sorting, which makes ties deterministic, is the only super-linear
step. The VMs are sorted once (`in_vm_order`, an order the planner shares), the
Agents only where several report one BIOS UUID, and all of them only when some VM
is left for the weaker rules, which then index just the MACs, VM names and agentRefs
those VMs look for. A pool whose VMs all match by BIOS UUID (the usual case) builds
one dict of its Agents.

Which Agents may match at all is decided first (`eligible`): never one claimed by
another pool's VsphereAgent, assigned to another hosted cluster, or carrying another
pool's discriminator label. A cluster is its ClusterDeployment's namespace and name
(`<controlPlaneNamespace>/<hostedClusterRef.name>` for this pool): a cluster of the
same name in another namespace is another cluster.

Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Final, NamedTuple

from agentforge.api import names
from agentforge.api.meta import NamespacedName
from agentforge.reconcilers.planning.snapshot import (
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


class Match(NamedTuple):
    agent: AgentFacts
    rule: MatchRule


_BY_NAME: Final = attrgetter("name")
_BY_VM_NAME: Final = attrgetter("vm_name")
_BY_DELETING: Final = attrgetter("deleting")
_AGENT_ORDER: Final = attrgetter("deleting", "name")
"""Among Agents with one identity, one not being deleted wins, then the lowest name."""


def in_vm_order(vms: Iterable[VsphereAgentFacts]) -> list[VsphereAgentFacts]:
    """`vms` in the order they are matched (and the planner lists them): by VM name,
    then VsphereAgent name.

    Two stable sorts on one attribute each: the same order as one sort on the
    (VM name, name) pair, in half the time (no key tuple per VM, cheaper comparisons).
    """
    return sorted(sorted(vms, key=_BY_NAME), key=_BY_VM_NAME)


def _in_agent_order(agents: Iterable[AgentFacts]) -> list[AgentFacts]:
    """`agents` in `_AGENT_ORDER`, by two stable sorts as in `in_vm_order`."""
    return sorted(sorted(agents, key=_BY_NAME), key=_BY_DELETING)


def eligible(
    agents: Iterable[AgentFacts],
    *,
    hosted_cluster: NamespacedName,
    discriminator: str,
    claims: Claims,
    shared_names: Container[str] = frozenset(),
) -> list[AgentFacts]:
    """The `agents` this pool may match, in their order: not bound to another hosted
    cluster (`hosted_cluster`: the pool's ClusterDeployment, namespace and name), not
    labelled for another pool (`discriminator`), not claimed by another pool (`claims`;
    `shared_names`: the names of this pool's VMs, `Claims.claimant`).
    """
    claimant = claims.claimant if claims else None
    label_key = names.LABEL_NODEPOOL
    found: list[AgentFacts] = []
    for agent in agents:
        deployment = agent.cluster_deployment
        if deployment is not None and deployment != hosted_cluster:
            continue
        label = agent.labels.get(label_key)
        if label and label != discriminator:
            continue
        if claimant is not None and claimant(agent, shared_names=shared_names) is not None:
            continue
        found.append(agent)
    return found


def _by_uuid(
    agents: Iterable[AgentFacts],
) -> tuple[dict[str, AgentFacts], dict[str, list[AgentFacts]]]:
    """Each BIOS UUID's preferred Agent (`_AGENT_ORDER`) and, for a UUID several Agents
    report, all of them in that order: only these few groups need sorting."""
    first: dict[str, AgentFacts] = {}
    shared: dict[str, list[AgentFacts]] = {}
    for agent in agents:
        uuid = agent.bios_uuid
        if uuid:
            seen = first.setdefault(uuid, agent)
            if seen is not agent:
                shared.setdefault(uuid, [seen]).append(agent)
    for uuid, group in shared.items():
        group.sort(key=_AGENT_ORDER)
        first[uuid] = group[0]
    return first, shared


def _bucket(
    agents: Sequence[AgentFacts], vms: Sequence[VsphereAgentFacts]
) -> tuple[dict[str, list[AgentFacts]], dict[str, list[AgentFacts]], dict[str, AgentFacts]]:
    """`agents` (in their order) by MAC, hostname and name, as far as `vms` look them up."""
    macs = {vm.mac for vm in vms if vm.mac}
    hostnames = {vm.vm_name for vm in vms if vm.vm_name}
    refs = {vm.agent_ref for vm in vms if vm.agent_ref}
    by_mac: dict[str, list[AgentFacts]] = defaultdict(list)
    by_hostname: dict[str, list[AgentFacts]] = defaultdict(list)
    by_name: dict[str, AgentFacts] = {}
    for agent in agents:
        if agent.name in refs:
            by_name[agent.name] = agent
        if not macs.isdisjoint(agent.macs):
            for mac in macs.intersection(agent.macs):
                by_mac[mac].append(agent)
        if agent.hostname in hostnames:
            by_hostname[agent.hostname].append(agent)
    return by_mac, by_hostname, by_name


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
    found, rules = assign(in_vm_order(vms), agents)
    return {name: Match(agent, rules[name]) for name, agent in found.items()}


@dataclass(slots=True)
class _Assignment:
    found: dict[str, AgentFacts] = field(default_factory=dict)
    """VsphereAgent name -> its Agent."""
    rules: dict[str, MatchRule] = field(default_factory=dict)
    """VsphereAgent name -> the rule that matched it."""
    taken: set[str] = field(default_factory=set)
    """Names of the Agents matched so far."""

    def take(self, vm: VsphereAgentFacts, agent: AgentFacts, rule: MatchRule) -> None:
        self.found[vm.name] = agent
        self.rules[vm.name] = rule
        self.taken.add(agent.name)


def assign(
    vms: Sequence[VsphereAgentFacts],
    agents: Sequence[AgentFacts],
    *,
    claimed_names: Container[str] = frozenset(),
) -> tuple[dict[str, AgentFacts], dict[str, MatchRule]]:
    """`match` for `vms` already `in_vm_order`, as two dicts by VsphereAgent name: the
    Agent and the rule (no `Match` per VM: the planner only needs the Agents).
    `claimed_names` are the VM names other pools' VMs carry: no hostname match for
    ours of those names (the name identifies neither VM)."""
    first, shared = _by_uuid(agents)
    done = _Assignment()
    found, rules, taken = done.found, done.rules, done.taken  # the hot loop: no `take()`
    rest: list[VsphereAgentFacts] = []
    by_uuid = MatchRule.BIOS_UUID
    for vm in vms:
        uuid = vm.bios_uuid or ""
        agent = first.get(uuid)
        if agent is not None and agent.name in taken:
            agent = _first_free(shared.get(uuid), taken)
        if agent is None:
            rest.append(vm)
        else:
            found[vm.name] = agent
            rules[vm.name] = by_uuid
            taken.add(agent.name)
    if rest:
        _assign_weaker(vms, rest, _in_agent_order(agents), done, claimed_names)
    return found, rules


def _assign_weaker(
    vms: Sequence[VsphereAgentFacts],
    rest: Sequence[VsphereAgentFacts],
    agents: Sequence[AgentFacts],
    done: _Assignment,
    claimed_names: Container[str],
) -> None:
    """The MAC, hostname and agentRef passes over `rest`, the VMs (in order) the BIOS
    UUID pass left unmatched; `agents` are in `_AGENT_ORDER`."""
    found, taken = done.found, done.taken
    by_mac, by_hostname, by_name = _bucket(agents, rest)
    for vm in rest:
        if vm.mac and vm.name not in found:
            same_mac = by_mac.get(vm.mac, ())
            agent = _first_free(
                (a for a in same_mac if identifies(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)),
                taken,
            )
            if agent is not None:
                done.take(vm, agent, MatchRule.MAC)
    named: Counter[str] | None = None
    for vm in rest:
        if vm.name not in found and vm.vm_name in by_hostname:
            if named is None:
                named = Counter(v.vm_name for v in vms)
            # a name two VMs carry identifies neither, also when another pool's VM is
            # the second one (the agentRef pass may still keep one)
            if named[vm.vm_name] != 1 or vm.vm_name in claimed_names:
                continue
            candidates = [
                a
                for a in by_hostname[vm.vm_name]
                if not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=a)
            ]
            agent = _first_free(candidates, taken)
            if agent is not None:
                done.take(vm, agent, MatchRule.HOSTNAME)
    for vm in rest:
        if vm.agent_ref and vm.name not in found:
            agent = by_name.get(vm.agent_ref)
            if (
                agent is not None
                and agent.name not in taken
                and not identity_conflicts(bios_uuid=vm.bios_uuid, mac=vm.mac, agent=agent)
            ):
                done.take(vm, agent, MatchRule.AGENT_REF)
