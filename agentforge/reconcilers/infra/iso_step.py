"""The `infra` controller's ISO step: check the InfraEnv image when due, cache it, prune.

Split from `infra` so each module stays one concern: this one turns a pool, its
InfraEnv and the cache rules of `iso_cache` into an `Outcome` (conditions, the new
`status.iso`, events, the next wake-up); `infra` runs it and writes status once.

Pruning runs after a check when the ISO changed or history is beyond retention, and
also when a sweep for stale temporary uploads is due (`iso_cache.sweep_due`, from the
time of this process's last sweep of the pool, kept in `IsoInputs.swept`): a killed
upload leaves its `.upload-*.iso` behind whether or not anything else changes.

A check the image service refused backs off per source URL (`SourceBackoff`, after
`iso_cache.Refusal`): every pool caching that URL waits for the same next try, the
condition and the Warning event say when it is, and a reconcile in between (an
InfraEnv update, another pool) shows the refusal without fetching. While a refusal
is on record, one pool at a time tries the URL and the others wait for its outcome,
so a refused image is fetched once per try, not once per pool. Failures that are not
the source's (the datastore, vCenter) and a certificate our CA bundle does not trust
(`IsoSourceUntrusted`: no request was sent; the bundle file is read again at each
try, and nothing else tells of its change) are retried per pool with the
controller's backoff, as before.

The InfraEnv's URL carries the image service's key; it is shown only in its
redacted form (`redaction.redact_url`, in `status.iso.url` and in every message,
which `vsphere` builds from the same form), and conditions pass `redaction.redact`
as built, so what is compared with status is what is written. A status an older
version wrote with another form of the URL is corrected without a check
(`iso_cache.shown_status`).

**Pruning cached ISOs** (`prune`): delete what is beyond retention and provably unused,
nothing else. "Unused" is asked of vSphere, never read from history: the CD-ROM backings of every
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

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agentforge import redaction, vsphere
from agentforge.api import fields, names
from agentforge.api.conditions import PoolConditionType, PoolReason
from agentforge.api.pool import ISOHistoryEntry, ISOStatus, VsphereAgentPool
from agentforge.api.vsphereagent import VsphereAgent
from agentforge.kube.events import EventType
from agentforge.kube.informer import Informer
from agentforge.kube.store import key_for
from agentforge.reconcilers.common import indexes, pool_specs, records
from agentforge.reconcilers.common.event_reasons import InfraEvent
from agentforge.reconcilers.infra import iso_cache
from agentforge.reconcilers.planning.snapshot import InfraEnvFacts
from agentforge.vsphere import metrics


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


__all__ = ["Cond", "IsoInputs", "Outcome", "SourceBackoff", "check_iso"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Cond:
    type: PoolConditionType
    ok: bool
    reason: PoolReason
    message: str


@dataclass(slots=True)
class Outcome:
    """What one reconcile decided: conditions, the new `status.iso`, events, wake-ups."""

    conditions: list[Cond] = field(default_factory=list)
    iso: ISOStatus | None = None
    events: list[tuple[EventType, InfraEvent, str]] = field(default_factory=list)
    wake_at: list[datetime] = field(default_factory=list)
    retry: bool = False

    def condition(
        self, type_: PoolConditionType, *, ok: bool, reason: PoolReason, message: str
    ) -> None:
        self.conditions.append(Cond(type_, ok, reason, redaction.redact(message)))

    def event(self, type_: EventType, reason: InfraEvent, message: str) -> None:
        self.events.append((type_, reason, message))


@dataclass(slots=True)
class _Source:
    refusal: iso_cache.Refusal
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)


class SourceBackoff:
    """The refusals of each source URL in a row, shared by every pool that caches it
    (one per process: the infra controller's). Kept by the URL's digest, in memory:
    a restart tries each URL once more."""

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}

    def refusal(self, url: str) -> iso_cache.Refusal | None:
        found = self._sources.get(iso_cache.url_hash(url))
        return found.refusal if found is not None else None

    @contextlib.asynccontextmanager
    async def turn(self, url: str) -> AsyncIterator[None]:
        """While a refusal of `url` is on record, one try of it at a time."""
        found = self._sources.get(iso_cache.url_hash(url))
        if found is None:
            yield
            return
        async with found.turn:
            yield

    def refused(
        self, url: str, error: vsphere.IsoSourceError, *, now: datetime, token: str | None
    ) -> iso_cache.Refusal:
        """Record one more refusal of `url`; forget the URLs nobody tried for long."""
        for key in [k for k, v in self._sources.items() if v.refusal.expired(now=now)]:
            del self._sources[key]
        key = iso_cache.url_hash(url)
        found = self._sources.get(key)
        if found is None:
            refusal = iso_cache.Refusal.first(error, now=now, token=token)
            self._sources[key] = _Source(refusal=refusal)
            return refusal
        found.refusal = found.refusal.again(error, now=now, token=token)
        return found.refusal

    def succeeded(self, url: str) -> None:
        self._sources.pop(iso_cache.url_hash(url), None)


@dataclass(frozen=True, slots=True)
class IsoInputs:
    """The caches and settings the ISO step reads."""

    pools: Informer
    infra_envs: Informer
    agents: Informer
    limits: vsphere.IsoLimits | None = None
    """Overrides `access.limits` (tests)."""
    access: vsphere.IsoAccess = field(default_factory=vsphere.IsoAccess)
    """Trust, proxy and limits of downloads from the image service (the flags)."""
    swept: dict[str, datetime] = field(default_factory=dict)
    """When this process last looked for stale uploads of a pool (by `ns/name`)."""
    refusals: SourceBackoff = field(default_factory=SourceBackoff)
    """Refusals by source URL, shared by the pools caching it."""

    @property
    def effective_limits(self) -> vsphere.IsoLimits:
        return self.limits or self.access.limits

    @property
    def stale_upload_age(self) -> timedelta:
        return self.effective_limits.stale_upload_age

    def forget(self, key: str) -> None:
        self.swept.pop(key, None)


async def check_iso(
    pool: VsphereAgentPool,
    *,
    inputs: IsoInputs,
    service: vsphere.VsphereService,
    outcome: Outcome,
    now: datetime,
) -> None:
    ns, ref = pool.metadata.namespace, pool.spec.infra_env_ref.name
    infra_env = records.record(inputs.infra_envs, key_for(namespace=ns, name=ref), InfraEnvFacts)
    if infra_env is None:
        _waiting(
            outcome,
            InfraEvent.INFRA_ENV_NOT_FOUND,
            f"InfraEnv {ns}/{ref} not found: create it or fix spec.infraEnvRef.name",
        )
        return
    url = infra_env.iso_url
    if not url:
        _waiting(
            outcome,
            InfraEvent.ISO_URL_MISSING,
            f"InfraEnv {ns}/{ref} has no status.isoDownloadURL yet: wait for the Assisted "
            "Installer to create the discovery image (condition ImageCreated)",
        )
        return
    status = pool.status.iso
    interval = pool.effective_check_interval()
    prefix = pool.effective_path_prefix()
    token = pool.force_refresh_token()
    due = iso_cache.check_due(
        status, url=url, prefix=prefix, token=token, interval=interval, now=now
    )
    if due is None:
        outcome.iso = iso_cache.shown_status(status, url=url)  # an older version's form
        wake = iso_cache.next_check_at(status, interval=interval)
        if wake is not None:
            outcome.wake_at.append(wake)
        return
    where = pool_specs.iso_location(pool)
    limits = inputs.effective_limits
    refused = _Refused(pool, status, where=where, limits=limits)
    tried = token if token and token != status.force_refresh_token else None  # not applied yet
    try:
        source = inputs.access.source(url)
    except vsphere.IsoSourceError as exc:  # our CA bundle, not the source's answer
        _failed(outcome, exc, ns=ns, ref=ref, limits=limits)
        return
    async with inputs.refusals.turn(url):
        before = inputs.refusals.refusal(url)
        if before is not None and before.blocks(now=now, token=tried):
            refused.show(outcome, before, fresh=False)
            return
        log.info("checking the ISO of pool %s/%s: %s", ns, pool.metadata.name, due.value)
        try:
            result = await service.ensure_iso(
                source=source,
                where=where,
                prefix=prefix,
                previous=iso_cache.previous_record(status, url=url),
                limits=limits,
            )
        except vsphere.IsoSourceUntrusted as exc:  # our trust: retried, reading the bundle again
            _failed(outcome, exc, ns=ns, ref=ref, limits=limits)
            return
        except vsphere.IsoSourceError as exc:
            refusal = inputs.refusals.refused(url, exc, now=now, token=tried)
            refused.show(outcome, refusal, fresh=True)
            return
        except vsphere.VsphereError as exc:
            _failed(outcome, exc, ns=ns, ref=ref, limits=limits)
            return
        inputs.refusals.succeeded(url)
    updated = iso_cache.updated_status(status, result=result, url=url, token=token, now=now)
    message = f"ISO {where.path(result.path)} cached ({result.size} bytes)"
    reason = PoolReason.ISO_CACHED
    if not result.reused:
        outcome.event(
            EventType.NORMAL,
            InfraEvent.ISO_UPLOADED,
            f"uploaded the discovery ISO of InfraEnv {ns}/{ref} to {result.backing}",
        )
    key = f"{ns}/{pool.metadata.name}"
    sweep = iso_cache.sweep_due(inputs.swept.get(key), now=now, every=inputs.stale_upload_age)
    retain = pool.spec.iso.retain_versions
    if sweep or needs_prune(before=status, after=updated, retain=retain):
        updated, failure = await _prune(
            pool, inputs=inputs, service=service, status=updated, outcome=outcome, now=now
        )
        if failure:
            reason = PoolReason.ISO_PRUNE_FAILED
            message += f"; pruning old ISOs failed: {failure} (retried at the next check)"
            outcome.event(EventType.WARNING, InfraEvent.ISO_PRUNE_FAILED, failure)
    outcome.iso = updated
    outcome.condition(PoolConditionType.ISO_READY, ok=True, reason=reason, message=message)
    outcome.wake_at.append(now + interval)


async def _prune(
    pool: VsphereAgentPool,
    *,
    inputs: IsoInputs,
    service: vsphere.VsphereService,
    status: ISOStatus,
    outcome: Outcome,
    now: datetime,
) -> tuple[ISOStatus, str | None]:
    """Prune; returns `status` with the resulting history, and a failure text if any."""
    agents = [
        VsphereAgent.model_validate(a)
        for a in inputs.agents.by_index(
            indexes.VSPHERE_AGENTS_BY_POOL, f"{pool.metadata.namespace}/{pool.metadata.name}"
        )
    ]
    try:
        pruned = await prune(
            service=service,
            pool=pool,
            status=status,
            agents=agents,
            kept_elsewhere=_kept_by_other_pools(pool, inputs.pools),
            now=now,
            stale_upload_age=inputs.stale_upload_age,
        )
    except PruneError as exc:
        return status, str(exc)
    inputs.swept[f"{pool.metadata.namespace}/{pool.metadata.name}"] = now
    where = pool_specs.iso_location(pool)
    if pruned.deleted:
        outcome.event(
            EventType.NORMAL,
            InfraEvent.ISO_PRUNED,
            "deleted unused ISOs beyond retention: "
            + ", ".join(where.path(p) for p in pruned.deleted),
        )
    if pruned.stale_uploads:
        outcome.event(
            EventType.NORMAL,
            InfraEvent.ISO_PRUNED,
            "deleted temporary uploads an interrupted upload left behind: "
            + ", ".join(where.path(p) for p in pruned.stale_uploads),
        )
    pruned_status = status.model_copy(update={"history": list(pruned.history)})
    return pruned_status, "; ".join(pruned.failures) or None


def _kept_by_other_pools(pool: VsphereAgentPool, pools: Informer) -> set[str]:
    """Paths other pools caching into the same datastore folder still name."""
    prefix = pool.effective_path_prefix()
    kept: set[str] = set()
    for key in pools.keys(namespace=None):  # every namespace
        other = records.record(pools, key, VsphereAgentPool)
        if other is None or other.metadata.uid == pool.metadata.uid:
            continue
        same = (
            other.spec.vsphere.iso_datastore == pool.spec.vsphere.iso_datastore
            and other.spec.vsphere.datacenter == pool.spec.vsphere.datacenter
            and other.effective_path_prefix() == prefix
        )
        if same:
            kept |= {e.path for e in other.status.iso.history}
            if other.status.iso.path:
                kept.add(other.status.iso.path)
    return kept


MAX_SIZE_FLAG = "--iso-max-size"
CA_BUNDLE_FLAG = "--iso-ca-bundle"
TRUSTED_CA_CONFIGMAP = "agent-forge-trusted-ca"


def _failed(
    outcome: Outcome, exc: vsphere.VsphereError, *, ns: str, ref: str, limits: vsphere.IsoLimits
) -> None:
    """ISOReady=False for a failure that is not the source's: retried with the
    controller's backoff."""
    reason, message = _failure(exc, ns=ns, ref=ref, limits=limits)
    outcome.condition(PoolConditionType.ISO_READY, ok=False, reason=reason, message=message)
    outcome.event(EventType.WARNING, InfraEvent.ISO_CACHE_FAILED, message)
    outcome.retry = True


@dataclass(frozen=True, slots=True)
class _Refused:
    """ISOReady=False for a refusal of the source, saying when the next try is."""

    pool: VsphereAgentPool
    status: ISOStatus
    where: vsphere.Location
    limits: vsphere.IsoLimits

    def show(self, outcome: Outcome, refusal: iso_cache.Refusal, *, fresh: bool) -> None:
        """`fresh`: this reconcile's own try was refused; else one in force (another
        pool's try, or an earlier one), announced only to a pool that does not show it."""
        ns, ref = self.pool.metadata.namespace, self.pool.spec.infra_env_ref.name
        error = refusal.error
        if isinstance(error, vsphere.IsoInvalid):
            reason, event = PoolReason.ISO_INVALID, InfraEvent.ISO_INVALID
            message = _invalid(
                outcome,
                self.status,
                where=self.where,
                infra_env=f"{ns}/{ref}",
                error=error,
                limits=self.limits,
            )
        else:
            reason, message = _failure(error, ns=ns, ref=ref, limits=self.limits)
            event = InfraEvent.ISO_CACHE_FAILED
        message += (
            f"; the next try of this URL is at {fields.format_time(refusal.next_try)}, after "
            f"{refusal.failures} refused in a row (a new {names.ANNOTATION_FORCE_ISO_REFRESH} "
            "annotation on the pool tries at once)"
        )
        outcome.condition(PoolConditionType.ISO_READY, ok=False, reason=reason, message=message)
        if fresh or not _shows(self.pool, outcome.conditions[-1]):
            outcome.event(EventType.WARNING, event, message)
        outcome.wake_at.append(refusal.next_try)


def _shows(pool: VsphereAgentPool, cond: Cond) -> bool:
    """Does the pool's status show `cond` already (an event would only repeat it)?"""
    shown = next((c for c in pool.status.conditions if c.type == cond.type), None)
    return shown is not None and (shown.reason, shown.message) == (cond.reason, cond.message)


def _failure(
    exc: vsphere.VsphereError, *, ns: str, ref: str, limits: vsphere.IsoLimits
) -> tuple[PoolReason, str]:
    """The ISOReady reason and message of a failed check, naming the fix."""
    reason, fix = _fix(exc, ns=ns, ref=ref, limits=limits)
    return reason, f"caching the discovery ISO of InfraEnv {ns}/{ref} failed: {exc} ({fix})"


def _fix(
    exc: vsphere.VsphereError, *, ns: str, ref: str, limits: vsphere.IsoLimits
) -> tuple[PoolReason, str]:
    """The ISOReady reason of a failed check and the fix an admin applies."""
    if isinstance(exc, vsphere.SizeLimitExceeded):
        return PoolReason.ISO_TOO_LARGE, (
            f"the limit is {limits.max_bytes} bytes, set by {MAX_SIZE_FLAG}: raise "
            f"{MAX_SIZE_FLAG} if the image is genuine, else check InfraEnv {ns}/{ref}"
        )
    if isinstance(exc, vsphere.IsoSourceUntrusted):
        return PoolReason.ISO_SOURCE_UNTRUSTED, (
            "add the CA of the image service's certificate to the PEM file of "
            f"{CA_BUNDLE_FLAG}: key ca-bundle.crt of ConfigMap {TRUSTED_CA_CONFIGMAP}, which "
            "OpenShift fills with the cluster's trusted CAs (proxy/cluster spec.trustedCA)"
        )
    if isinstance(exc, vsphere.IsoRedirectRefused):
        return PoolReason.ISO_REDIRECT_REFUSED, (
            "serve the image over https, or make the InfraEnv's isoDownloadURL the final https URL"
        )
    if isinstance(exc, vsphere.IsoDownloadFailed):
        return PoolReason.ISO_CACHE_FAILED, "the image service may answer next time"
    if isinstance(exc, vsphere.IsoSourceError):
        return (
            PoolReason.ISO_CACHE_FAILED,
            f"check InfraEnv {ns}/{ref} and that its ISO URL answers",
        )
    return PoolReason.ISO_CACHE_FAILED, "it is retried with backoff"


def _invalid(
    outcome: Outcome,
    status: ISOStatus,
    *,
    where: vsphere.Location,
    infra_env: str,
    error: vsphere.IsoInvalid,
    limits: vsphere.IsoLimits,
) -> str:
    """The ISOInvalid message; the cached ISO stays in use, unless it is no image
    either (a file below the size floor, cached before images were checked)."""
    if not status.path:
        kept = "no ISO is cached yet, so no VM is created until it serves a bootable image"
    elif (status.size_bytes or 0) < limits.min_bytes:
        kept = (
            f"the ISO cached before, {where.path(status.path)} ({status.size_bytes or 0} bytes, "
            "cached before agent-forge checked images), is no boot image either and is no "
            "longer used: no VM is created until the URL serves a bootable image"
        )
        outcome.iso = status.model_copy(update={"path": None, "sha256": None, "size_bytes": None})
    else:
        kept = f"new VMs keep booting the ISO cached before, {where.path(status.path)}"
    return f"the discovery ISO of InfraEnv {infra_env} was not cached: {error} ({kept})"


def _waiting(outcome: Outcome, event_reason: InfraEvent, message: str) -> None:
    outcome.condition(
        PoolConditionType.ISO_READY,
        ok=False,
        reason=PoolReason.WAITING_FOR_INFRA_ENV,
        message=message,
    )
    outcome.event(EventType.WARNING, event_reason, message)
