"""Which bound Agent is a VM, whatever matched or was recorded (pure).

The clean-up guard ("never the VM of a bound Agent") and the assignment ("a VM whose
Agent is bound elsewhere serves none of our AgentMachines") ask the same question of
the snapshot's Agents: is any bound Agent this VM, by BIOS UUID, or by MAC when no
BIOS UUID says otherwise (`snapshot.identifies`)? Excluded and claimed Agents count
too: binding anywhere is a fact about the VM.

The index is built on first use: a pool in steady state (every VM matched, nothing
to clean up) never pays for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from agentforge.reconcilers.planning.snapshot import AgentFacts, VsphereAgentFacts, identifies


def blocker(agent: AgentFacts) -> str:
    """What holds `agent`, in words."""
    if agent.agent_machine_ref:
        where = f"{agent.agent_machine_namespace}/" if agent.agent_machine_namespace else ""
        return f"Agent {agent.name} is still bound to AgentMachine {where}{agent.agent_machine_ref}"
    return f"Agent {agent.name} is still assigned to ClusterDeployment {agent.cluster_deployment}"


class BoundAgents:
    """The snapshot's bound Agents by BIOS UUID and MAC."""

    def __init__(self, agents: Sequence[AgentFacts]) -> None:
        self._agents = agents
        self._by_uuid: dict[str, list[AgentFacts]] | None = None
        self._by_mac: dict[str, list[AgentFacts]] = {}

    def _build(self) -> dict[str, list[AgentFacts]]:
        by_uuid: dict[str, list[AgentFacts]] = {}
        for agent in sorted((a for a in self._agents if a.bound), key=attrgetter("name")):
            if agent.bios_uuid:
                by_uuid.setdefault(agent.bios_uuid, []).append(agent)
            for mac in agent.macs:
                self._by_mac.setdefault(mac, []).append(agent)
        return by_uuid

    def identifying(self, va: VsphereAgentFacts) -> AgentFacts | None:
        """A bound Agent that is this VM by identity (the lowest name), or None."""
        if not (va.bios_uuid or va.mac):
            return None
        if self._by_uuid is None:
            self._by_uuid = self._build()
        if va.bios_uuid and va.bios_uuid in self._by_uuid:
            return self._by_uuid[va.bios_uuid][0]
        for agent in self._by_mac.get(va.mac or "", ()):
            if identifies(bios_uuid=va.bios_uuid, mac=va.mac, agent=agent):
                return agent
        return None
