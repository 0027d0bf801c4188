"""A hand-over against the real control plane: a replaced AgentMachine's VM serves its successor.

The test plays CAPI (it deletes a booting AgentMachine and its Machine, creates the
replacement) and the `vm` controller and the Assisted Installer (it records the VM's
identity, registers its Agent); `scaleup` and `pool` run in-process
(`reconcilers_support`). The VsphereAgent keeps its name; `status.handover` records
the target before its label moves (the label patch is conditional on that version),
and the Agent follows; the replacement binds the VM made for its predecessor, and no
second VsphereAgent is ever created.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from tests.kube.pool_world import UUID, World
from tests.kube.reconcilers_support import (
    agent_inventory,
    agent_obj,
    machine_obj,
)

JsonObj = dict[str, Any]


@pytest.fixture
def world(pool_world: World) -> World:
    return pool_world


async def test_the_replacement_of_a_booting_agent_machine_gets_its_vm(world: World) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-old")
    await world.create(kinds.MACHINE, machine_obj(world.cpns, world.ns, "m-old", infra="am-old"))
    vm_name = await world.vm_recorded("am-old", bios_uuid=UUID)

    # CAPI remediates: the Machine goes (its AgentMachine after the drain), the
    # MachineSet creates the replacement
    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="m-old")
    await world.waiting_agent_machine("am-new")
    await world.create(kinds.MACHINE, machine_obj(world.cpns, world.ns, "m-new", infra="am-new"))

    async def handed_over() -> JsonObj | None:
        va = await world.get(kinds.VSPHERE_AGENT, "am-old")
        labels = (va or {}).get("metadata", {}).get("labels", {})
        return va if labels.get(names.LABEL_AGENT_MACHINE) == "am-new" else None

    va = await eventually(handed_over, what="am-old's VsphereAgent handed to am-new")
    am_new = await world.get(kinds.AGENT_MACHINE, "am-new")
    assert am_new is not None
    # The record is written before the label moves and may be cleared by the next pass
    # already (no Agent to relabel yet); while it is there, it names both ends.
    handover = (va.get("status") or {}).get("handover")
    if handover is not None:
        assert (handover["fromAgentMachine"], handover["toAgentMachine"]) == ("am-old", "am-new")
        assert handover["toAgentMachineUID"] == am_new["metadata"]["uid"]

    # the VM boots and registers; its Agent is prepared for am-new, and the record goes
    await world.create(kinds.AGENT, agent_obj(world.ns, "agent-1"))
    await world.patch(kinds.AGENT, "agent-1", {"status": agent_inventory(UUID)}, status=True)
    await world.phase_is("am-old", "Available", "AgentAvailable")

    async def prepared() -> JsonObj | None:
        agent = await world.get(kinds.AGENT, "agent-1")
        labels = (agent or {}).get("metadata", {}).get("labels", {})
        return agent if labels.get(names.LABEL_AGENT_MACHINE) == "am-new" else None

    agent = await eventually(prepared, what="the Agent labelled for am-new")
    assert agent["spec"]["hostname"] == vm_name

    async def record_cleared() -> bool:
        found = await world.get(kinds.VSPHERE_AGENT, "am-old")
        return found is not None and "handover" not in (found.get("status") or {})

    await eventually(record_cleared, what="the hand-over record cleared")
    await world.bind("agent-1", "am-new")
    vm = await world.phase_is("am-old", "Bound", "AgentBound")
    assert vm["machineRef"]["name"] == "m-new"
    assert [v["metadata"]["name"] for v in await world.vsphere_agents()] == ["am-old"]

    events = await world.kube.list(kinds.EVENT, namespace=world.cpns)
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events.items}
    assert ("am-new", "VsphereAgentHandedOver") in reasons
    assert ("am-new", "VsphereAgentCreated") not in reasons
