"""The planner's view of one pool, read from the informer caches.

Everything a plan needs is found by index (`indexes`): the AgentMachines and
Machines of the pool's nodePool, the Agents of its InfraEnv, its VsphereAgents,
other pools' VsphereAgents in the namespace (their claims), the InfraEnv, and other
live pools serving the same nodePool. Objects become planner facts once per version,
on their first read (the informers' records, `reconcilers/common/records.py`), so a
reconcile of a pool of thousands of VMs parses only what changed.

Other pools' claims need every VsphereAgent of the namespace: they are derived once
per version of the VsphereAgent cache (`Informer.revision`) and kept until it
changes, so the pools a burst replans one after another share one pass over the
namespace, and a pool replanned before any VsphereAgent changed reuses its claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from agentforge.api import kinds
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.planning import planner
from agentforge.reconcilers.planning.snapshot import (
    AgentFacts,
    AgentMachineFacts,
    Claim,
    Claims,
    InfraEnvFacts,
    MachineFacts,
    VsphereAgentFacts,
    claim_of,
    infra_env_facts,
)

R = TypeVar("R")


@dataclass(slots=True)
class _NamespaceClaims:
    """Every VsphereAgent record of a namespace with its claim, at one cache revision;
    and the `Claims` built from them per pool (name, UID)."""

    revision: int
    held: list[tuple[VsphereAgentFacts, Claim | None]]
    per_pool: dict[tuple[str, str], Claims] = field(default_factory=dict)


class SnapshotSource:
    """Builds `planner.Snapshot`s from the app's informers (one per controller)."""

    def __init__(self, deps: Deps) -> None:
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._agent_machines = deps.informer(kinds.AGENT_MACHINE)
        self._machines = deps.informer(kinds.MACHINE)
        self._agents = deps.informer(kinds.AGENT)
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)
        self._infra_envs = deps.informer(kinds.INFRA_ENV)
        self._claims: dict[str, _NamespaceClaims] = {}

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
            self._vsphere_agents.keys_by_index(
                indexes.VSPHERE_AGENTS_BY_POOL, indexes.namespaced_key(namespace, name)
            ),
            VsphereAgentFacts,
        )
        return planner.Snapshot(
            pool=pool,
            agent_machines=_records(
                self._agent_machines,
                self._agent_machines.keys_by_index(indexes.BY_NODE_POOL, node_pool),
                AgentMachineFacts,
            ),
            machines=_records(
                self._machines,
                self._machines.keys_by_index(indexes.BY_NODE_POOL, node_pool),
                MachineFacts,
            ),
            agents=_records(
                self._agents,
                self._agents.keys_by_index(
                    indexes.AGENTS_BY_INFRA_ENV, indexes.namespaced_key(namespace, infra_env_name)
                ),
                AgentFacts,
            ),
            vsphere_agents=[f for f in own if not _left_by_namesake(f, uid)],
            now=now,
            claims=self._claims_on(namespace=namespace, name=name, uid=uid),
            infra_env=infra_env,
            competing_pools=sorted(competing),
        )

    def _claims_on(self, *, namespace: str, name: str, uid: str) -> Claims:
        """Other pools' claims as this pool sees them: every VsphereAgent of the
        namespace but its own (a namesake pool's leftovers count as another pool's)."""
        revision = self._vsphere_agents.revision
        cached = self._claims.get(namespace)
        if cached is None or cached.revision != revision:
            held = [
                (facts, claim_of(facts))
                for facts in _records(
                    self._vsphere_agents,
                    self._vsphere_agents.keys(namespace=namespace),
                    VsphereAgentFacts,
                )
            ]
            cached = self._claims[namespace] = _NamespaceClaims(revision=revision, held=held)
        found = cached.per_pool.get((name, uid))
        if found is None:
            found = cached.per_pool[(name, uid)] = Claims.of(
                claim
                for facts, claim in cached.held
                if claim is not None and (facts.pool != name or _left_by_namesake(facts, uid))
            )
        return found


def _records(informer: Informer, keys: Iterable[ObjectKey], kind: type[R]) -> list[R]:
    """The records of the cached `keys` that have one (a rejected object has none)."""
    out: list[R] = []
    for key in keys:
        found = records.record(informer, key, kind)
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
