"""Pruning cached ISOs: delete what is beyond retention and provably unused, nothing else.

"Unused" is asked of vSphere, never read from history: the CD-ROM backings of every
VM vCenter lists on the ISO datastore (its `vm` property counts mounted ISOs), of
every VM in the pool's folder (VMs that outlived their VsphereAgent under Retain
live there) and of every VM the pool's VsphereAgents recorded by BIOS UUID; plus the
ISO path of every in-flight creation record (the VM may not exist yet). If any of
these questions fails, nothing is deleted (an unanswered question is not "nobody").
Listing and asking happen only when the plan without usage data would delete
something, so a steady pool costs no extra calls.

Temporary uploads a killed process left under the pool's prefix
(`<prefix>/.upload-*.iso`) are deleted too once their last write is older than
`stale_upload_age` (see `iso_cache` and `IsoLimits.stale_upload_age` for why no
running upload, of this replica or another, can be that old); nothing outside the
prefix is ever a candidate.

Every deletion and every file kept because it is attached is counted in
`agent_forge_iso_operations_total{operation="prune"}` (`success`, `already_gone`,
`in_use`, `stale_upload` for a temporary upload removed, or the error class), for
pools with or without ejection alike.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agentforge import vsphere
from agentforge.api.pool import ISOHistoryEntry, ISOStatus, VsphereAgentPool
from agentforge.api.vsphereagent import VsphereAgent
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.infra import iso_cache
from agentforge.vsphere import metrics

__all__ = ["PruneError", "PruneOutcome", "needs_prune", "prune"]


class PruneError(Exception):
    """Usage could not be established; nothing was deleted."""


@dataclass(frozen=True, slots=True)
class PruneOutcome:
    history: tuple[ISOHistoryEntry, ...]
    deleted: tuple[str, ...] = ()
    in_use: tuple[str, ...] = ()
    failures: tuple[str, ...] = field(default=())
    """One message per file whose deletion failed (kept in history, retried later)."""
    stale_uploads: tuple[str, ...] = ()
    """Temporary uploads left by a killed process that were deleted (or already gone)."""


def needs_prune(*, before: ISOStatus, after: ISOStatus, retain: int) -> bool:
    """Only a changed ISO or history beyond retention can leave something to prune."""
    return before.path != after.path or len(after.history) > max(retain, 1)


async def prune(
    *,
    service: vsphere.VsphereService,
    pool: VsphereAgentPool,
    status: ISOStatus,
    agents: Iterable[VsphereAgent],
    kept_elsewhere: Collection[str],
    now: datetime,
    stale_upload_age: timedelta = iso_cache.DEFAULT_STALE_UPLOAD_AGE,
) -> PruneOutcome:
    """Delete unused ISOs beyond retention and stale temporary uploads; raises
    `PruneError` when usage is unknown (then nothing is deleted)."""
    where = pool_specs.iso_location(pool)
    prefix = pool.effective_path_prefix()
    retain = pool.spec.iso.retain_versions
    agents = list(agents)
    try:
        listed = await service.list_files(where=where, prefix=prefix)
    except vsphere.VsphereError as exc:
        metrics.iso_op("prune", metrics.result_of(exc))
        raise PruneError(f"listing {where.path(prefix)} failed: {exc}") from exc
    files = [iso_cache.StoredFile(path=f.path, size=f.size, modified=f.modified) for f in listed]
    draft = iso_cache.plan_prune(
        history=status.history,
        retain=retain,
        prefix=prefix,
        files=files,
        in_use=(),
        kept_elsewhere=kept_elsewhere,
        now=now,
        stale_upload_age=stale_upload_age,
    )
    if not draft.delete and not draft.stale_uploads:
        return PruneOutcome(history=draft.history)
    in_use = await _attached(service=service, pool=pool, agents=agents)
    plan = iso_cache.plan_prune(
        history=status.history,
        retain=retain,
        prefix=prefix,
        files=files,
        in_use=in_use,
        kept_elsewhere=kept_elsewhere,
        now=now,
        stale_upload_age=stale_upload_age,
    )
    for _ in plan.in_use:
        metrics.iso_op("prune", "in_use")
    history = list(plan.history)
    deleted: list[str] = []
    failures: list[str] = []
    by_path = {e.path: e for e in status.history}
    for path in plan.delete:
        try:
            gone = await service.delete_file(where=where, path=path)
        except vsphere.VsphereError as exc:
            metrics.iso_op("prune", metrics.result_of(exc))
            failures.append(f"{where.path(path)}: {exc}")
            if path in by_path:
                history.append(by_path[path])
            continue
        metrics.iso_op("prune", "success" if gone else "already_gone")
        deleted.append(path)
    stale: list[str] = []
    for path in plan.stale_uploads:
        try:
            gone = await service.delete_file(where=where, path=path)
        except vsphere.VsphereError as exc:
            metrics.iso_op("prune", metrics.result_of(exc))
            failures.append(f"{where.path(path)}: {exc}")
            continue
        metrics.iso_op("prune", "stale_upload" if gone else "already_gone")
        stale.append(path)
    return PruneOutcome(
        history=tuple(history),
        deleted=tuple(deleted),
        in_use=plan.in_use,
        failures=tuple(failures),
        stale_uploads=tuple(stale),
    )


async def _attached(
    *, service: vsphere.VsphereService, pool: VsphereAgentPool, agents: list[VsphereAgent]
) -> set[str]:
    """Relative paths on the ISO datastore that some VM holds or a creation recorded."""
    datastore = pool.spec.vsphere.iso_datastore
    held: set[str] = set()
    uuids: list[str] = []
    for agent in agents:
        record = agent.status.creation
        if record is not None:
            uuids.append(record.bios_uuid)
            if record.iso_path:
                path = iso_cache.relative_path(record.iso_path, datastore=datastore)
                if path:
                    held.add(path)
        if agent.status.vm and agent.status.vm.bios_uuid:
            uuids.append(agent.status.vm.bios_uuid)
    try:
        found = list(await service.vms_using_datastore(where=pool_specs.iso_location(pool)))
        found += await service.vms_in_folder(placement=pool_specs.placement(pool))
        if uuids:
            by_uuid = await service.vms_by_uuid(
                datacenter=pool.spec.vsphere.datacenter, bios_uuids=sorted(set(uuids))
            )
            found += by_uuid.values()
    except vsphere.VsphereError as exc:
        metrics.iso_op("prune", metrics.result_of(exc))
        raise PruneError(f"could not establish which VMs hold the cached ISOs: {exc}") from exc
    for vm in found:
        for cdrom in vm.cdroms:
            if cdrom.kind is vsphere.MediumKind.ISO and cdrom.backing_file:
                path = iso_cache.relative_path(cdrom.backing_file, datastore=datastore)
                if path:
                    held.add(path)
    return held
