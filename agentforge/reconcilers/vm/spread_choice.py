"""Where a spread pool's next VM goes: chosen once, before it is created, and recorded.

A pool with `spreadPolicy: Spread` places each new VM in a failure domain and on a
host of that domain's cluster. The choice is the pure `vsphere.model.spread.choose`
(fewest of the pool's VMs first; ties to the most free capacity, then the name), fed
with:

- the pool's VMs per domain and per host, counted from its VsphereAgents' records
  (`status.creation` while a creation is in flight, `status.placement` after it), plus
  the choices this process made whose checkpoints the cache does not show yet;
- the domains' usability: each resolved like the pool's placement (the preflight,
  `pool_specs.inspect_domains`, whose inventory read also gives each domain's free
  storage, the domains' tie-break), and the hosts of the chosen domain's cluster (connected, not in
  maintenance, in its host group when one is set; ties by free memory). A domain with
  no usable host is skipped like one whose datastore is full, and the choice is made
  again.

`choosing` serialises the choices of one pool in this process from the choice to the
read-back of the checkpoint (`vm_create._begin`), so two VsphereAgents created at once
never both take the least loaded host from the same counts. The chosen domain and
host go into the creation record before `CreateVM_Task`; a resumed creation uses the
record and never chooses again.

The pool's DRS anti-affinity rules follow the VMs recorded here: they are the pool's,
kept by the `spread-rules` controller (`spread_rules`). With `spreadPolicy` None
nothing here runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentforge import vsphere
from agentforge.api.pool import FailureDomain, VsphereAgentPool
from agentforge.kube.informer import Informer
from agentforge.reconcilers.common import indexes, pool_specs
from agentforge.vsphere.model import spread

if TYPE_CHECKING:
    from agentforge.reconcilers.vm.context import VcenterApi

__all__ = [
    "NoUsableDomain",
    "Spot",
    "SpreadLedger",
    "choose",
    "domain_of",
    "place",
    "pool_agents",
    "pool_key",
    "recorded_spot",
]

JsonObj = dict[str, Any]
Key = tuple[str | None, str | None]


@dataclass(frozen=True, slots=True)
class Spot:
    """The chosen domain and host (None: the cluster has hosts DRS alone may use)."""

    domain: FailureDomain
    host: str | None
    skipped: tuple[spread.Bucket, ...] = ()
    """The domains not usable now, each with its reason (said in the creating event)."""

    def describe(self) -> str:
        """` in failure domain D on host H (skipped: ...)`, for the creating event."""
        text = f" in failure domain {self.domain.name}"
        if self.host:
            text += f" on host {self.host}"
        if self.skipped:
            text += " (skipped: " + "; ".join(f"{b.name}: {b.unusable}" for b in self.skipped)
            text += ")"
        return text


class NoUsableDomain(Exception):
    """No failure domain of the pool can take a VM now (the message says why, each)."""


@dataclass(slots=True)
class SpreadLedger:
    """The vm controller's choices not yet visible in its cache, and a lock per pool."""

    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _pending: dict[str, dict[str, Key]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def choosing(self, pool_key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(pool_key, asyncio.Lock())
        async with lock:
            yield

    def note(self, pool_key: str, agent: str, spot: Spot) -> None:
        self._pending.setdefault(pool_key, {})[agent] = (spot.domain.name, spot.host)

    def drop(self, pool_key: str, agent: str) -> None:
        self._pending.get(pool_key, {}).pop(agent, None)

    def pending(self, pool_key: str, cached: Mapping[str, Key | None]) -> dict[str, Key]:
        """Choices whose VsphereAgent the cache shows without them; the rest forgotten."""
        mine = self._pending.get(pool_key, {})
        for agent in [a for a in mine if a not in cached or cached[a] is not None]:
            del mine[agent]  # recorded in the cache now, or the VsphereAgent is gone
        return dict(mine)


def recorded_spot(raw: Mapping[str, Any]) -> Key | None:
    """The domain and host a VsphereAgent's records name, else None."""
    status = raw.get("status") or {}
    for part in (status.get("creation"), status.get("placement")):
        if isinstance(part, Mapping) and part.get("failureDomain"):
            return (str(part["failureDomain"]), part.get("host") or None)
    return None


def domain_of(pool: VsphereAgentPool, name: str | None) -> FailureDomain | None:
    return next((d for d in pool.spec.vsphere.failure_domains if d.name == name), None)


def _counts(spots: Iterable[Key]) -> tuple[Counter[str], Counter[str]]:
    per_domain: Counter[str] = Counter()
    per_host: Counter[str] = Counter()
    for domain, host in spots:
        if domain:
            per_domain[domain] += 1
        if host:
            per_host[host] += 1
    return per_domain, per_host


async def place(
    service: VcenterApi,
    pool: VsphereAgentPool,
    *,
    informer: Informer,
    ledger: SpreadLedger,
) -> Spot | None:
    """The spot of the pool's next VM; None unless the pool spreads. Raises
    `NoUsableDomain`, `vsphere.VsphereError`."""
    if not pool.spread_domains():
        return None
    return await choose(
        service, pool, agents=pool_agents(informer, pool), ledger=ledger, pool_key=pool_key(pool)
    )


async def choose(
    service: VcenterApi,
    pool: VsphereAgentPool,
    *,
    agents: Iterable[JsonObj],
    ledger: SpreadLedger,
    pool_key: str,
) -> Spot:
    """The domain (and host) for the pool's next VM; raises `NoUsableDomain`."""
    cached: dict[str, Key | None] = {}
    for raw in agents:
        meta = raw.get("metadata") or {}
        if not meta.get("deletionTimestamp"):
            cached[str(meta.get("name"))] = recorded_spot(raw)
    spots = [s for s in cached.values() if s is not None]
    spots += ledger.pending(pool_key, cached).values()
    per_domain, per_host = _counts(spots)
    report = await pool_specs.inspect_domains(service, pool)
    unusable = dict(report.unusable)
    for _ in pool.spread_domains():
        buckets = [
            spread.Bucket(
                name=d.name,
                vms=per_domain[d.name],
                free=report.free.get(d.name, 0),
                unusable=unusable.get(d.name),
            )
            for d in pool.spread_domains()
        ]
        choice = spread.choose_domain(buckets)
        if choice.chosen is None:
            break
        domain = domain_of(pool, choice.chosen.name)
        assert domain is not None
        host, why = await _host(service, pool, domain, per_host)
        if why is None:
            return Spot(domain=domain, host=host, skipped=choice.skipped)
        unusable[domain.name] = why  # and choose again among the others
    skipped = "; ".join(f"{name}: {why}" for name, why in sorted(unusable.items()))
    raise NoUsableDomain(f"no failure domain can take a VM now ({skipped})")


async def _host(
    service: VcenterApi,
    pool: VsphereAgentPool,
    domain: FailureDomain,
    per_host: Counter[str],
) -> tuple[str | None, str | None]:
    """The host holding the fewest of the pool's VMs, or why the domain has none."""
    try:
        hosts = await service.cluster_hosts(
            datacenter=pool.spec.vsphere.datacenter,
            cluster=domain.compute_cluster,
            host_group=domain.host_group,
        )
    except vsphere.VsphereError as exc:
        return None, str(exc)
    choice = spread.choose_host(
        spread.Bucket(name=h.name, vms=per_host[h.name], free=h.free_mib, unusable=h.unusable)
        for h in hosts
    )
    if choice.chosen is None:
        down = "; ".join(str(b.unusable) for b in choice.skipped) or "it has no hosts"
        return None, f"no host of compute cluster {domain.compute_cluster} can take a VM ({down})"
    return choice.chosen.name, None


def pool_key(pool: VsphereAgentPool) -> str:
    return indexes.namespaced_key(pool.metadata.namespace, pool.metadata.name)


def pool_agents(informer: Informer, pool: VsphereAgentPool) -> list[JsonObj]:
    """The pool's VsphereAgents in the cache."""
    return list(informer.by_index(indexes.VSPHERE_AGENTS_BY_POOL, pool_key(pool)))
