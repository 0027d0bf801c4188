"""A pool's spec in the vSphere layer's terms: placement, hardware, ISO location, markers.

One translation used by the `infra` and `vm` controllers, so the folder a VM is
created in is the folder the ISO pruner searches and the markers a VM is created
with are the markers deletion demands. Also the cache indexes both controllers
share (`indexes` plus one of their own, registered idempotently).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.api.pool import FailureDomain, VsphereAgentPool
from agentforge.kube.informer import Informer
from agentforge.kube.store import IndexFunc, ObjectKey, key_for
from agentforge.ratelimit import BucketLimiter, ItemExponentialLimiter, MaxOfLimiter
from agentforge.reconcilers.common import indexes
from agentforge.vsphere.vm import build_specs as specs

INDEX_POOLS_BY_SECRET: Final = "agentforge.reconcilers/pools-by-credentials-secret"  # noqa: S105
"""Pools by `<secret namespace>/<secret name>` of their credentials."""


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


# --- shared cache indexes ----------------------------------------------------------


def _pools_by_secret(obj: dict[str, Any]) -> Iterable[str]:
    meta = obj.get("metadata") or {}
    ref = ((obj.get("spec") or {}).get("vsphere") or {}).get("credentialsSecretRef") or {}
    if not ref.get("name"):
        return ()
    return (f"{ref.get('namespace') or meta.get('namespace', '')}/{ref['name']}",)


def ensure_index(informer: Informer, name: str, fn: IndexFunc) -> None:
    """Add the index unless a controller built earlier added it already."""
    try:
        informer.add_index(name, fn)
    except ValueError:
        return


def install_indexes(informers: Mapping[kinds.Kind, Informer]) -> None:
    """The shared indexes (`indexes.install`) plus pools by credentials Secret."""
    indexes.install(informers)
    ensure_index(informers[kinds.VSPHERE_AGENT_POOL], INDEX_POOLS_BY_SECRET, _pools_by_secret)


def keys_of(objs: Iterable[dict[str, Any]]) -> list[ObjectKey]:
    out = []
    for obj in objs:
        meta = obj.get("metadata") or {}
        out.append(key_for(namespace=meta.get("namespace"), name=meta["name"]))
    return out


DEFAULT_RETRY_BASE: Final = 1.0


def retry_limiter(*, base: float = DEFAULT_RETRY_BASE) -> MaxOfLimiter[ObjectKey]:
    """Backoff for controllers whose retries reach vCenter or an image service: from
    `base` seconds (not client-go's 5 ms) doubling to 5 min, and 10 retries/s overall."""
    return MaxOfLimiter(
        ItemExponentialLimiter[ObjectKey](base=base, cap=300.0),
        BucketLimiter[ObjectKey](qps=10.0, burst=100),
    )
