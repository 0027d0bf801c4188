"""One consistent-enough picture of the world, for assertions and the demo.

`Snapshot` holds raw objects (dicts, as the API server returns them) and the VMs of
the world as `VmFact`s, and answers the questions tests ask ("which VMs does pool p
own?", "which Agent booted this VM?", "how many AgentMachines are bound?") in one
place. `describe()` renders it compactly; `eventually` shows it when a wait fails.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentforge.api import names
from agentforge.vsphere.model import markers
from sim.actors.capi import is_bound
from sim.actors.inventory import serial_number
from sim.actors.vcenter import VmFact

__all__ = ["Snapshot", "condition_of"]

Obj = dict[str, Any]


def condition_of(obj: Obj | None, type_: str) -> Obj | None:
    """The condition of `type_` in `obj.status.conditions`, or None."""
    if obj is None:
        return None
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _true(obj: Obj | None, type_: str) -> bool:
    found = condition_of(obj, type_)
    return found is not None and found.get("status") == "True"


@dataclass(frozen=True, slots=True)
class Snapshot:
    namespace: str
    control_plane_namespace: str
    pools: list[Obj] = field(default_factory=list)
    vsphere_agents: list[Obj] = field(default_factory=list)
    agents: list[Obj] = field(default_factory=list)
    agent_machines: list[Obj] = field(default_factory=list)
    machines: list[Obj] = field(default_factory=list)
    infraenvs: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    vms: list[VmFact] = field(default_factory=list)
    """VMs of this world: marked as made for a pool of its namespace, or booting its ISOs."""
    images: dict[str, str] = field(default_factory=dict)
    """InfraEnv name -> sha256 of its current discovery image."""

    # --- pools ---------------------------------------------------------------------------

    def pool(self, name: str) -> Obj | None:
        return next((p for p in self.pools if _name(p) == name), None)

    def pool_status(self, name: str) -> Obj:
        pool = self.pool(name)
        return dict((pool or {}).get("status") or {})

    def pool_condition(self, name: str, type_: str) -> Obj | None:
        return condition_of(self.pool(name), type_)

    def count(self, pool: str, field_name: str) -> int:
        """A count from the pool's status (`boundAgents`, `waitingAgentMachines`, ...)."""
        return int(self.pool_status(pool).get(field_name) or 0)

    def events_about(self, kind: str, name: str) -> list[Obj]:
        return [
            e
            for e in self.events
            if (e.get("involvedObject") or {}).get("kind") == kind
            and (e.get("involvedObject") or {}).get("name") == name
        ]

    # --- VMs -----------------------------------------------------------------------------

    def vms_of_pool(self, pool: str) -> list[VmFact]:
        """VMs whose ownership markers name this pool (of this namespace)."""
        return [
            vm
            for vm in self.vms
            if vm.extra_config.get(markers.PREFIX + "pool-namespace") == self.namespace
            and vm.extra_config.get(markers.PREFIX + "pool-name") == pool
        ]

    def vm_names(self, pool: str | None = None) -> set[str]:
        return {vm.name for vm in (self.vms if pool is None else self.vms_of_pool(pool))}

    def vm(self, name: str) -> VmFact | None:
        return next((vm for vm in self.vms if vm.name == name), None)

    # --- Agents and CAPI -----------------------------------------------------------------

    def agent_of_vm(self, vm: VmFact) -> Obj | None:
        serial = serial_number(vm.bios_uuid)
        return next(
            (
                a
                for a in self.agents
                if ((a.get("status") or {}).get("inventory") or {})
                .get("systemVendor", {})
                .get("serialNumber")
                == serial
            ),
            None,
        )

    def bound_agents(self) -> list[Obj]:
        return [a for a in self.agents if is_bound(a)]

    def installed_agents(self) -> list[Obj]:
        return [a for a in self.agents if _true(a, "Installed")]

    def agent_machines_of(self, nodepool_key: str) -> list[Obj]:
        return [
            am
            for am in self.agent_machines
            if (am["metadata"].get("annotations") or {}).get(names.ANNOTATION_NODEPOOL)
            == nodepool_key
        ]

    def ready_agent_machines(self, nodepool_key: str | None = None) -> list[Obj]:
        ams = self.agent_machines if nodepool_key is None else self.agent_machines_of(nodepool_key)
        return [
            am for am in ams if _true(am, "Ready") and not am["metadata"].get("deletionTimestamp")
        ]

    def bound_vms_of_pool(self, pool: str) -> list[tuple[VmFact, Obj]]:
        """(VM, Agent) pairs of the pool whose Agent is bound."""
        pairs = []
        for vm in self.vms_of_pool(pool):
            agent = self.agent_of_vm(vm)
            if agent is not None and is_bound(agent):
                pairs.append((vm, agent))
        return pairs

    def converged(self, *, pool: str, nodepool_key: str, replicas: int) -> bool:
        """The pool settled at `replicas`: every AgentMachine bound to the Agent of a VM
        of this pool, exactly that many VMs and VsphereAgents, and the pool's status
        agrees (nothing waiting, `replicas` AgentMachines and bound Agents)."""
        ams = self.agent_machines_of(nodepool_key)
        if len(ams) != replicas or len(self.ready_agent_machines(nodepool_key)) != replicas:
            return False
        vms = self.vms_of_pool(pool)
        if len(vms) != replicas:
            return False
        agents = [self.agent_of_vm(vm) for vm in vms]
        bound_to: set[str | None] = set()
        for agent in agents:
            if agent is None or not is_bound(agent):
                return False
            bound_to.add((agent["metadata"].get("labels") or {}).get(names.LABEL_AGENT_MACHINE_REF))
        if bound_to != {am["metadata"]["name"] for am in ams}:
            return False
        pool_vas = [
            va
            for va in self.vsphere_agents
            if (va["metadata"].get("labels") or {}).get(names.LABEL_POOL) == pool
        ]
        return (
            len(pool_vas) == replicas
            and self.count(pool, "waitingAgentMachines") == 0
            and self.count(pool, "boundAgents") == replicas
            and self.count(pool, "agentMachines") == replicas
        )

    # --- rendering -----------------------------------------------------------------------

    def describe(self) -> str:
        lines = [f"world {self.namespace} (control plane namespace {self.control_plane_namespace})"]
        for pool in self.pools:
            status = pool.get("status") or {}
            counts = ", ".join(
                f"{k}={status.get(k, 0)}"
                for k in (
                    "desiredReplicas",
                    "agentMachines",
                    "waitingAgentMachines",
                    "agentMachinesWithoutAgent",
                    "matchingAgents",
                    "boundAgents",
                    "availableAgents",
                )
            )
            conds = "; ".join(
                f"{c.get('type')}={c.get('status')}/{c.get('reason')}: {c.get('message', '')[:120]}"
                for c in status.get("conditions") or []
            )
            owned = ", ".join(
                f"{v.get('name')}:{v.get('phase')}" for v in status.get("ownedVMs") or []
            )
            iso = status.get("iso") or {}
            lines += [
                f"pool {_name(pool)}: {counts}",
                f"  conditions: {conds or '-'}",
                f"  ownedVMs: {owned or '-'}",
                f"  iso: {str(iso.get('sha256', '-'))[:12]} at {iso.get('path', '-')}, "
                f"checked {iso.get('checkedAt', '-')}",
            ]
        lines.append("vsphereagents: " + _names(self.vsphere_agents, _va_phase))
        lines.append("machines: " + _names(self.machines, _machine_state))
        lines.append("agentmachines: " + _names(self.agent_machines, _am_state))
        lines.append("agents: " + _names(self.agents, _agent_state))
        lines.append(
            "images: " + (", ".join(f"{k}={v[:12]}" for k, v in self.images.items()) or "-")
        )
        lines.append("vms: " + (", ".join(_vm_state(vm) for vm in sorted_vms(self.vms)) or "-"))
        warnings = [e for e in self.events if e.get("type") == "Warning"]
        for event in warnings[-8:]:
            involved = event.get("involvedObject") or {}
            lines.append(
                f"event {event.get('reason')} on {involved.get('kind')}/{involved.get('name')}: "
                f"{(event.get('message') or '')[:160]}"
            )
        return "\n".join(lines)


def sorted_vms(vms: Iterable[VmFact]) -> list[VmFact]:
    return sorted(vms, key=lambda vm: vm.name)


def _vm_state(vm: VmFact) -> str:
    isos = ",".join(d[:12] for d in vm.iso_digests) or "no ISO"
    return f"{vm.name}({'on' if vm.powered_on else 'off'},{isos},{vm.moref})"


def _names(objs: Iterable[Obj], state: Any) -> str:
    return ", ".join(f"{_name(o)}({state(o)})" for o in objs) or "-"


def _va_phase(va: Obj) -> str:
    vm = (va.get("status") or {}).get("vm") or {}
    return f"{vm.get('name', '?')}:{vm.get('phase', '?')}"


def _machine_state(machine: Obj) -> str:
    deleting = "deleting," if machine["metadata"].get("deletionTimestamp") else ""
    return deleting + str((machine.get("status") or {}).get("phase", "?"))


def _am_state(am: Obj) -> str:
    ready = condition_of(am, "Ready") or {}
    agent = ((am.get("status") or {}).get("agentRef") or {}).get("name", "")
    deleting = "deleting," if am["metadata"].get("deletionTimestamp") else ""
    return f"{deleting}{ready.get('status', '?')}/{ready.get('reason', '?')}" + (
        f"->{agent[:8]}" if agent else ""
    )


def _agent_state(agent: Obj) -> str:
    state = ((agent.get("status") or {}).get("debugInfo") or {}).get("state", "?")
    host = ((agent.get("status") or {}).get("inventory") or {}).get("hostname", "?")
    bound = (agent["metadata"].get("labels") or {}).get(names.LABEL_AGENT_MACHINE_REF)
    approved = "approved" if (agent.get("spec") or {}).get("approved") else "unapproved"
    return f"{host},{state},{approved}" + (f",bound:{bound}" if bound else "")
