"""The planner's view of one pool, read from the informer caches.

Everything a plan needs is found by index (`indexes`): the AgentMachines and
Machines of the pool's nodePool, the Agents of its InfraEnv, its VsphereAgents,
other pools' VsphereAgents in the namespace (their claims), the InfraEnv, and other
live pools serving the same nodePool. Objects become planner facts once per version,
at cache time (the informers' records, `reconcilers/common/records.py`), so a
reconcile of a pool of thousands of VMs parses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from agentforge.api import kinds
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube.informer import Informer
from agentforge.kube.store import key_for, object_key
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.planning import planner
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    AgentMachineFacts,
    Claims,
    InfraEnvFacts,
    MachineFacts,
    VsphereAgentFacts,
    claim_of,
    infra_env_facts,
)

R = TypeVar("R")


class SnapshotSource:
    """Builds `planner.Snapshot`s from the app's informers (one per controller)."""

    def __init__(self, deps: Deps) -> None:
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._agent_machines = deps.informer(kinds.AGENT_MACHINE)
        self._machines = deps.informer(kinds.MACHINE)
        self._agents = deps.informer(kinds.AGENT)
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)
        self._infra_envs = deps.informer(kinds.INFRA_ENV)

    def vm_status(self, *, namespace: str, name: str) -> Mapping[str, Any]:
        """The cached `status.vm` of a VsphereAgent (empty when unknown)."""
        facts = records.record(
            self._vsphere_agents, key_for(namespace=namespace, name=name), VsphereAgentFacts
        )
        return facts.vm_status if facts is not None else {}

    def handover(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The cached `status.handover` of a VsphereAgent (None when it has none)."""
        cached = self._vsphere_agents.get(namespace=namespace, name=name)
        found = ((cached or {}).get("status") or {}).get("handover")
        return found if isinstance(found, Mapping) else None

    def resource_version(self, *, namespace: str, name: str) -> str:
        """The cached resourceVersion of a VsphereAgent (empty when unknown)."""
        facts = records.record(
            self._vsphere_agents, key_for(namespace=namespace, name=name), VsphereAgentFacts
        )
        return facts.resource_version if facts is not None else ""

    def snapshot(self, pool: VsphereAgentPool, *, now: datetime) -> planner.Snapshot:
        namespace, name = pool.metadata.namespace, pool.metadata.name
        node_pool = indexes.node_pool_key(
            control_plane_namespace=pool.spec.control_plane_namespace,
            node_pool_namespace=namespace,
            node_pool=pool.spec.node_pool_ref.name,
        )
        infra_env_name = pool.spec.infra_env_ref.name
        uid = pool.metadata.uid
        claims = []
        for facts in _records(
            self._vsphere_agents, self._vsphere_agents.list(namespace=namespace), VsphereAgentFacts
        ):
            if facts.pool == name and not _left_by_namesake(facts, uid):
                continue
            claim = claim_of(facts)
            if claim is not None:
                claims.append(claim)
        infra_env_key = key_for(namespace=namespace, name=infra_env_name)
        infra_env = records.record(self._infra_envs, infra_env_key, InfraEnvFacts)
        cached_infra_env = self._infra_envs.get_by_key(infra_env_key)
        if infra_env is None and cached_infra_env is not None:
            # cached but rejected by its parser: fail this reconcile with the parser's
            # error, as before records (never plan as if the InfraEnv were missing)
            infra_env = infra_env_facts(cached_infra_env)
        competing = [
            p["metadata"]["name"]  # the index key holds the pool namespace: all of ours
            for p in self._pools.by_index(indexes.POOLS_BY_NODE_POOL, node_pool)
            if not _same_pool(p, namespace=namespace, name=name, uid=uid)
            and not p["metadata"].get("deletionTimestamp")
        ]
        own = _records(
            self._vsphere_agents,
            self._vsphere_agents.by_index(
                indexes.VSPHERE_AGENTS_BY_POOL, indexes.namespaced_key(namespace, name)
            ),
            VsphereAgentFacts,
        )
        return planner.Snapshot(
            pool=pool,
            agent_machines=_records(
                self._agent_machines,
                self._agent_machines.by_index(indexes.BY_NODE_POOL, node_pool),
                AgentMachineFacts,
            ),
            machines=_records(
                self._machines,
                self._machines.by_index(indexes.BY_NODE_POOL, node_pool),
                MachineFacts,
            ),
            agents=_records(
                self._agents,
                self._agents.by_index(
                    indexes.AGENTS_BY_INFRA_ENV, indexes.namespaced_key(namespace, infra_env_name)
                ),
                AgentFacts,
            ),
            vsphere_agents=[f for f in own if not _left_by_namesake(f, uid)],
            now=now,
            claims=Claims.of(claims),
            infra_env=infra_env,
            competing_pools=sorted(competing),
        )


def _records(informer: Informer, objs: Iterable[dict[str, Any]], kind: type[R]) -> list[R]:
    """The records of the cached `objs` that have one (a rejected object has none)."""
    out: list[R] = []
    for obj in objs:
        found = records.record(informer, object_key(obj), kind)
        if found is not None:
            out.append(found)
    return out


def _same_pool(obj: Mapping[str, Any], *, namespace: str, name: str, uid: str) -> bool:
    """`obj` is this pool: the same namespace and name, and the same UID when both
    have one (a re-created pool of the same name is another object)."""
    meta = obj.get("metadata") or {}
    if (meta.get("namespace"), meta.get("name")) != (namespace, name):
        return False
    other = meta.get("uid")
    return not (uid and other and other != uid)


def _left_by_namesake(facts: VsphereAgentFacts, uid: str) -> bool:
    """A VsphereAgent owned by an earlier pool of the same name (its ownerReference
    holds that pool's UID): not this pool's to plan; its VM and Agent are held like
    another pool's (a claim) until the garbage collector removes it."""
    return bool(uid and facts.pool_uid and facts.pool_uid != uid)
