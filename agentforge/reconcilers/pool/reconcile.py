"""The `pool` controller (key: VsphereAgentPool): plan a pool's capacity and apply the plan.

One reconcile, all reads from the informer cache (0002):

1. A deleted pool: delete its VsphereAgents (their `vm` controller finalizer removes
   VM and Agent per the cleanup policy), then drop `FINALIZER_POOL` once none is
   left. Otherwise make sure the finalizer is there.
2. Until the cache shows the VsphereAgents the last pass created or handed over, look
   again shortly (`expectations.Expectations`): a plan must not miss its own writes.
3. Build the planner's snapshot from the informers' records and run `planner.plan`.
4. Apply it, stopping at the first failure (`pool_apply`): Agent preparation patches,
   clean-up deletions, the VsphereAgents' `status.vm` phase fields and
   `status.handover`, hand-overs of VMs to other AgentMachines, and the VsphereAgents
   of AgentMachines no VM can serve.
5. Write the pool status once, only when it differs from the cache (and again only
   when it differs from the fresh object inside `update_status`): a pool in
   steady state costs no API request at all. Condition transitions are written at
   once; changes of counts, `ownedVMs` and the like at most every 10 s per pool
   (30 s while VMs are on their way or the pass changed the pool's objects), the last
   state of a burst always; a new pool's first write waits (10 s at
   most) for the `infra` controller's checks rather than say Ready=Unknown
   (`status_pacing`).
6. Events for changed plans, prepared Agents, clean-ups, hand-overs, creations and
   failures (the recorder aggregates repeats): one event per fact, so an Agent
   preparation is reported by `AgentsPrepared` and a clean-up by `CleanupStarted`, and
   both are left out of `Planned`; in a burst, preparations (and a scale-down's
   clean-ups) are reported together when it ends, at most 30 s late (`plan_reports`);
   capacity metrics; requeue at the planner's next deadline, a paced status write or
   held report. Everything else is event driven
   (`pool_watches`).

A 409 on the finalizer patch (the pool changed since the cache saw it) is expected:
it requeues quietly. Status writes retry their 409s inside `update_status`.

Read your writes: the versions the finalizer patch and status writes stored are
reported to the controller, which holds the pool's key until its cache shows a newer
one (rechecked every 0.2 s, `Controller.wrote`). A reconcile a moment after a status
write judged its change against the status it had just written over: counts moving
by one looked like a transition and were written at once, a second status write per
pool within a quarter second in every burst.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from prometheus_client import Gauge
from pydantic import ValidationError

from agentforge.api import kinds, names, rbac
from agentforge.api.conditions import ISOEjectedReason
from agentforge.api.pool import TemplateSpec, VsphereAgentPool
from agentforge.api.vm import VMPhase
from agentforge.kube import errors
from agentforge.kube.controller import Controller, Result, resource_version
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey, split_key
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.planning import planner, pool_conditions
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.pool import apply as pool_apply
from agentforge.reconcilers.pool import observed as pool_snapshot
from agentforge.reconcilers.pool import plan_reports, status_pacing
from agentforge.reconcilers.pool import status as status_
from agentforge.reconcilers.pool import watches as pool_watches
from agentforge.reconcilers.pool.apply import PoolEvent
from agentforge.reconcilers.pool.plan_reports import summary

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
CONTROLLER_NAME = "pool"
_WAKE_MARGIN = 1.0  # seconds past a deadline, so the planner sees it reached
_CACHE_WAIT = 0.2  # seconds: the cache shows our own writes within milliseconds

rbac.needs(kinds.VSPHERE_AGENT_POOL, "get", "patch", why="pool finalizer; fresh read for status")
rbac.needs(kinds.VSPHERE_AGENT_POOL, "update", subresource="status", why="pool status")
rbac.needs(kinds.VSPHERE_AGENT, "get", "delete", why="clean-up; fresh read for status")
rbac.needs(kinds.VSPHERE_AGENT, "update", subresource="status", why="VM phase in status.vm")
rbac.needs(kinds.AGENT, "patch", why="prepare discovered Agents (labels, role, hostname)")
rbac.needs(kinds.EVENT, "create", "patch", why="events about pools (aggregated)")


class PoolReconciler:
    def __init__(
        self,
        deps: Deps,
        *,
        status_interval: float = status_pacing.ROUTINE_STATUS_INTERVAL_S,
        status_burst_interval: float = status_pacing.BURST_STATUS_INTERVAL_S,
        first_status_quiet: float = status_pacing.FIRST_STATUS_QUIET_S,
    ) -> None:
        self._deps = deps
        self._client = deps.client
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)
        self._source = pool_snapshot.SnapshotSource(deps)
        self._applier = pool_apply.PlanApplier(deps, self._source, self._event)
        self._pacer = status_pacing.StatusPacer(
            interval=status_interval,
            burst_interval=status_burst_interval,
            first_quiet=first_status_quiet,
        )
        self._planned = plan_reports.PlannedReports()
        self._prepared = plan_reports.BurstReports()
        self._cleaned = plan_reports.BurstReports()
        self._wrote: Callable[[ObjectKey, str], None] | None = None

    def bind(self, wrote: Callable[[ObjectKey, str], None]) -> None:
        """Report the versions this reconciler's writes of the pool stored (the
        controller's read-your-writes guard, `Controller.wrote`): a reconcile soon after
        a status write must not judge its change from the cached status it wrote over,
        where every routine change looked like a transition and was written at once."""
        self._wrote = wrote

    def _saw(self, pool: VsphereAgentPool, stored: JsonObj | None) -> None:
        version = resource_version(stored)
        if self._wrote is not None and version:
            self._wrote(ObjectKey(f"{pool.metadata.namespace}/{pool.metadata.name}"), version)

    # --- the reconcile ---------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Result | None:
        namespace, name = split_key(key)
        obj = self._pools.get_by_key(key)
        if obj is None:
            forget_metrics(namespace=namespace or "", pool=name)
            self._pacer.forget(key)
            self._planned.forget(key)
            self._prepared.forget(key)
            self._cleaned.forget(key)
            return None
        pool = records.record(self._pools, key, VsphereAgentPool)
        if pool is None:
            exc = self._pools.rejection(key)
            why = (
                f"{exc.error_count()} errors, first: {exc.errors()[0]['msg']}"
                if isinstance(exc, ValidationError)
                else str(exc)
            )
            await self._deps.events.record(
                obj,
                type=EventType.WARNING,
                reason=PoolEvent.INVALID_POOL,
                message=f"VsphereAgentPool {key} cannot be read ({why}); fix its spec",
            )
            return None
        now = self._deps.now()
        if pool.metadata.deleting:
            return await self._finalize(pool, obj, now=now)
        if names.FINALIZER_POOL not in pool.metadata.finalizers and not await self._add_finalizer(
            pool
        ):
            return Result(requeue=True)
        if self._applier.expectations.pending(key, self._vsphere_agents, namespace or ""):
            return Result(requeue_after=_CACHE_WAIT)
        plan = planner.plan(self._source.snapshot(pool, now=now))
        failure: str | None = None
        forbidden = False
        owned: list[JsonObj] = []
        requeue = False
        prepared: list[str] = []
        cleaned: list[str] = []
        try:
            applied = await self._applier.apply(key, pool, obj, plan, prepared, cleaned=cleaned)
            owned, requeue = applied.owned, applied.requeue
        except pool_apply.StepFailed as exc:
            failure, forbidden = str(exc), exc.forbidden
        desired = status_.desired_from_plan(
            plan,
            generation=pool.metadata.generation,
            owned_vms=owned if failure is None else self._cached_owned(obj),
            ready=pool_conditions.failed(message=failure, forbidden=forbidden) if failure else None,
        )
        change = status_.pool_change(obj.get("status"), desired, now=now)
        more_coming = _more_coming(plan, owned)
        paced = self._pacer.delay(key, change, now=now, busy=more_coming or _acted(plan))
        if (
            paced is None
            and change is not status_.Change.NONE
            and status_.awaits_first_checks(obj.get("status"), desired)
        ):
            paced = self._pacer.first_delay(pool.metadata.creation_timestamp, now=now)
        if change is not status_.Change.NONE and paced is None:
            await self._write_status(pool, obj, desired, now=now)
        await self._report(key, obj, plan, failure, now=now)
        reported, held_for = self._prepared.due(
            key, prepared, now=now, at_once=bool(failure), more_coming=more_coming
        )
        if reported:
            approval = ", approval" if pool.spec.agent.approve else ""
            await self._event(
                obj,
                PoolEvent.AGENTS_PREPARED,
                f"prepared {len(reported)} Agent(s) for their VMs (pool labels, role, "
                f"hostname{approval}): {summary(reported)}",
            )
        started, cleanup_held_for = self._cleaned.due(
            key, cleaned, now=now, at_once=bool(failure), more_coming=bool(plan.unlabels)
        )
        if started:
            await self._event(
                obj,
                PoolEvent.CLEANUP_STARTED,
                f"deleting {len(started)} VsphereAgent(s) (cleanupPolicy Delete; their VMs "
                f"and unbound Agents follow): {summary(started)}",
            )
        record_capacity(
            namespace=pool.metadata.namespace,
            pool=pool.metadata.name,
            counts=plan.counts,
            template=pool.spec.template,
        )
        record_iso_ejections(
            namespace=pool.metadata.namespace, pool=pool.metadata.name, counts=plan.iso_ejections
        )
        record_spares(
            namespace=pool.metadata.namespace,
            pool=pool.metadata.name,
            wanted=plan.spares.wanted,
            ready=plan.spares.ready,
            creating=plan.spares.creating,
        )
        if failure is not None or requeue:
            return Result(requeue=True)
        afters = [t for t in (paced, held_for, cleanup_held_for) if t is not None]
        if plan.wake_at is not None:
            afters.append((plan.wake_at - now).total_seconds() + _WAKE_MARGIN)
        return Result(requeue_after=min(afters)) if afters else None

    def _cached_owned(self, pool_obj: JsonObj) -> list[JsonObj]:
        return list((pool_obj.get("status") or {}).get("ownedVMs") or [])

    async def _write_status(
        self,
        pool: VsphereAgentPool,
        pool_obj: JsonObj,
        desired: status_.DesiredPoolStatus,
        *,
        now: datetime,
    ) -> None:
        if not status_.pool_would_change(pool_obj.get("status"), desired, now=now):
            return
        key = ObjectKey(f"{pool.metadata.namespace}/{pool.metadata.name}")
        self._pacer.wrote(key, now=now)

        def mutate(fresh: JsonObj) -> JsonObj | None:
            status = fresh.setdefault("status", {})
            return fresh if status_.apply_pool(status, desired, now=now) else None

        try:
            stored = await self._client.update_status(
                kinds.VSPHERE_AGENT_POOL,
                namespace=pool.metadata.namespace,
                name=pool.metadata.name,
                mutate=mutate,
            )
        except errors.NotFound:
            return
        self._saw(pool, stored)

    # --- finalizer ---------------------------------------------------------------------

    async def _add_finalizer(self, pool: VsphereAgentPool) -> bool:
        """True once the finalizer is on; False to look again (a 409: retried quietly)."""
        finalizers = [*pool.metadata.finalizers, names.FINALIZER_POOL]
        return await self._set_finalizers(pool, finalizers)

    async def _set_finalizers(self, pool: VsphereAgentPool, finalizers: list[str]) -> bool:
        """Patch the finalizers; False when the pool changed since the cache saw it.

        The resourceVersion makes the merge patch conditional: a finalizer someone
        added meanwhile is never dropped. A 409 is expected (the `iso` controller and
        this one write the pool's status, which moves its resourceVersion): the caller
        requeues and decides again from the fresh cache, logged at debug level only.
        """
        patch = {
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": pool.metadata.resource_version,
            }
        }
        try:
            stored = await self._client.patch_merge(
                kinds.VSPHERE_AGENT_POOL,
                namespace=pool.metadata.namespace,
                name=pool.metadata.name,
                patch=patch,
            )
        except errors.NotFound:
            return True
        except errors.Conflict as exc:
            log.debug(
                "pool %s/%s changed since the cache saw it (%s); finalizers retried",
                pool.metadata.namespace,
                pool.metadata.name,
                exc,
            )
            return False
        self._saw(pool, stored)
        return True

    async def _finalize(
        self, pool: VsphereAgentPool, pool_obj: JsonObj, *, now: datetime
    ) -> Result | None:
        namespace, name = pool.metadata.namespace, pool.metadata.name
        remaining = self._vsphere_agents.by_index(
            indexes.VSPHERE_AGENTS_BY_POOL, indexes.namespaced_key(namespace, name)
        )
        started: list[str] = []
        for va in remaining:
            meta = va["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            if await self._applier.step(
                f"delete VsphereAgent {namespace}/{meta['name']}",
                self._client.delete(
                    kinds.VSPHERE_AGENT, namespace=namespace, name=meta["name"], uid=meta.get("uid")
                ),
            ):
                started.append(meta["name"])
        if started:
            await self._event(
                pool_obj,
                PoolEvent.CLEANUP_STARTED,
                f"pool deleted: deleting {len(started)} VsphereAgent(s) "
                f"(cleanupPolicy {pool.spec.cleanup_policy.value}): {summary(started)}",
            )
        if remaining:
            desired = status_.DesiredPoolStatus(
                generation=pool.metadata.generation,
                fields={},
                conditions=(),
                ready=pool_conditions.deleting(remaining=len(remaining)),
            )
            await self._write_status(pool, pool_obj, desired, now=now)
            return None
        if names.FINALIZER_POOL in pool.metadata.finalizers:
            kept = [f for f in pool.metadata.finalizers if f != names.FINALIZER_POOL]
            if not await self._set_finalizers(pool, kept):
                return Result(requeue=True)
            await self._event(
                pool_obj, PoolEvent.FINALIZED, "every VsphereAgent is gone; finalizer removed"
            )
        forget_metrics(namespace=namespace, pool=name)
        return None

    # --- reporting ---------------------------------------------------------------------

    async def _event(
        self, pool_obj: JsonObj, reason: PoolEvent, message: str, warning: bool = False
    ) -> None:
        await self._deps.events.record(
            pool_obj,
            type=EventType.WARNING if warning else EventType.NORMAL,
            reason=reason,
            message=message,
        )

    async def _report(
        self,
        key: ObjectKey,
        pool_obj: JsonObj,
        plan: planner.Plan,
        failure: str | None,
        *,
        now: datetime,
    ) -> None:
        if failure is not None:
            await self._event(
                pool_obj, PoolEvent.APPLY_FAILED, f"VsphereAgentPool {key}: {failure}", warning=True
            )
        message = self._planned.message(key, plan.actions, pool_obj.get("status"), now=now)
        if message is not None:
            await self._event(pool_obj, PoolEvent.PLANNED, message)


def _acted(plan: planner.Plan) -> bool:
    """The plan changed the pool's objects (Agents prepared or unlabelled, VsphereAgents
    created, handed over or deleted): their watch events bring the next reconcile at
    once, and its plan (nothing to do, in the end) is what the status should say. The
    burst's last preparation wrote `PatchAgent` into `plannedActions` and the next
    reconcile `Noop`, a second write 10 s after the burst's end."""
    return bool(
        plan.patches
        or plan.creations
        or plan.deletions
        or plan.handovers
        or plan.spare_creations
        or plan.unlabels
    )


def _more_coming(plan: planner.Plan, owned: list[JsonObj]) -> bool:
    """More of the pool's VMs are on their way to a prepared Agent: a VsphereAgent being
    created, or an owned VM still Provisioning (its Agent not discovered yet)."""
    return plan.counts.creating > 0 or any(vm.get("phase") == VMPhase.PROVISIONING for vm in owned)


def controller(
    deps: Deps,
    *,
    status_interval: float = status_pacing.ROUTINE_STATUS_INTERVAL_S,
    status_burst_interval: float = status_pacing.BURST_STATUS_INTERVAL_S,
    first_status_quiet: float = status_pacing.FIRST_STATUS_QUIET_S,
) -> Controller:
    """The `pool` controller over the app's informers (indexes installed here);
    `status_interval`, `status_burst_interval`, `first_status_quiet`: the pacing of
    routine status writes, while VMs are on their way too, and how long a new pool's
    first write waits for its checks (`status_pacing`)."""
    indexes.install(deps.informers)
    reconciler = PoolReconciler(
        deps,
        status_interval=status_interval,
        status_burst_interval=status_burst_interval,
        first_status_quiet=first_status_quiet,
    )
    built = Controller(
        name=CONTROLLER_NAME,
        reconcile=reconciler.reconcile,
        watches=pool_watches.watches(deps.informers),
        workers=deps.workers,
        stale_recheck=_CACHE_WAIT,
    )
    reconciler.bind(built.wrote)
    return built


# Pool capacity metrics (DOMAIN.md section 3), with the Go operator's names and labels.
#
# * `agent_forge_pool_capacity{namespace,pool,state}`: the pool's counts, one series
#   per `CapacityState`.
# * `agent_forge_pool_vm_cpu_cores`, `agent_forge_pool_vm_memory_bytes`,
#   `agent_forge_pool_vm_disk_bytes` `{namespace,pool}`: the hardware of each VM the
#   pool creates (`spec.template`), so capacity in VMs converts to cores and bytes.
# * `agent_forge_pool_iso_ejections{namespace,pool,reason}`: the pool's VsphereAgents
#   per ISOEjected reason (`status.isoEjections`), one series per reason.
# * `agent_forge_pool_spares{namespace,pool,state}`: warm spares (`status.spares`),
#   `state` one of `wanted`, `ready`, `creating`.
#
# A deleted pool's series are removed (`forget_metrics`), so dashboards never show a pool
# that no longer exists.

MIB: Final = 1024**2
GIB: Final = 1024**3

POOL_CAPACITY: Final = Gauge(
    "agent_forge_pool_capacity",
    "Observed VsphereAgentPool capacity by pool and state.",
    ["namespace", "pool", "state"],
)
POOL_VM_CPU_CORES: Final = Gauge(
    "agent_forge_pool_vm_cpu_cores",
    "Virtual CPUs of each VM the pool creates (spec.template.numCPUs).",
    ["namespace", "pool"],
)
POOL_VM_MEMORY_BYTES: Final = Gauge(
    "agent_forge_pool_vm_memory_bytes",
    "Memory of each VM the pool creates (spec.template.memoryMiB), in bytes.",
    ["namespace", "pool"],
)
POOL_VM_DISK_BYTES: Final = Gauge(
    "agent_forge_pool_vm_disk_bytes",
    "Primary disk of each VM the pool creates (spec.template.diskGiB), in bytes.",
    ["namespace", "pool"],
)

POOL_ISO_EJECTIONS: Final = Gauge(
    "agent_forge_pool_iso_ejections",
    "VsphereAgents of the pool per reason of their ISOEjected condition.",
    ["namespace", "pool", "reason"],
)


POOL_SPARES: Final = Gauge(
    "agent_forge_pool_spares",
    "Warm spare VMs of the pool (spec.spares): wanted, ready, and being made.",
    ["namespace", "pool", "state"],
)
SPARE_STATES: Final = ("wanted", "ready", "creating")


class CapacityState(StrEnum):
    """Values of the `state` label of `agent_forge_pool_capacity`."""

    DESIRED = "desired"
    AGENT_MACHINES = "agent_machines"
    WAITING_AGENT_MACHINES = "waiting_agent_machines"
    UNREADY_AGENT_MACHINES = "unready_agent_machines"
    WITHOUT_AGENT = "without_agent"
    MATCHING_AGENTS = "matching_agents"
    BOUND_AGENTS = "bound_agents"
    AVAILABLE_AGENTS = "available_agents"
    PENDING_OWNED_VMS = "pending_owned_vms"
    DEMAND_DEFICIT = "demand_deficit"


def _values(counts: Counts) -> dict[CapacityState, int]:
    return {
        CapacityState.DESIRED: counts.desired_replicas,
        CapacityState.AGENT_MACHINES: counts.agent_machines,
        CapacityState.WAITING_AGENT_MACHINES: counts.waiting_agent_machines,
        CapacityState.UNREADY_AGENT_MACHINES: counts.unready_agent_machines,
        CapacityState.WITHOUT_AGENT: counts.agent_machines_without_agent,
        CapacityState.MATCHING_AGENTS: counts.matching_agents,
        CapacityState.BOUND_AGENTS: counts.bound_agents,
        CapacityState.AVAILABLE_AGENTS: counts.available_agents,
        CapacityState.PENDING_OWNED_VMS: counts.observed_pending,
        CapacityState.DEMAND_DEFICIT: counts.observed_deficit,
    }


def record_capacity(*, namespace: str, pool: str, counts: Counts, template: TemplateSpec) -> None:
    """Set every series of one pool."""
    for state, value in _values(counts).items():
        POOL_CAPACITY.labels(namespace, pool, state.value).set(value)
    POOL_VM_CPU_CORES.labels(namespace, pool).set(template.num_cpus)
    POOL_VM_MEMORY_BYTES.labels(namespace, pool).set(template.memory_mib * MIB)
    POOL_VM_DISK_BYTES.labels(namespace, pool).set(template.disk_gib * GIB)


def record_iso_ejections(
    *, namespace: str, pool: str, counts: Mapping[ISOEjectedReason, int]
) -> None:
    """Set one series per ISOEjected reason (zero for reasons no VsphereAgent reports)."""
    for reason in ISOEjectedReason:
        POOL_ISO_EJECTIONS.labels(namespace, pool, reason.value).set(counts.get(reason, 0))


def record_spares(*, namespace: str, pool: str, wanted: int, ready: int, creating: int) -> None:
    for spare_state, value in zip(SPARE_STATES, (wanted, ready, creating), strict=True):
        POOL_SPARES.labels(namespace, pool, spare_state).set(value)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        return


def forget_metrics(*, namespace: str, pool: str) -> None:
    """Remove every series of a deleted pool (a no-op for one never recorded)."""
    for state in CapacityState:
        _remove(POOL_CAPACITY, namespace, pool, state.value)
    for gauge in (POOL_VM_CPU_CORES, POOL_VM_MEMORY_BYTES, POOL_VM_DISK_BYTES):
        _remove(gauge, namespace, pool)
    for reason in ISOEjectedReason:
        _remove(POOL_ISO_EJECTIONS, namespace, pool, reason.value)
    for spare_state in SPARE_STATES:
        _remove(POOL_SPARES, namespace, pool, spare_state)
