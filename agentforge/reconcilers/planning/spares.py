"""The VMs the assignment leaves over: why each is spare, and the warm spares to create.

A free VM no waiting AgentMachine takes is spare. One left by an AgentMachine is
Released with the reason its AgentMachine gave (`reason`: `MachineDeleting` while
that AgentMachine or its Machine is being deleted, `MachineDeleted` once it is gone,
`AgentMachineServed` when it is there and got another VM). Warm spares (`spec.spares`)
the pool lacks get names no VsphereAgent of the pool holds (`names`, the lowest
indices of `naming.spare_name`), so a plan made twice names the same ones.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Mapping, Sequence

from agentforge.api.vm import VMReason
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.planning.snapshot import (
    AgentMachineFacts,
    MachineFacts,
    VsphereAgentFacts,
)

__all__ = ["names", "reason"]


def names(*, pool: str, held: Container[str], count: int) -> tuple[str, ...]:
    """`count` names for new warm spares of `pool`, the lowest indices not `held`."""
    if count <= 0:
        return ()
    found: list[str] = []
    for index in itertools.count():
        name = naming.spare_name(pool=pool, index=index)
        if name not in held:
            found.append(name)
            if len(found) == count:
                return tuple(found)
    raise AssertionError("unreachable")  # pragma: no cover


def reason(
    va: VsphereAgentFacts,
    *,
    agent_machines: Sequence[AgentMachineFacts],
    machine_of_am: Mapping[str, MachineFacts],
) -> VMReason:
    """MachineDeleting while its AgentMachine or that one's Machine is being deleted,
    MachineDeleted once gone, AgentMachineServed when it is there and has another VM."""
    target = va.target or ""
    am = next((a for a in agent_machines if a.selection == target), None)
    name = am.name if am is not None else target
    machine = machine_of_am.get(name)
    if am is None:
        return VMReason.MACHINE_DELETING if machine is not None else VMReason.MACHINE_DELETED
    if am.deleting or (machine is not None and machine.deleting):
        return VMReason.MACHINE_DELETING
    return VMReason.AGENT_MACHINE_SERVED
