"""The `scaleup` controller (key: AgentMachine): pin the selection label of waiting demand.

An AgentMachine reporting Ready=False, reason NoSuitableAgents is demand for one
Agent. If exactly one live pool serves it (same `controlPlaneNamespace`, nodePool
annotation `<pool ns>/<nodePoolRef>`), this controller pins the selection label
`agent-forge.containeroo.ch/agent-machine: <am>` into the AgentMachine's
`spec.agentLabelSelector.matchLabels` (a merge patch: the NodePool's own labels
stay), so it binds the Agent of the VM that serves it and no other.

Which VM serves it, a VM of an AgentMachine that went away or a new one, is the pool's
decision (`assignment`), taken for the whole pool at once: deciding it here, one
AgentMachine at a time, made a new VM for every replacement while the replaced
AgentMachines' VMs still booted. Two matching pools are a configuration error: a
Warning event on the AgentMachine names both and the fix, and nothing is pinned (the
pool creates nothing either). A pool being deleted pins nothing.

The work queue takes turns between NodePools (`WorkQueue` fairness, the key's
nodePool as `indexes.control_plane_object_key` reads it), as the vm controller's does
between pools: a NodePool asking for one Agent while another's hundreds are queued
is pinned within one turn of the NodePools, so its pool's plan sees it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from agentforge.api import kinds, names, rbac, views
from agentforge.kube import errors
from agentforge.kube.controller import Controller, Result, Watch
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey, key_for, split_key
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.planning.snapshot import AgentMachineFacts

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
CONTROLLER_NAME = "scaleup"

rbac.needs(kinds.AGENT_MACHINE, "patch", why="pin the selection label into agentLabelSelector")
rbac.needs(kinds.EVENT, "create", "patch", why="events about AgentMachines (aggregated)")


class ScaleUpEvent(StrEnum):
    AMBIGUOUS_POOLS = "AmbiguousPoolMatch"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class ScaleUpReconciler:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._client = deps.client
        self._agent_machines = deps.informer(kinds.AGENT_MACHINE)
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)

    async def reconcile(self, key: ObjectKey) -> Result | None:
        obj = self._agent_machines.get_by_key(key)
        if obj is None:
            return None
        node_pool_key = indexes.control_plane_object_key(obj)
        if node_pool_key is None:
            return None
        pools = sorted(
            (p for p in self._pools.by_index(indexes.POOLS_BY_NODE_POOL, node_pool_key)),
            key=lambda p: _meta(p).get("name", ""),
        )
        live = [p for p in pools if not _meta(p).get("deletionTimestamp")]
        if not live:  # no pool serves its NodePool: its record is never parsed
            return None
        am = records.record(self._agent_machines, key, AgentMachineFacts)
        if am is None or am.deleting or not am.waiting:
            return None
        if len(live) > 1:
            await self._ambiguous(obj, key, live)
            return None
        await self._pin(key, am)
        return None

    async def _ambiguous(self, obj: JsonObj, key: ObjectKey, pools: list[JsonObj]) -> None:
        names_ = " and ".join(f"{_meta(p).get('namespace')}/{_meta(p).get('name')}" for p in pools)
        await self._deps.events.record(
            obj,
            type=EventType.WARNING,
            reason=ScaleUpEvent.AMBIGUOUS_POOLS,
            message=f"AgentMachine {key} matches VsphereAgentPools {names_} (same "
            "controlPlaneNamespace and nodePoolRef); delete one of them or point it at another "
            "NodePool. No VM is created until exactly one pool matches.",
        )

    async def _pin(self, key: ObjectKey, am: AgentMachineFacts) -> None:
        if am.pinned == am.selection:
            return
        selector = {"matchLabels": {names.LABEL_AGENT_MACHINE: am.selection}}
        namespace, name = split_key(key)
        try:
            await self._client.patch_merge(
                kinds.AGENT_MACHINE,
                namespace=namespace,
                name=name,
                patch={"spec": {"agentLabelSelector": selector}},
            )
        except errors.NotFound:
            return


# --- watches ---------------------------------------------------------------------------


def _waiting_fingerprint(am: JsonObj) -> tuple[Any, ...]:
    meta = _meta(am)
    ready = next(
        (
            (c.get("status"), c.get("reason"))
            for c in (am.get("status") or {}).get("conditions") or ()
            if isinstance(c, Mapping) and c.get("type") == views.CONDITION_READY
        ),
        None,
    )
    selector = ((am.get("spec") or {}).get("agentLabelSelector") or {}).get("matchLabels")
    return (meta.get("deletionTimestamp"), meta.get("annotations"), ready, selector)


def _agent_machine_changed(old: JsonObj, new: JsonObj) -> bool:
    return _waiting_fingerprint(old) != _waiting_fingerprint(new)


def _pool_changed(old: JsonObj, new: JsonObj) -> bool:
    def fingerprint(pool: JsonObj) -> tuple[Any, ...]:
        meta = _meta(pool)
        return (meta.get("generation"), meta.get("deletionTimestamp"))

    return fingerprint(old) != fingerprint(new)


class _Mappers:
    def __init__(self, *, agent_machines: Any) -> None:
        self._agent_machines = agent_machines

    def pool(self, pool: JsonObj) -> Iterable[ObjectKey]:
        """A pool -> every AgentMachine of its nodePool (demand it may now serve)."""
        node_pool = indexes.pool_node_pool_key(pool)
        if node_pool is None:
            return ()
        return [
            key_for(namespace=_meta(am).get("namespace"), name=_meta(am)["name"])
            for am in self._agent_machines.by_index(indexes.BY_NODE_POOL, node_pool)
        ]


def controller(deps: Deps) -> Controller:
    """The `scaleup` controller over the app's informers (indexes installed here)."""
    indexes.install(deps.informers)
    pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
    agent_machines = deps.informer(kinds.AGENT_MACHINE)
    mappers = _Mappers(agent_machines=agent_machines)

    def node_pool_of(key: ObjectKey) -> str:
        """The NodePool an AgentMachine's key takes turns in; a key no longer cached
        (or naming no NodePool) goes with the keys of none."""
        obj = agent_machines.get_by_key(key)
        return (indexes.control_plane_object_key(obj) if obj is not None else None) or ""

    return Controller(
        name=CONTROLLER_NAME,
        reconcile=ScaleUpReconciler(deps).reconcile,
        watches=[
            Watch(source=agent_machines, predicate=_agent_machine_changed),
            Watch(source=pools, map=mappers.pool, predicate=_pool_changed),
        ],
        workers=deps.workers,
        fairness=node_pool_of,
    )
