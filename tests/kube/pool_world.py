"""The pool/scale-up controllers' test world: the real operator's controllers on the
control plane (no vCenter: tests play the vm controller's part by writing status).

`pool_world` (a fixture in `tests/kube/conftest.py`) runs the operator over a test
namespace and its control plane namespace; tests of the pool, hand-over, look-alike
clusters and status pacing share it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agentforge.api import kinds, names
from agentforge.kube import client as kube_client
from agentforge.kube import errors
from sim.actors.waiting import eventually
from sim.controlplane.controlplane import ControlPlane
from tests.kube.reconcilers_support import (
    NODE_POOL,
    POOL,
    Operator,
    agent_inventory,
    agent_machine_obj,
    agent_obj,
    infra_env_obj,
    machine_obj,
    pool_obj,
    running_operator,
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
        found = await eventually(
            lambda: self.get(kinds.VSPHERE_AGENT, va), what=f"a VsphereAgent for {va}"
        )
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

        return await eventually(check, what=f"VsphereAgent {va} in phase {phase}/{reason}")

    async def prepared(self, am: str, *, cleanup: str = "Delete") -> tuple[str, str, str]:
        """A pool, a waiting AM with its Machine, its VM recorded and its Agent prepared."""
        await self.setup_pool(cleanup=cleanup)
        await self.waiting_agent_machine(am)
        await self.create(kinds.MACHINE, machine_obj(self.cpns, self.ns, f"machine-{am}", infra=am))
        va = await eventually(
            lambda: self.get(kinds.VSPHERE_AGENT, am), what=f"a VsphereAgent for {am}"
        )
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


async def pool_with(world: World, name: str = POOL, **fields: Any) -> JsonObj | None:
    """The pool when its status has `fields` (for `until`), else None."""
    pool = await world.pool(name)
    status = pool.get("status") or {}
    return pool if all(status.get(k) == v for k, v in fields.items()) else None


@contextlib.asynccontextmanager
async def pool_world(
    controlplane: ControlPlane, kube: kube_client.KubeClient, namespace: str, cpns: str
) -> AsyncIterator[World]:
    """The operator running over `namespace` and `cpns`."""
    async with running_operator(controlplane, namespaces=[namespace, cpns]) as op:
        yield World(kube=kube, ns=namespace, cpns=cpns, op=op)
