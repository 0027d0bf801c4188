"""`scaleup` + `pool` against the real control plane: demand, preparation, phases, clean-up.

The controllers run in-process (see `reconcilers_support`); the test plays HyperShift,
CAPI, the Assisted Installer and the `vm` controller by writing their objects as
admin, and waits for named outcomes within deadlines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.kube import client as kube_client
from agentforge.kube import errors
from sim.controlplane.controlplane import ControlPlane
from sim.controlplane.pytest_plugin import namespace_name
from tests.kube.reconcilers_support import (
    LABELS,
    NODE_POOL,
    POOL,
    SHARED_MAC,
    Operator,
    agent_inventory,
    agent_machine_obj,
    agent_obj,
    infra_env_obj,
    machine_obj,
    pool_obj,
    running_operator,
    until,
)

JsonObj = dict[str, Any]
UUID = "421c5a3b-0011-2233-4455-66778899aabb"


@dataclass
class World:
    kube: kube_client.KubeClient
    ns: str
    cpns: str
    op: Operator

    def _ns(self, kind: kinds.Kind) -> str:
        return self.cpns if kind in (kinds.AGENT_MACHINE, kinds.MACHINE) else self.ns

    async def get(self, kind: kinds.Kind, name: str) -> JsonObj | None:
        try:
            return await self.kube.get(kind, namespace=self._ns(kind), name=name)
        except errors.NotFound:
            return None

    async def create(self, kind: kinds.Kind, obj: JsonObj) -> JsonObj:
        return await self.kube.create(kind, obj, namespace=self._ns(kind))

    async def patch(
        self, kind: kinds.Kind, name: str, patch: JsonObj, *, status: bool = False
    ) -> None:
        await self.kube.patch_merge(
            kind,
            namespace=self._ns(kind),
            name=name,
            patch=patch,
            subresource="status" if status else None,
        )

    async def pool(self, name: str = POOL) -> JsonObj:
        found = await self.get(kinds.VSPHERE_AGENT_POOL, name)
        assert found is not None
        return found

    async def vsphere_agents(self) -> list[JsonObj]:
        return (await self.kube.list(kinds.VSPHERE_AGENT, namespace=self.ns)).items

    async def setup_pool(
        self, *, cleanup: str = "Delete", name: str = POOL, node_pool: str = NODE_POOL
    ) -> None:
        if await self.get(kinds.INFRA_ENV, "demo") is None:
            await self.create(kinds.INFRA_ENV, infra_env_obj(self.ns))
            await self.patch(
                kinds.INFRA_ENV, "demo", {"status": {"isoDownloadURL": "https://iso.test/x.iso"}},
                status=True,
            )  # fmt: skip
        await self.create(
            kinds.VSPHERE_AGENT_POOL,
            pool_obj(self.ns, self.cpns, name=name, cleanup=cleanup, node_pool=node_pool),
        )

    async def waiting_agent_machine(self, name: str, *, node_pool: str = NODE_POOL) -> None:
        await self.create(
            kinds.AGENT_MACHINE, agent_machine_obj(self.cpns, self.ns, name, node_pool=node_pool)
        )
        await self.patch(
            kinds.AGENT_MACHINE,
            name,
            {"status": {"conditions": [{"type": "Ready", "status": "False",
                                        "reason": "NoSuitableAgents", "message": "no Agent matches",
                                        "lastTransitionTime": "2026-03-01T00:00:00Z"}]}},
            status=True,
        )  # fmt: skip

    async def vm_recorded(self, va: str, *, bios_uuid: str, mac: str | None = None) -> str:
        """The vm controller's part: the VM of `va` exists and its identity is recorded."""
        found = await until(f"a VsphereAgent for {va}", lambda: self.get(kinds.VSPHERE_AGENT, va))
        vm_name: str = found["metadata"]["annotations"][names.ANNOTATION_VM_NAME]
        vm = {"name": vm_name, "biosUUID": bios_uuid, **({"macAddress": mac} if mac else {})}
        await self.patch(kinds.VSPHERE_AGENT, va, {"status": {"vm": vm}}, status=True)
        return vm_name

    async def vm_phase(self, va: str) -> tuple[str, str] | None:
        found = await self.get(kinds.VSPHERE_AGENT, va)
        vm = ((found or {}).get("status") or {}).get("vm") or {}
        return (vm["phase"], vm.get("reason", "")) if vm.get("phase") else None

    async def phase_is(self, va: str, phase: str, reason: str | None = None) -> JsonObj:
        async def check() -> JsonObj | None:
            found = await self.get(kinds.VSPHERE_AGENT, va)
            vm = ((found or {}).get("status") or {}).get("vm") or {}
            if vm.get("phase") == phase and (reason is None or vm.get("reason") == reason):
                return vm
            return None

        return await until(f"VsphereAgent {va} in phase {phase}/{reason}", check)

    async def prepared(self, am: str, *, cleanup: str = "Delete") -> tuple[str, str, str]:
        """A pool, a waiting AM with its Machine, its VM recorded and its Agent prepared."""
        await self.setup_pool(cleanup=cleanup)
        await self.waiting_agent_machine(am)
        await self.create(kinds.MACHINE, machine_obj(self.cpns, self.ns, f"machine-{am}", infra=am))
        va = await until(f"a VsphereAgent for {am}", lambda: self.get(kinds.VSPHERE_AGENT, am))
        vm_name = va["metadata"]["annotations"][names.ANNOTATION_VM_NAME]
        # the vm controller's part: the VM exists and its identity is recorded
        await self.patch(
            kinds.VSPHERE_AGENT, am, {"status": {"vm": {"name": vm_name, "biosUUID": UUID}}},
            status=True,
        )  # fmt: skip
        # the Assisted Installer's part: the booted VM registers an Agent
        await self.create(kinds.AGENT, agent_obj(self.ns, "agent-1"))
        await self.patch(kinds.AGENT, "agent-1", {"status": agent_inventory(UUID)}, status=True)
        await self.phase_is(am, "Available")
        return am, vm_name, "agent-1"

    async def bind(self, agent: str, am: str) -> None:
        await self.patch(
            kinds.AGENT,
            agent,
            {
                "metadata": {"labels": {names.LABEL_AGENT_MACHINE_REF: am}},
                "spec": {"clusterDeploymentName": {"name": "demo", "namespace": self.cpns}},
            },
        )

    async def unbind(self, agent: str) -> None:
        await self.patch(
            kinds.AGENT,
            agent,
            {
                "metadata": {"labels": {names.LABEL_AGENT_MACHINE_REF: None}},
                "spec": {"clusterDeploymentName": None},
            },
        )


@pytest.fixture
async def world(
    controlplane: ControlPlane,
    kube: kube_client.KubeClient,
    namespace: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[World]:
    cpns = controlplane.create_namespace(namespace_name(f"{request.node.name}-cp"))
    async with running_operator(controlplane, namespaces=[namespace, cpns]) as op:
        yield World(kube=kube, ns=namespace, cpns=cpns, op=op)


async def test_a_waiting_agent_machine_gets_a_pinned_selector_and_one_vsphere_agent(
    world: World,
) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    va = await until("a VsphereAgent for am-1", lambda: world.get(kinds.VSPHERE_AGENT, "am-1"))
    assert va["metadata"]["labels"] == {
        names.LABEL_POOL: POOL,
        names.LABEL_CREATED_FOR: "agent-machine",
        names.LABEL_AGENT_MACHINE: "am-1",
    }
    assert va["metadata"]["ownerReferences"][0]["name"] == POOL
    assert va["metadata"]["finalizers"] == [names.FINALIZER_VSPHERE_AGENT]
    am = await world.get(kinds.AGENT_MACHINE, "am-1")
    assert am is not None
    assert am["spec"]["agentLabelSelector"]["matchLabels"] == {
        **LABELS,
        names.LABEL_AGENT_MACHINE: "am-1",
    }
    pool = await until(
        "the pool counting one waiting AgentMachine",
        lambda: _pool_with(world, waitingAgentMachines=1, agentMachines=1),
    )
    assert names.FINALIZER_POOL in pool["metadata"]["finalizers"]
    assert [v["metadata"]["name"] for v in await world.vsphere_agents()] == ["am-1"]


async def _pool_with(world: World, name: str = POOL, **fields: Any) -> JsonObj | None:
    pool = await world.pool(name)
    status = pool.get("status") or {}
    return pool if all(status.get(k) == v for k, v in fields.items()) else None


async def test_two_pools_for_one_nodepool_get_a_warning_and_no_vsphere_agent(world: World) -> None:
    await world.setup_pool()
    await world.setup_pool(name="twin")
    await world.waiting_agent_machine("am-1")

    async def warning() -> JsonObj | None:
        found = await world.kube.list(kinds.EVENT, namespace=world.cpns)
        return next((e for e in found.items if e.get("reason") == "AmbiguousPoolMatch"), None)

    event = await until("a Warning event on the AgentMachine", warning)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "am-1"
    assert f"{world.ns}/{POOL}" in event["message"]
    assert f"{world.ns}/twin" in event["message"]

    async def ambiguous() -> JsonObj | None:
        conditions = (await world.pool()).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c.get("reason") == "AmbiguousPoolMatch"), None)

    await until("the pool reporting AmbiguousPoolMatch", ambiguous)
    assert await world.vsphere_agents() == []


async def test_an_agent_with_the_vms_bios_uuid_is_prepared_and_the_vm_available(
    world: World,
) -> None:
    va, vm_name, agent_name = await world.prepared("am-1")
    agent = await world.get(kinds.AGENT, agent_name)
    assert agent is not None
    labels = agent["metadata"]["labels"]
    assert labels["customer"] == "acme"
    assert labels[names.LABEL_NODEPOOL] == "workers"
    assert labels[names.LABEL_NODEPOOL_ROLE] == "worker"
    assert labels[names.LABEL_AGENT_MACHINE] == "am-1"
    assert agent["spec"]["role"] == "worker"
    assert agent["spec"]["hostname"] == vm_name
    assert agent["spec"]["approved"] is True
    vm = await world.phase_is(va, "Available", "AgentAvailable")
    assert vm["agentRef"]["name"] == agent_name
    assert vm["biosUUID"] == UUID
    pool = await until(
        "the pool listing the VM", lambda: _pool_with(world, matchingAgents=1, availableAgents=1)
    )
    assert [(v["name"], v["phase"]) for v in pool["status"]["ownedVMs"]] == [(vm_name, "Available")]


async def test_phases_follow_binding_and_machine_deletion_then_cleanup_deletes(
    world: World,
) -> None:
    va, _, agent = await world.prepared("am-1")
    await world.bind(agent, "am-1")
    vm = await world.phase_is(va, "Bound", "AgentBound")
    assert vm["machineRef"]["name"] == "machine-am-1"

    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.phase_is(va, "Released", "MachineDeleting")

    await world.unbind(agent)  # CAPI: drain done, AgentMachine deleted, Agent reclaimed
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await world.phase_is(va, "Released", "MachineDeleting")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})

    async def deleting() -> bool:
        found = await world.get(kinds.VSPHERE_AGENT, va)
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    # held by the vm controller's finalizer (set at creation): VM and Agent are its job
    await until("the released VsphereAgent to be deleted", deleting)
    assert await world.get(kinds.AGENT, agent) is not None


async def test_retain_keeps_a_released_vm(world: World) -> None:
    va, _, agent = await world.prepared("am-1", cleanup="Retain")
    await world.bind(agent, "am-1")
    await world.phase_is(va, "Bound")
    await world.unbind(agent)
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})
    await world.phase_is(va, "Released", "MachineDeleted")
    pool = await until(
        "the pool's plan after the release",
        lambda: _pool_with(world, agentMachines=0),
    )
    assert not any(a["type"] == "DeleteVM" for a in pool["status"]["plannedActions"])
    assert await world.get(kinds.VSPHERE_AGENT, va) is not None


async def test_a_vm_whose_agent_is_bound_is_never_cleaned_up(world: World) -> None:
    va, _, agent = await world.prepared("am-1")
    await world.bind(agent, "am-1")
    await world.phase_is(va, "Bound")
    # The Machine disappears while CAPI still has the Agent bound: never clean up.
    await world.kube.delete(kinds.MACHINE, namespace=world.cpns, name="machine-am-1")
    await world.patch(kinds.MACHINE, "machine-am-1", {"metadata": {"finalizers": None}})
    await world.kube.delete(kinds.AGENT_MACHINE, namespace=world.cpns, name="am-1")
    await until(
        "the pool seeing no AgentMachine",
        lambda: _pool_with(world, agentMachines=0, desiredReplicas=0),
    )
    # Released (MachineDeleting) while the Machine was being deleted, Bound again
    # once it is gone: the Agent is still bound to it.
    await world.phase_is(va, "Bound", "AgentBound")
    assert await world.get(kinds.VSPHERE_AGENT, va) is not None
    pool = await world.pool()
    assert not any(
        a["type"] in ("DeleteVM", "DeleteAgent") for a in pool["status"]["plannedActions"]
    )


async def test_pool_deletion_removes_vsphere_agents_then_its_finalizer(world: World) -> None:
    await world.setup_pool()
    await world.waiting_agent_machine("am-1")
    await world.waiting_agent_machine("am-2")
    await until("two VsphereAgents", lambda: _count(world, 2))
    # Both were created with the vm controller's finalizer; am-2 loses it, as one made
    # by an older version the vm controller has not seen yet.
    await world.patch(kinds.VSPHERE_AGENT, "am-2", {"metadata": {"finalizers": None}})
    await until(
        "the pool finalizer",
        lambda: _has_finalizer(world),
    )
    await world.kube.delete(kinds.VSPHERE_AGENT_POOL, namespace=world.ns, name=POOL)

    async def only_held_one_left() -> bool:
        left = await world.vsphere_agents()
        return [v["metadata"]["name"] for v in left] == ["am-1"] and bool(
            left[0]["metadata"].get("deletionTimestamp")
        )

    await until("am-2 gone and am-1 deleting", only_held_one_left)

    async def reports_deleting() -> bool:
        conditions = ((await world.pool()).get("status") or {}).get("conditions") or []
        return any(
            (c["type"], c["status"], c["reason"]) == ("Ready", "False", "Deleting")
            for c in conditions
        )

    await until("the pool to report Ready=False Deleting", reports_deleting)
    assert await world.get(kinds.VSPHERE_AGENT_POOL, POOL) is not None  # held by the finalizer

    await world.patch(kinds.VSPHERE_AGENT, "am-1", {"metadata": {"finalizers": None}})

    async def pool_gone() -> bool:
        return await world.get(kinds.VSPHERE_AGENT_POOL, POOL) is None

    await until("the pool to be gone", pool_gone)


async def _count(world: World, n: int) -> bool:
    return len(await world.vsphere_agents()) == n


async def _has_finalizer(world: World) -> bool:
    return names.FINALIZER_POOL in (await world.pool())["metadata"].get("finalizers", [])


async def test_two_pools_whose_vms_share_a_mac_each_prepare_and_count_their_own_agent(
    world: World,
) -> None:
    """Claims across pools go by BIOS UUID first: a shared MAC (vcsim repeats them)
    must not make each pool see its own Agent as claimed by the other."""
    other_uuid = "421c5a3b-0011-2233-4455-0000000000bb"
    pools = {
        POOL: ("am-1", UUID, "agent-1", NODE_POOL),
        "blue": ("am-b", other_uuid, "agent-b", "blue"),
    }
    await world.setup_pool()
    await world.setup_pool(name="blue", node_pool="blue")
    for va, bios_uuid, agent, node_pool in pools.values():
        await world.waiting_agent_machine(va, node_pool=node_pool)
        await world.vm_recorded(va, bios_uuid=bios_uuid, mac=SHARED_MAC)
        await world.create(kinds.AGENT, agent_obj(world.ns, agent))
        await world.patch(kinds.AGENT, agent, {"status": agent_inventory(bios_uuid)}, status=True)
    for va, _, agent, node_pool in pools.values():
        vm = await world.phase_is(va, "Available", "AgentAvailable")
        assert vm["agentRef"]["name"] == agent
        prepared = await world.get(kinds.AGENT, agent)
        assert prepared is not None
        assert prepared["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == va
        assert prepared["metadata"]["labels"][names.LABEL_NODEPOOL] == node_pool
    for pool, (va, _, agent, _) in pools.items():
        await world.bind(agent, va)
        await world.phase_is(va, "Bound", "AgentBound")
        await until(f"pool {pool} counting one bound Agent", _bound_agents(world, pool, 1))
    assert [await world.vm_phase(va) for va, *_ in pools.values()] == [("Bound", "AgentBound")] * 2


def _bound_agents(world: World, pool: str, n: int) -> Any:
    async def check() -> JsonObj | None:
        return await _pool_with(world, pool, boundAgents=n)

    return check
