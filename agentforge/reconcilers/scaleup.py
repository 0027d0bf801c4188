"""The `scaleup` controller (key: AgentMachine): one VsphereAgent per waiting AgentMachine.

An AgentMachine reporting Ready=False, reason NoSuitableAgents is demand for one
Agent. If exactly one live pool serves it (same `controlPlaneNamespace`, nodePool
annotation `<pool ns>/<nodePoolRef>`), this controller

1. pins the selection label `agent-forge.containeroo.ch/agent-machine: <am>` into the
   AgentMachine's `spec.agentLabelSelector.matchLabels` (a merge patch: the NodePool's
   own labels stay), so it binds the Agent of the VM made for it and no other;
2. creates exactly one VsphereAgent for it: deterministic name (`naming`), labels
   pool / created-for / agent-machine, the VM name annotation, an ownerReference to
   the pool, and the `vm` controller's finalizer already set (one write fewer per VM
   than a later patch; that patch remains for VsphereAgents users create to adopt a
   VM, and for those an older version created).

Both steps are idempotent across restarts and concurrent events: the cache and the
index `VSPHERE_AGENTS_BY_AGENT_MACHINE` say whether the VsphereAgent exists; a
create that meets AlreadyExists reads the object and accepts it when it is ours
(a name held by another pool's or AgentMachine's object moves to the fallback name).
A VsphereAgent being deleted for this AgentMachine is waited for, never duplicated.
Two matching pools are a configuration error: a Warning event on the AgentMachine
names both and the fix, and nothing is created. A pool being deleted creates nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from agentforge.api import kinds, names, rbac, views
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube import errors
from agentforge.kube.controller import Controller, Result, Watch
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers import event_groups, indexes, naming
from agentforge.reconcilers.deps import Deps

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
CONTROLLER_NAME = "scaleup"

rbac.needs(kinds.AGENT_MACHINE, "patch", why="pin the selection label into agentLabelSelector")
rbac.needs(kinds.VSPHERE_AGENT, "create", "get", why="one VsphereAgent per waiting AgentMachine")
rbac.needs(kinds.EVENT, "create", "patch", why="events about AgentMachines (aggregated)")


class ScaleUpEvent(StrEnum):
    VSPHERE_AGENT_CREATED = "VsphereAgentCreated"
    AMBIGUOUS_POOLS = "AmbiguousPoolMatch"
    NAME_TAKEN = "VsphereAgentNameTaken"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _is_ours(va: Mapping[str, Any], *, pool: str, selection: str) -> bool:
    labels = _meta(va).get("labels") or {}
    return (
        labels.get(names.LABEL_POOL) == pool and labels.get(names.LABEL_AGENT_MACHINE) == selection
    )


def vsphere_agent_object(*, pool: VsphereAgentPool, name: str, selection: str) -> dict[str, Any]:
    """The VsphereAgent requested for one AgentMachine of `pool`."""
    namespace = pool.metadata.namespace
    return {
        "apiVersion": kinds.VSPHERE_AGENT.api_version,
        "kind": kinds.VSPHERE_AGENT.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": [names.FINALIZER_VSPHERE_AGENT],
            "labels": {
                names.LABEL_POOL: pool.metadata.name,
                names.LABEL_CREATED_FOR: names.CreatedFor.AGENT_MACHINE.value,
                names.LABEL_AGENT_MACHINE: selection,
            },
            "annotations": {
                names.ANNOTATION_VM_NAME: naming.vm_name(
                    name_prefix=pool.effective_name_prefix(),
                    namespace=namespace,
                    vsphere_agent=name,
                )
            },
            "ownerReferences": [
                {
                    "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
                    "kind": kinds.VSPHERE_AGENT_POOL.kind,
                    "name": pool.metadata.name,
                    "uid": pool.metadata.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {"poolRef": {"name": pool.metadata.name}},
    }


class ScaleUpReconciler:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._client = deps.client
        self._agent_machines = deps.informer(kinds.AGENT_MACHINE)
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)

    async def reconcile(self, key: ObjectKey) -> Result | None:
        obj = self._agent_machines.get_by_key(key)
        if obj is None:
            return None
        am = views.AgentMachine.model_validate(obj)
        if am.is_deleting or not am.is_waiting:
            return None
        node_pool_key = indexes.control_plane_object_key(obj)
        if node_pool_key is None:
            return None
        pools = sorted(
            (p for p in self._pools.by_index(indexes.POOLS_BY_NODE_POOL, node_pool_key)),
            key=lambda p: _meta(p).get("name", ""),
        )
        live = [p for p in pools if not _meta(p).get("deletionTimestamp")]
        if not live:
            return None
        if len(live) > 1:
            await self._ambiguous(obj, am, live)
            return None
        pool = VsphereAgentPool.model_validate(live[0])
        selection = naming.selection_label_value(agent_machine=am.metadata.name)
        await self._pin(am, selection)
        await self._ensure_vsphere_agent(obj, am, pool, selection)
        return None

    async def _ambiguous(self, obj: JsonObj, am: views.AgentMachine, pools: list[JsonObj]) -> None:
        names_ = " and ".join(f"{_meta(p).get('namespace')}/{_meta(p).get('name')}" for p in pools)
        await self._deps.events.record(
            obj,
            type=EventType.WARNING,
            reason=ScaleUpEvent.AMBIGUOUS_POOLS,
            message=f"AgentMachine {am.metadata.key} matches VsphereAgentPools {names_} (same "
            "controlPlaneNamespace and nodePoolRef); delete one of them or point it at another "
            "NodePool. No VM is created until exactly one pool matches.",
        )

    async def _pin(self, am: views.AgentMachine, selection: str) -> None:
        if am.spec.agent_label_selector.match_labels.get(names.LABEL_AGENT_MACHINE) == selection:
            return
        patch = {
            "spec": {"agentLabelSelector": {"matchLabels": {names.LABEL_AGENT_MACHINE: selection}}}
        }
        try:
            await self._client.patch_merge(
                kinds.AGENT_MACHINE,
                namespace=am.metadata.namespace,
                name=am.metadata.name,
                patch=patch,
            )
        except errors.NotFound:
            return

    async def _ensure_vsphere_agent(
        self, am_obj: JsonObj, am: views.AgentMachine, pool: VsphereAgentPool, selection: str
    ) -> None:
        namespace, pool_name = pool.metadata.namespace, pool.metadata.name
        existing = self._vsphere_agents.by_index(
            indexes.VSPHERE_AGENTS_BY_AGENT_MACHINE,
            indexes.vsphere_agent_machine_key(
                namespace=namespace, pool=pool_name, selection=selection
            ),
        )
        if existing:
            return  # made already (or being deleted: its deletion event brings us back)
        candidates = dict.fromkeys(
            (
                naming.vsphere_agent_name(agent_machine=am.metadata.name),
                naming.vsphere_agent_fallback_name(
                    namespace=namespace, pool=pool_name, agent_machine=am.metadata.name
                ),
            )
        )
        for name in candidates:
            cached = self._vsphere_agents.get(namespace=namespace, name=name)
            if cached is not None:
                if _is_ours(cached, pool=pool_name, selection=selection):
                    return
                continue
            body = vsphere_agent_object(pool=pool, name=name, selection=selection)
            try:
                await self._client.create(kinds.VSPHERE_AGENT, body, namespace=namespace)
            except errors.AlreadyExists:
                current = await self._client.get(
                    kinds.VSPHERE_AGENT, namespace=namespace, name=name
                )
                if _is_ours(current, pool=pool_name, selection=selection):
                    return
                continue
            vm = body["metadata"]["annotations"][names.ANNOTATION_VM_NAME]
            await self._deps.events.record(
                am_obj,
                group=event_groups.pool_ref(
                    namespace=namespace, name=pool_name, uid=pool.metadata.uid
                ),  # in a burst, all but the first: combined onto the pool
                type=EventType.NORMAL,
                reason=ScaleUpEvent.VSPHERE_AGENT_CREATED,
                message=f"created VsphereAgent {namespace}/{name} (VM {vm}) of pool "
                f"{namespace}/{pool_name} for this AgentMachine; it binds the Agent labelled "
                f"{names.LABEL_AGENT_MACHINE}={selection}",
            )
            return
        await self._deps.events.record(
            am_obj,
            type=EventType.WARNING,
            reason=ScaleUpEvent.NAME_TAKEN,
            message=f"cannot create a VsphereAgent for AgentMachine {am.metadata.key}: the names "
            f"{' and '.join(f'{namespace}/{n}' for n in candidates)} are taken by objects of "
            "another pool or AgentMachine; delete or rename them",
        )


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


def _vsphere_agent_changed(old: JsonObj, new: JsonObj) -> bool:
    return (_meta(old).get("deletionTimestamp"), _meta(old).get("labels")) != (
        _meta(new).get("deletionTimestamp"),
        _meta(new).get("labels"),
    )


class _Mappers:
    def __init__(self, *, pools: Any, agent_machines: Any) -> None:
        self._pools = pools
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

    def vsphere_agent(self, va: JsonObj) -> Iterable[ObjectKey]:
        """A VsphereAgent -> the AgentMachine it was made for."""
        namespace = _meta(va).get("namespace")
        selection = (_meta(va).get("labels") or {}).get(names.LABEL_AGENT_MACHINE)
        if not namespace or not selection:
            return ()
        keys: list[ObjectKey] = []
        for pool_name in indexes.pools_of_vsphere_agent(va):
            pool = self._pools.get(namespace=namespace, name=pool_name)
            cpns = ((pool or {}).get("spec") or {}).get("controlPlaneNamespace")
            if not cpns:
                continue
            if self._agent_machines.get(namespace=cpns, name=selection) is not None:
                keys.append(key_for(namespace=cpns, name=selection))
                continue
            node_pool = indexes.pool_node_pool_key(pool or {})  # a hashed selection value
            for am in self._agent_machines.by_index(indexes.BY_NODE_POOL, node_pool or ""):
                name = _meta(am)["name"]
                if naming.selection_label_value(agent_machine=name) == selection:
                    keys.append(key_for(namespace=cpns, name=name))
        return keys


def controller(deps: Deps) -> Controller:
    """The `scaleup` controller over the app's informers (indexes installed here)."""
    indexes.install(deps.informers)
    pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
    agent_machines = deps.informer(kinds.AGENT_MACHINE)
    mappers = _Mappers(pools=pools, agent_machines=agent_machines)
    return Controller(
        name=CONTROLLER_NAME,
        reconcile=ScaleUpReconciler(deps).reconcile,
        watches=[
            Watch(source=agent_machines, predicate=_agent_machine_changed),
            Watch(source=pools, map=mappers.pool, predicate=_pool_changed),
            Watch(
                source=deps.informer(kinds.VSPHERE_AGENT),
                map=mappers.vsphere_agent,
                predicate=_vsphere_agent_changed,
            ),
        ],
        workers=deps.workers,
    )
