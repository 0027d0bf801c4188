"""A pool's spec in the vSphere layer's terms: placement, hardware, ISO location, markers.

One translation used by the `infra` and `vm` controllers, so the folder a VM is
created in is the folder the ISO pruner searches and the markers a VM is created
with are the markers deletion demands.

**Failure domains** (`inspect_domains`): which failure domains of a spread pool can
take VMs, and the words that say so. Each domain of a pool with `spreadPolicy: Spread`
is resolved like the pool's own placement (`VsphereService.preflight` with the
domain's cluster, storage and network), and every domain that fails is named with its
problems, so the pool's `VsphereReady` condition can say `FailureDomainUnusable`
instead of skipping a domain silently. The same check serves `agentforge check`. The
inventory read that checks a domain also gives each usable domain's free storage
(`VsphereService.inspect_storage`), which a spread pool's choice uses to break ties
between domains holding as many of its VMs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentforge import vsphere
from agentforge.api.pool import FailureDomain, VsphereAgentPool
from agentforge.vsphere.vm import build_specs as specs


class UnsupportedSpec(ValueError):
    """A spec value the vSphere layer cannot express (names the field and the fix)."""


def placement(pool: VsphereAgentPool) -> vsphere.Placement:
    v = pool.spec.vsphere
    return vsphere.Placement(
        datacenter=v.datacenter,
        resource_pool=v.resource_pool,
        folder=pool.effective_folder(),
        network=v.network,
        datastore_cluster=v.datastore_cluster,
        iso_datastore=v.iso_datastore,
    )


def domain_placement(
    pool: VsphereAgentPool, domain: FailureDomain, *, host: str | None = None
) -> vsphere.Placement:
    """The pool's placement with a failure domain's cluster, storage and network, on
    `host` of its cluster when one was chosen (the folder stays the pool's: ISO pruning,
    adoption and orphan clean-up read that one folder)."""
    return dataclasses.replace(
        placement(pool),
        resource_pool=domain.resource_pool(),
        datastore_cluster=domain.datastore_cluster or "",
        datastore=domain.datastore or "",
        network=domain.network or pool.spec.vsphere.network,
        host=f"{domain.compute_cluster.strip('/')}/{host}" if host else "",
    )


def iso_location(pool: VsphereAgentPool) -> vsphere.Location:
    return vsphere.Location(
        datacenter=pool.spec.vsphere.datacenter, datastore=pool.spec.vsphere.iso_datastore
    )


def iso_backing(pool: VsphereAgentPool, path: str) -> str:
    """`[isoDatastore] <path>`: the CD-ROM backing of a cached ISO's relative path."""
    return specs.datastore_path(pool.spec.vsphere.iso_datastore, path.strip("/"))


def hardware(pool: VsphereAgentPool) -> vsphere.Hardware:
    v, t = pool.spec.vsphere, pool.spec.template
    try:
        scsi = vsphere.ScsiType(v.scsi_type)
    except ValueError:
        raise UnsupportedSpec(
            f"spec.vsphere.scsiType {v.scsi_type!r} is not supported; use one of "
            + ", ".join(s.value for s in vsphere.ScsiType)
        ) from None
    try:
        nic = vsphere.NicType(v.network_adapter_type)
    except ValueError:
        raise UnsupportedSpec(
            f"spec.vsphere.networkAdapterType {v.network_adapter_type!r} is not supported; "
            "use one of " + ", ".join(n.value for n in vsphere.NicType)
        ) from None
    return vsphere.Hardware(
        cpus=t.num_cpus,
        memory_mib=t.memory_mib,
        disk_gib=t.disk_gib,
        eager_scrub=v.disk_eagerly_scrub,
        scsi_type=scsi,
        firmware=vsphere.Firmware(v.firmware.value),
        guest_id=v.guest_id,
        nic_type=nic,
    )


def markers(pool: VsphereAgentPool, *, vsphere_agent: str) -> vsphere.OwnershipMarkers:
    return vsphere.OwnershipMarkers(
        pool_namespace=pool.metadata.namespace,
        pool_name=pool.metadata.name,
        pool_uid=pool.metadata.uid,
        vsphere_agent=vsphere_agent,
    )


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


class StorageInspector(Protocol):
    """What `inspect_domains` calls: `VsphereService.inspect_storage` (the `vm`
    controller passes its `VcenterApi`, the `infra` controller and the check the service)."""

    async def inspect_storage(
        self, *, placement: vsphere.Placement
    ) -> tuple[list[vsphere.Problem], int]: ...


async def inspect_domains(service: StorageInspector, pool: VsphereAgentPool) -> DomainReport:
    """Resolve every failure domain in effect; a vCenter error counts against the domain."""
    usable: list[str] = []
    unusable: list[tuple[str, str]] = []
    free: dict[str, int] = {}
    for domain in pool.spread_domains():
        placement = domain_placement(pool, domain)
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
