"""Deleting a VsphereAgent: only owned VMs go, never a bound Agent, Retain keeps everything."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.actors.waiting import eventually
from sim.vcsim.control import VcsimControl
from tests.kube.reconcilers_support import serial
from tests.kube.reconcilers_world import World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

VA = kinds.VSPHERE_AGENT
POOL = kinds.VSPHERE_AGENT_POOL
AGENT = kinds.AGENT


async def vm_with_agent(world: World, *, bound: bool = False, **pool_spec: Any) -> None:
    """A pool, a VsphereAgent `va1` whose VM runs, and its recorded Agent `agent-1`."""
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(**pool_spec)
    await world.condition(POOL, "pool", "ISOReady", status="True")
    await world.create_vsphere_agent("va1")
    await world.condition(VA, "va1", "Ready", status="True", reason="VMReady")
    await world.create_agent("agent-1", bound=bound)
    await world.set_agent_ref("va1", "agent-1")
    await eventually(lambda: _cached_ref(world), what="the agentRef in the cache")
    await eventually(
        lambda: _true(world.informers[AGENT].get(namespace=world.namespace, name="agent-1")),
        what="the Agent in the cache",
    )


async def _cached_ref(world: World) -> bool:
    cached = world.informers[VA].get(namespace=world.namespace, name="va1") or {}
    return bool(((cached.get("status") or {}).get("vm") or {}).get("agentRef"))


async def _true(value: Any) -> bool:
    return bool(value)


async def gone(world: World, kind: kinds.Kind, name: str) -> None:
    async def check() -> bool:
        return await world.get(kind, name) is None

    await eventually(check, what=f"{kind.kind} {name} to be gone")


async def delete_va(world: World) -> None:
    await world.kube.delete(VA, namespace=world.namespace, name="va1")


async def test_the_owned_vm_goes_then_its_unbound_agent_then_the_finalizer(
    world: World,
) -> None:
    async with world.run():
        await vm_with_agent(world)
        assert [v.name for v in await world.vms()] == [world.vm_name("va1")]
        await delete_va(world)
        await gone(world, VA, "va1")
    assert await world.vms() == []
    assert await world.get(AGENT, "agent-1") is None
    assert await world.events("VMDeleted")
    assert await world.events("AgentDeleted")


async def test_a_bound_agent_holds_the_vm_until_capi_releases_it(
    world: World, vcsim_control: VcsimControl
) -> None:
    async with world.run():
        await vm_with_agent(world, bound=True)
        await vcsim_control.reset_counters()
        await delete_va(world)
        va = await world.condition(VA, "va1", "Ready", status="False", reason="VMDeleting")
        message = {c["type"]: c for c in va["status"]["conditions"]}["Ready"]["message"]
        assert "Agent agent-1 is bound" in message
        assert [v.name for v in await world.vms()] == [world.vm_name("va1")]
        agent = await world.get(AGENT, "agent-1")
        assert agent is not None
        assert agent["spec"]["approved"] is True  # not touched while bound
        assert (await vcsim_control.counters()).get("methods", {}).get("Destroy_Task", 0) == 0
        # CAPI unbinds (scale-down finished): now the VM and the Agent go.
        await world.kube.patch_merge(
            AGENT,
            namespace=world.namespace,
            name="agent-1",
            patch={"metadata": {"labels": {names.LABEL_AGENT_MACHINE_REF: None}}},
        )
        await gone(world, VA, "va1")
    assert await world.vms() == []
    assert await world.get(AGENT, "agent-1") is None


async def test_a_vm_that_is_not_provably_ours_is_left_alone_and_named_in_an_event(
    world: World, vcsim_control: VcsimControl
) -> None:
    squatter = await world.unmarked_vm(world.vm_name("va1"))
    async with world.run():
        await world.create_secret()
        await world.create_infra_env()
        await world.create_pool()
        await world.create_vsphere_agent("va1")
        await world.condition(VA, "va1", "Ready", status="False", reason="VMNameConflict")
        await world.create_agent("agent-1")
        await world.set_agent_ref("va1", "agent-1")
        await eventually(lambda: _cached_ref(world), what="the agentRef in the cache")
        await vcsim_control.reset_counters()
        await delete_va(world)
        await gone(world, VA, "va1")
    events = await world.events("VMOwnershipMismatch")
    assert events
    assert events[0]["type"] == "Warning"
    assert squatter.name in events[0]["message"]
    assert [v.bios_uuid for v in await world.vms()] == [squatter.bios_uuid]
    assert await world.get(AGENT, "agent-1") is not None  # the Agent of a VM we left stays
    counted = (await vcsim_control.counters()).get("methods", {})
    assert counted.get("Destroy_Task", 0) == counted.get("ReconfigVM_Task", 0) == 0


async def test_retain_keeps_the_vm_and_the_agent(world: World) -> None:
    async with world.run():
        await vm_with_agent(world, cleanupPolicy="Retain")
        await delete_va(world)
        await gone(world, VA, "va1")
    assert [v.name for v in await world.vms()] == [world.vm_name("va1")]
    assert await world.get(AGENT, "agent-1") is not None
    assert await world.events("VMRetained")


async def test_a_vsphere_agent_whose_pool_is_gone_keeps_its_vm(world: World) -> None:
    async with world.run():
        await vm_with_agent(world)
        await world.kube.delete(POOL, namespace=world.namespace, name="pool")
        await eventually(
            lambda: _true(
                world.informers[POOL].get(namespace=world.namespace, name="pool") is None
            ),
            what="the pool to leave the cache",
        )
        await delete_va(world)
        await gone(world, VA, "va1")
    assert [v.name for v in await world.vms()] == [world.vm_name("va1")]
    events = await world.events("PoolNotFound")
    assert events
    assert "retained" in events[0]["message"]


async def registered_agent(
    world: World, name: str, *, bios_uuid: str, mac: str, bound: bool = False
) -> None:
    """The Assisted Installer's Agent for a VM of that identity (no agentRef recorded)."""
    await world.create_agent(name, bound=bound)
    inventory = {
        "hostname": "localhost",
        "interfaces": [{"macAddress": mac, "flags": [], "ipV4Addresses": [], "ipV6Addresses": []}],
        "systemVendor": {"serialNumber": serial(bios_uuid), "manufacturer": "VMware, Inc."},
    }
    await world.kube.patch_merge(
        AGENT,
        namespace=world.namespace,
        name=name,
        subresource="status",
        patch={"status": {"inventory": inventory}},
    )

    async def cached() -> bool:
        obj = world.informers[AGENT].get(namespace=world.namespace, name=name) or {}
        return bool((obj.get("status") or {}).get("inventory"))

    await eventually(cached, what=f"Agent {name}'s inventory in the cache")


async def test_never_delete_the_vm_of_a_bound_agent_even_when_no_agent_ref_is_recorded(
    world: World, vcsim_control: VcsimControl
) -> None:
    """The pool controller's bookkeeping can lose `status.vm.agentRef`; the Agent that
    reports the VM's BIOS UUID still holds the VM, and only Agents tied to the VM go."""
    async with world.run():
        await world.create_secret()
        await world.create_infra_env()
        await world.create_pool()
        await world.condition(POOL, "pool", "ISOReady", status="True")
        await world.create_vsphere_agent("va1")
        va = await world.condition(VA, "va1", "Ready", status="True", reason="VMReady")
        recorded = va["status"]["vm"]
        bios_uuid, mac = recorded["biosUUID"], recorded["macAddress"].replace("-", ":")
        await registered_agent(world, "agent-1", bios_uuid=bios_uuid, mac=mac, bound=True)
        # another VM's Agent that shares only the MAC (its BIOS UUID differs)
        other = "42000000-0000-0000-0000-0000000000ee"
        await registered_agent(world, "agent-other", bios_uuid=other, mac=mac)
        await vcsim_control.reset_counters()
        await delete_va(world)
        held = await world.condition(VA, "va1", "Ready", status="False", reason="VMDeleting")
        message = {c["type"]: c for c in held["status"]["conditions"]}["Ready"]["message"]
        assert "Agent agent-1 is bound" in message
        assert f"BIOS UUID {bios_uuid}" in message
        warnings = await world.events("VMDeleting")
        assert warnings
        assert warnings[0]["type"] == "Warning"
        assert "agent-1" in warnings[0]["message"]
        assert [v.name for v in await world.vms()] == [world.vm_name("va1")]
        assert (await vcsim_control.counters()).get("methods", {}).get("Destroy_Task", 0) == 0
        agent = await world.get(AGENT, "agent-1")
        assert agent is not None
        assert agent["spec"]["approved"] is True  # not touched while bound
        # CAPI releases it: the VM goes, with the Agent tied to it by identity only
        await world.kube.patch_merge(
            AGENT,
            namespace=world.namespace,
            name="agent-1",
            patch={"metadata": {"labels": {names.LABEL_AGENT_MACHINE_REF: None}}},
        )
        await gone(world, VA, "va1")
    assert await world.vms() == []
    assert await world.get(AGENT, "agent-1") is None
    assert await world.get(AGENT, "agent-other") is not None  # not this VM's Agent
