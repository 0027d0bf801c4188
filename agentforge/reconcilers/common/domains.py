"""Which failure domains of a spread pool can take VMs, and the words that say so.

Each domain of a pool with `spreadPolicy: Spread` is resolved like the pool's own
placement (`VsphereService.preflight` with the domain's cluster, storage and network),
and every domain that fails is named with its problems, so the pool's `VsphereReady`
condition can say `FailureDomainUnusable` instead of skipping a domain silently. The
same check serves `agentforge check`. The inventory read that checks a domain also
gives each usable domain's free storage (`VsphereService.inspect_storage`), which a
spread pool's choice uses to break ties between domains holding as many of its VMs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentforge import vsphere
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.common import pool_specs

__all__ = ["DomainReport", "inspect_domains"]


@dataclass(frozen=True, slots=True)
class DomainReport:
    usable: tuple[str, ...]
    unusable: tuple[tuple[str, str], ...]
    """(domain name, every problem in one line) per domain that cannot take VMs."""
    free: Mapping[str, int] = field(default_factory=dict)
    """Free storage in bytes per usable domain (its datastore, or datastore cluster)."""

    @property
    def message(self) -> str:
        skipped = "; ".join(f"failure domain {name}: {why}" for name, why in self.unusable)
        if not self.usable:
            return f"no failure domain can take VMs: {skipped}"
        return f"new VMs go to {', '.join(self.usable)} only; skipped: {skipped}"


async def inspect_domains(service: vsphere.VsphereService, pool: VsphereAgentPool) -> DomainReport:
    """Resolve every failure domain in effect; a vCenter error counts against the domain."""
    usable: list[str] = []
    unusable: list[tuple[str, str]] = []
    free: dict[str, int] = {}
    for domain in pool.spread_domains():
        placement = pool_specs.domain_placement(pool, domain)
        try:
            problems, free_bytes = await service.inspect_storage(placement=placement)
        except vsphere.VsphereError as exc:
            problems = [vsphere.Problem(subject="vCenter", message=str(exc), fix="retried")]
            free_bytes = 0
        if problems:
            unusable.append((domain.name, "; ".join(str(p) for p in problems)))
        else:
            usable.append(domain.name)
            free[domain.name] = free_bytes
    return DomainReport(usable=tuple(usable), unusable=tuple(unusable), free=free)
