"""What wakes the `pool` controller: which events map to which pool keys (0002).

| source | mapped to | reconciled when (updates) |
|---|---|---|
| pools | the pool | spec, deletion, finalizers, VsphereReady/ISOReady change |
| AgentMachines, Machines | pools of their nodePool | demand-relevant fields change |
| Agents | pools of their InfraEnv | identity, labels, binding or preparation change |
| VsphereAgents | their pool | all but the pool's `status.vm` fields |
| VsphereAgents | the pools sharing its pool's InfraEnv (and its pool) | its claim changes |
| InfraEnvs | pools naming them | always |

The predicates compare small fingerprints of what the planner reads, so the
Assisted Installer's frequent Agent condition updates, and the pool's own status
writes, do not replan a pool of thousands of VMs. Another pool reads a VsphereAgent
only as a claim (`planning.snapshot.claim_of`: its VM identity, its Agent, its pool),
so the steps of a VM's task chain (conditions, creation checkpoint, finalizer) wake
its own pool alone, not every pool sharing the InfraEnv.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agentforge.api import kinds, wire
from agentforge.api.conditions import PoolConditionType
from agentforge.kube.controller import Watch
from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers.common import indexes
from agentforge.reconcilers.planning.snapshot import claim_of, vsphere_agent_facts
from agentforge.reconcilers.pool.status import VM_FIELDS

JsonObj = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = obj.get("metadata") or {}
    return (
        meta.get("deletionTimestamp"),
        meta.get("labels"),
        meta.get("annotations"),
        meta.get("ownerReferences"),
    )


def _conditions(obj: Mapping[str, Any], *types: str) -> tuple[Any, ...]:
    found = wire.get(obj, "status", "conditions") or ()
    return tuple(
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
        for c in found
        if isinstance(c, Mapping) and c.get("type") in types
    )


def _changed(fingerprint: Any) -> Any:
    def predicate(old: JsonObj, new: JsonObj) -> bool:
        return bool(fingerprint(old) != fingerprint(new))

    return predicate


def _pool_fingerprint(pool: JsonObj) -> tuple[Any, ...]:
    meta = pool.get("metadata") or {}
    return (
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        meta.get("finalizers"),
        _conditions(pool, PoolConditionType.VSPHERE_READY, PoolConditionType.ISO_READY),
    )


def _agent_machine_fingerprint(am: JsonObj) -> tuple[Any, ...]:
    return (
        _meta(am),
        wire.get(am, "spec", "providerID"),
        wire.get(am, "status", "agentRef", "name"),
        _conditions(am, "Ready"),
    )


def _machine_fingerprint(machine: JsonObj) -> tuple[Any, ...]:
    return (_meta(machine), wire.get(machine, "status", "phase"), wire.get(machine, "spec"))


def _agent_fingerprint(agent: JsonObj) -> tuple[Any, ...]:
    inventory = wire.get(agent, "status", "inventory") or {}
    return (_meta(agent), agent.get("spec"), inventory)


def _vsphere_agent_fingerprint(va: JsonObj) -> tuple[Any, ...]:
    vm = wire.get(va, "status", "vm") or {}
    return (
        _meta(va),
        va.get("spec"),
        {k: v for k, v in vm.items() if k not in VM_FIELDS},
        wire.get(va, "status", "creation") is not None,
        _conditions(va, "Ready", "ISOEjected"),
    )


def _claim_fingerprint(va: JsonObj) -> tuple[Any, ...]:
    """What another pool's plan reads of a VsphereAgent: its claim, and the pool UID
    that tells a namesake pool's leftovers apart (`pool_snapshot`)."""
    try:
        facts = vsphere_agent_facts(va)
    except Exception:  # noqa: BLE001 - unreadable (no record either): every update counts
        return (object(),)
    return (claim_of(facts), facts.pool_uid)


pool_changed = _changed(_pool_fingerprint)
agent_machine_changed = _changed(_agent_machine_fingerprint)
machine_changed = _changed(_machine_fingerprint)
agent_changed = _changed(_agent_fingerprint)
vsphere_agent_changed = _changed(_vsphere_agent_fingerprint)
claim_changed = _changed(_claim_fingerprint)


class Mappers:
    """Map objects of other kinds to the keys of the pools they concern."""

    def __init__(self, *, pools: Informer) -> None:
        self._pools = pools

    def _keys(self, index: str, value: str | None) -> Iterable[ObjectKey]:
        if not value:
            return ()
        return [
            key_for(namespace=p["metadata"].get("namespace"), name=p["metadata"]["name"])
            for p in self._pools.by_index(index, value)
        ]

    def control_plane_object(self, obj: JsonObj) -> Iterable[ObjectKey]:
        """AgentMachine or Machine -> the pools serving its nodePool."""
        return self._keys(indexes.POOLS_BY_NODE_POOL, indexes.control_plane_object_key(obj))

    def agent(self, agent: JsonObj) -> Iterable[ObjectKey]:
        """Agent -> the pools of its InfraEnv."""
        namespace = wire.get(agent, "metadata", "namespace")
        infra_env = indexes.infra_env_of_agent(agent)
        if not namespace or not infra_env:
            return ()
        return self._keys(indexes.POOLS_BY_INFRA_ENV, indexes.namespaced_key(namespace, infra_env))

    def infra_env(self, infra_env: JsonObj) -> Iterable[ObjectKey]:
        meta = infra_env.get("metadata") or {}
        return self._keys(
            indexes.POOLS_BY_INFRA_ENV,
            indexes.namespaced_key(meta.get("namespace", ""), meta["name"]),
        )

    def vsphere_agent_pool(self, va: JsonObj) -> Iterable[ObjectKey]:
        """VsphereAgent -> its pool (usually one)."""
        namespace = wire.get(va, "metadata", "namespace")
        if not namespace:
            return ()
        return [key_for(namespace=namespace, name=p) for p in indexes.pools_of_vsphere_agent(va)]

    def vsphere_agent(self, va: JsonObj) -> Iterable[ObjectKey]:
        """VsphereAgent -> its pool, and the pools sharing that pool's InfraEnv (claims)."""
        namespace = wire.get(va, "metadata", "namespace")
        if not namespace:
            return ()
        keys: dict[ObjectKey, None] = {}
        for pool_name in indexes.pools_of_vsphere_agent(va):
            keys[key_for(namespace=namespace, name=pool_name)] = None
            pool = self._pools.get(namespace=namespace, name=pool_name)
            infra_env = wire.get(pool, "spec", "infraEnvRef", "name") if pool else None
            if infra_env:
                for key in self._keys(
                    indexes.POOLS_BY_INFRA_ENV, indexes.namespaced_key(namespace, infra_env)
                ):
                    keys[key] = None
        return keys


def watches(informers: Mapping[kinds.Kind, Informer]) -> list[Watch]:
    """The `pool` controller's watches over the app's informers (indexes installed)."""
    pools = informers[kinds.VSPHERE_AGENT_POOL]
    mappers = Mappers(pools=pools)
    return [
        Watch(source=pools, predicate=pool_changed),
        Watch(
            source=informers[kinds.AGENT_MACHINE],
            map=mappers.control_plane_object,
            predicate=agent_machine_changed,
        ),
        Watch(
            source=informers[kinds.MACHINE],
            map=mappers.control_plane_object,
            predicate=machine_changed,
        ),
        Watch(source=informers[kinds.AGENT], map=mappers.agent, predicate=agent_changed),
        Watch(
            source=informers[kinds.VSPHERE_AGENT],
            map=mappers.vsphere_agent_pool,
            predicate=vsphere_agent_changed,
        ),
        Watch(
            source=informers[kinds.VSPHERE_AGENT],
            map=mappers.vsphere_agent,
            predicate=claim_changed,
        ),
        Watch(source=informers[kinds.INFRA_ENV], map=mappers.infra_env),
    ]


__all__ = [
    "Mappers",
    "agent_changed",
    "agent_machine_changed",
    "claim_changed",
    "machine_changed",
    "pool_changed",
    "vsphere_agent_changed",
    "watches",
]
