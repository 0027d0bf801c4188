"""AgentMachine demand and capacity counts (docs/design/0002, "Demand counts").

The counts are the pool's report to its users (status fields, capacity metrics, the
CapacitySatisfied condition, the DemandDeficit action). Which VM serves which
AgentMachine, and which AgentMachine gets a new VM, is `assignment`'s. Counting is
one pass over the pool's AgentMachines and Machines.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentforge.reconcilers.planning.snapshot import AgentMachineFacts, MachineFacts


@dataclass(frozen=True, slots=True)
class Demand:
    agent_machines: int
    """Non-deleting AgentMachines of the pool."""
    unready: int
    """... whose Ready condition is not True."""
    without_agent: int
    """... unready and without an assigned Agent."""
    waiting: int
    """... Ready=False with reason NoSuitableAgents."""
    desired_replicas: int
    """Non-deleting Machines of the pool."""


def demand(
    *, agent_machines: Sequence[AgentMachineFacts], machines: Sequence[MachineFacts]
) -> Demand:
    total = unready = without_agent = waiting = 0
    for am in agent_machines:
        if am.deleting:
            continue
        total += 1
        if not am.ready:
            unready += 1
            if not am.has_agent:
                without_agent += 1
        if am.waiting:
            waiting += 1
    return Demand(
        agent_machines=total,
        unready=unready,
        without_agent=without_agent,
        waiting=waiting,
        desired_replicas=sum(1 for m in machines if not m.deleting),
    )


@dataclass(frozen=True, slots=True)
class Counts:
    """Everything the pool reports as a number (status fields and capacity metrics)."""

    desired_replicas: int = 0
    agent_machines: int = 0
    waiting_agent_machines: int = 0
    unready_agent_machines: int = 0
    agent_machines_without_agent: int = 0
    matching_agents: int = 0
    bound_agents: int = 0
    available_agents: int = 0
    pending_owned_vms: int = 0
    """Owned VMs still to be bound: Provisioning or Available, and those being created."""
    demand_deficit: int = 0
    """AgentMachines without an Agent that no pending VM will serve."""
    creating: int = 0
    """VsphereAgents the plan creates (counted in `pending_owned_vms`, so the pool's
    status reads the same in the pass that sees them exist)."""

    @property
    def observed_pending(self) -> int:
        """Pending VMs that exist: what the metrics export (a creation that keeps failing
        leaves the `demand_deficit` metric above zero, so the alert fires)."""
        return self.pending_owned_vms - self.creating

    @property
    def observed_deficit(self) -> int:
        return max(0, self.agent_machines_without_agent - self.observed_pending)


def counts(
    *, demand: Demand, bound: int, available: int, pending: int, creating: int = 0
) -> Counts:
    return Counts(
        desired_replicas=demand.desired_replicas,
        agent_machines=demand.agent_machines,
        waiting_agent_machines=demand.waiting,
        unready_agent_machines=demand.unready,
        agent_machines_without_agent=demand.without_agent,
        matching_agents=bound + available,
        bound_agents=bound,
        available_agents=available,
        pending_owned_vms=pending + creating,
        demand_deficit=max(0, demand.without_agent - pending - creating),
        creating=creating,
    )
