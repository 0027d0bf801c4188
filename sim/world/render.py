"""A snapshot of the world as rich tables: what `make demo` shows live.

One table each for the pool (its counts and conditions), the VMs (power, ISO, its
ISOEjected condition, the phase the pool gives them, their Agent), the Agents (host
state, installation, binding) and the NodePool's Machines with their AgentMachines,
plus the tail of the actors' journal. Pure rendering: a `Snapshot` in, a rich renderable out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agentforge.api import names
from agentforge.vsphere.model import markers
from sim.actors.base import JournalEntry
from sim.actors.capi import is_bound
from sim.world.snapshot import Snapshot, condition_of

__all__ = ["COUNTS", "world_view"]

COUNTS = (
    ("desiredReplicas", "desired"),
    ("agentMachines", "AMs"),
    ("waitingAgentMachines", "waiting"),
    ("agentMachinesWithoutAgent", "without Agent"),
    ("matchingAgents", "matching"),
    ("boundAgents", "bound"),
    ("availableAgents", "available"),
)
_STYLE = {"True": "green", "False": "red"}


def _cond(obj: dict[str, Any] | None, type_: str) -> Text:
    found = condition_of(obj, type_)
    if found is None:
        return Text("-", style="dim")
    status = str(found.get("status"))
    return Text(f"{status}/{found.get('reason', '')}", style=_STYLE.get(status, "yellow"))


def pool_table(snap: Snapshot, pool: str) -> Table:
    table = Table(title=f"VsphereAgentPool {snap.namespace}/{pool}", expand=True)
    for _, header in COUNTS:
        table.add_column(header, justify="right")
    status = snap.pool_status(pool)
    table.add_row(*(str(status.get(key, 0)) for key, _ in COUNTS))
    conditions = Table.grid(padding=(0, 2))
    conditions.add_column(no_wrap=True)
    conditions.add_column(no_wrap=True)
    conditions.add_column(no_wrap=True, overflow="ellipsis")
    for condition in status.get("conditions") or []:
        state = str(condition.get("status"))
        conditions.add_row(
            Text(str(condition.get("type")), style="bold"),
            Text(f"{state}/{condition.get('reason')}", style=_STYLE.get(state, "yellow")),
            Text(str(condition.get("message", ""))[:90], style="dim"),
        )
    return _stack(table, conditions)


def _stack(*parts: RenderableType) -> Table:
    grid = Table.grid(expand=True)
    for part in parts:
        grid.add_row(part)
    return grid


def vm_table(snap: Snapshot, pool: str) -> Table:
    table = Table(title="vSphere VMs (vcsim)", expand=True)
    for column in ("VM", "power", "ISO", "ISOEjected", "phase", "Agent", "host state"):
        table.add_column(column)
    phases = {v.get("name"): v for v in snap.pool_status(pool).get("ownedVMs") or []}
    by_name = {va["metadata"]["name"]: va for va in snap.vsphere_agents}
    for vm in snap.vms_of_pool(pool):
        agent = snap.agent_of_vm(vm)
        owned = phases.get(vm.name) or {}
        va = by_name.get(vm.extra_config.get(markers.PREFIX + "vsphere-agent", ""))
        table.add_row(
            vm.name,
            Text("on", style="green") if vm.powered_on else Text("off", style="red"),
            ", ".join(d[:12] for d in vm.iso_digests) or Text("ejected", style="dim"),
            _cond(va, "ISOEjected"),
            str(owned.get("phase", "-")),
            agent["metadata"]["name"][:8] if agent else "-",
            _state(agent),
        )
    return table


def _state(agent: dict[str, Any] | None) -> str:
    if agent is None:
        return "-"
    return str(((agent.get("status") or {}).get("debugInfo") or {}).get("state", "?"))


def agent_table(snap: Snapshot) -> Table:
    table = Table(title="Agents (Assisted Installer)", expand=True)
    for column in ("Agent", "hostname", "approved", "state", "Installed", "bound to"):
        table.add_column(column)
    for agent in snap.agents:
        labels = agent["metadata"].get("labels") or {}
        table.add_row(
            agent["metadata"]["name"][:8],
            str((agent.get("spec") or {}).get("hostname") or "-"),
            "yes" if (agent.get("spec") or {}).get("approved") else "no",
            _state(agent),
            _cond(agent, "Installed"),
            labels.get(names.LABEL_AGENT_MACHINE_REF, "-") if is_bound(agent) else "-",
        )
    return table


def machine_table(snap: Snapshot, nodepool_key: str) -> Table:
    table = Table(title=f"NodePool {nodepool_key}: Machines / AgentMachines (CAPI)", expand=True)
    for column in ("Machine", "phase", "AgentMachine Ready", "Agent"):
        table.add_column(column)
    ams = {am["metadata"]["name"]: am for am in snap.agent_machines_of(nodepool_key)}
    for machine in snap.machines:
        name = machine["metadata"]["name"]
        am = ams.get(name)
        phase = str((machine.get("status") or {}).get("phase", "-"))
        if machine["metadata"].get("deletionTimestamp"):
            phase = f"{phase} (deleting)"
        agent = (((am or {}).get("status") or {}).get("agentRef") or {}).get("name", "")
        table.add_row(name, phase, _cond(am, "Ready"), agent[:8] or "-")
    return table


def journal_panel(entries: Iterable[JournalEntry]) -> Table:
    table = Table(title="what the actors did", show_header=False, expand=True, box=None)
    table.add_column(style="dim", no_wrap=True)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column()
    for entry in entries:
        stamp, actor, text = str(entry).split(" ", 2)[0], entry.actor, entry.text
        table.add_row(stamp, actor, text)
    return table


def world_view(
    snap: Snapshot, *, pool: str, nodepool_key: str, journal: Iterable[JournalEntry], title: str
) -> RenderableType:
    return Group(
        Text(title, style="bold magenta"),
        pool_table(snap, pool),
        machine_table(snap, nodepool_key),
        vm_table(snap, pool),
        agent_table(snap),
        journal_panel(journal),
    )
