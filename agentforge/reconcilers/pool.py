"""The `pool` controller (key: VsphereAgentPool): plan a pool's capacity and apply the plan.

One reconcile, all reads from the informer cache (0002):

1. A deleted pool: delete its VsphereAgents (their `vm` controller finalizer removes
   VM and Agent per the cleanup policy), then drop `FINALIZER_POOL` once none is
   left. Otherwise make sure the finalizer is there.
2. Build the planner's snapshot from memoised facts and run `planner.plan`.
3. Apply it, stopping at the first failure: Agent preparation patches (merge patches
   of the differing fields only), VsphereAgent deletions chosen for clean-up (with
   a UID precondition, so a re-created object of the same name is never hit), the
   VsphereAgents' `status.vm` phase fields.
4. Write the pool status once, only when it differs from the cache (and again only
   when it differs from the fresh object inside `update_status`): a pool in
   steady state costs no API request at all.
5. Events for changed plans, prepared Agents, clean-ups and failures (the recorder
   aggregates repeats): one event per fact, so an Agent preparation is reported by
   `AgentsPrepared` when applied and left out of `Planned`; capacity metrics; requeue
   at the planner's next deadline. Everything else is event driven (`pool_watches`).

A 409 on the finalizer patch (the pool changed since the cache saw it) is expected:
it requeues quietly. Status writes retry their 409s inside `update_status`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from agentforge.api import kinds, names, rbac
from agentforge.api.pool import PlannedActionType, VsphereAgentPool
from agentforge.kube import errors
from agentforge.kube.controller import Controller, Result
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey, split_key
from agentforge.reconcilers import (
    indexes,
    metrics,
    planner,
    pool_conditions,
    pool_snapshot,
    pool_watches,
)
from agentforge.reconcilers import pool_status as status_
from agentforge.reconcilers.deps import Deps

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
CONTROLLER_NAME = "pool"
_WAKE_MARGIN = 1.0  # seconds past a deadline, so the planner sees it reached

rbac.needs(kinds.VSPHERE_AGENT_POOL, "get", "patch", why="pool finalizer; fresh read for status")
rbac.needs(kinds.VSPHERE_AGENT_POOL, "update", subresource="status", why="pool status")
rbac.needs(kinds.VSPHERE_AGENT, "get", "delete", why="clean-up; fresh read for status")
rbac.needs(kinds.VSPHERE_AGENT, "update", subresource="status", why="VM phase in status.vm")
rbac.needs(kinds.AGENT, "patch", why="prepare discovered Agents (labels, role, hostname)")
rbac.needs(kinds.EVENT, "create", "patch", why="events about pools (aggregated)")


class PoolEvent(StrEnum):
    PLANNED = "Planned"
    AGENTS_PREPARED = "AgentsPrepared"
    CLEANUP_STARTED = "CleanupStarted"
    APPLY_FAILED = "ApplyFailed"
    INVALID_POOL = "InvalidPool"
    FINALIZED = "Finalized"


class _StepFailed(Exception):
    """One API call of the plan failed; the message names the object and the fix."""


def _hint(exc: errors.KubeError) -> str:
    if isinstance(exc, errors.Forbidden):
        return "grant the operator this permission (see config/rbac)"
    if isinstance(exc, errors.Invalid):
        return "the API server rejected it; check admission webhooks on that object"
    return "it is retried with backoff"


def _summary(items: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class PoolReconciler:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._client = deps.client
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)
        self._source = pool_snapshot.SnapshotSource(deps)

    # --- the reconcile ---------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Result | None:
        namespace, name = split_key(key)
        obj = self._pools.get_by_key(key)
        if obj is None:
            metrics.forget(namespace=namespace or "", pool=name)
            return None
        try:
            pool = VsphereAgentPool.model_validate(obj)
        except ValidationError as exc:
            await self._deps.events.record(
                obj,
                type=EventType.WARNING,
                reason=PoolEvent.INVALID_POOL,
                message=f"VsphereAgentPool {key} cannot be read ({exc.error_count()} errors, "
                f"first: {exc.errors()[0]['msg']}); fix its spec",
            )
            return None
        now = self._deps.now()
        if pool.metadata.deleting:
            return await self._finalize(pool, obj, now=now)
        if names.FINALIZER_POOL not in pool.metadata.finalizers and not await self._add_finalizer(
            pool
        ):
            return Result(requeue=True)
        plan = planner.plan(self._source.snapshot(pool, now=now))
        failure: str | None = None
        owned: list[JsonObj] = []
        try:
            owned = await self._apply(pool, obj, plan)
        except _StepFailed as exc:
            failure = str(exc)
        desired = status_.desired_from_plan(
            plan,
            generation=pool.metadata.generation,
            owned_vms=owned if failure is None else self._cached_owned(obj),
            ready=pool_conditions.failed(message=failure) if failure else None,
        )
        await self._write_status(pool, obj, desired, now=now)
        await self._report(pool, obj, plan, failure)
        metrics.record(
            namespace=pool.metadata.namespace,
            pool=pool.metadata.name,
            counts=plan.counts,
            template=pool.spec.template,
        )
        metrics.record_iso_ejections(
            namespace=pool.metadata.namespace, pool=pool.metadata.name, counts=plan.iso_ejections
        )
        if failure is not None:
            return Result(requeue=True)
        if plan.wake_at is not None:
            return Result(requeue_after=(plan.wake_at - now).total_seconds() + _WAKE_MARGIN)
        return None

    # --- applying the plan -------------------------------------------------------------

    async def _step(self, action: str, call: Any) -> bool:
        """Await one API call; False when its object is gone (nothing to do)."""
        try:
            await call
        except (errors.NotFound, errors.Conflict) as exc:
            if isinstance(exc, errors.NotFound) or "precondition" in exc.message.lower():
                return False
            raise _StepFailed(f"could not {action}: {exc}; {_hint(exc)}") from exc
        except errors.KubeError as exc:
            raise _StepFailed(f"could not {action}: {exc}; {_hint(exc)}") from exc
        return True

    async def _apply(
        self, pool: VsphereAgentPool, pool_obj: JsonObj, plan: planner.Plan
    ) -> list[JsonObj]:
        """Run the plan's API calls; return the `ownedVMs` entries of the result."""
        namespace = pool.metadata.namespace
        prepared: list[str] = []
        try:
            for patch in plan.patches:
                if await self._step(
                    f"patch Agent {namespace}/{patch.agent}",
                    self._client.patch_merge(
                        kinds.AGENT, namespace=namespace, name=patch.agent, patch=patch.patch
                    ),
                ):
                    prepared.append(f"{patch.agent} (VM {patch.vm})")
        finally:
            if prepared:
                await self._event(
                    pool_obj,
                    PoolEvent.AGENTS_PREPARED,
                    f"prepared {len(prepared)} Agent(s) for their VMs (pool labels, role, "
                    f"hostname{', approval' if pool.spec.agent.approve else ''}): "
                    f"{_summary(prepared)}",
                )
        deleted: set[str] = set()
        for deletion in plan.deletions:
            await self._step(
                f"delete VsphereAgent {namespace}/{deletion.vsphere_agent}",
                self._client.delete(
                    kinds.VSPHERE_AGENT,
                    namespace=namespace,
                    name=deletion.vsphere_agent,
                    uid=deletion.uid or None,
                ),
            )
            deleted.add(deletion.vsphere_agent)
        if plan.deletions:
            await self._event(
                pool_obj,
                PoolEvent.CLEANUP_STARTED,
                f"deleting {len(plan.deletions)} VsphereAgent(s) (cleanupPolicy Delete; their "
                "VMs and unbound Agents follow): "
                + _summary([f"{d.vsphere_agent} ({d.reason})" for d in plan.deletions]),
            )
        return await self._write_vms(pool, plan, skip=deleted)

    async def _write_vms(
        self, pool: VsphereAgentPool, plan: planner.Plan, *, skip: set[str]
    ) -> list[JsonObj]:
        namespace = pool.metadata.namespace
        where = status_.RefNamespaces(agents=namespace, machines=pool.spec.control_plane_namespace)
        owned: list[JsonObj] = []
        for record in plan.vms:
            if record.vsphere_agent in skip:
                continue
            previous = self._source.vm_status(namespace=namespace, name=record.vsphere_agent)
            wire = status_.rendered_vm(previous, record, where=where)
            # A VsphereAgent without a VM record yet gets its first phase with the `vm`
            # controller's first write (`phases.initial`): nothing to write here then.
            if wire != previous and previous:
                await self._step(
                    f"update the status of VsphereAgent {namespace}/{record.vsphere_agent}",
                    self._client.update_status(
                        kinds.VSPHERE_AGENT,
                        namespace=namespace,
                        name=record.vsphere_agent,
                        mutate=_vm_mutation(record, where),
                    ),
                )
            owned.append(status_.owned_vm_entry(wire))
        return owned

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

        def mutate(fresh: JsonObj) -> JsonObj | None:
            status = fresh.setdefault("status", {})
            return fresh if status_.apply_pool(status, desired, now=now) else None

        try:
            await self._client.update_status(
                kinds.VSPHERE_AGENT_POOL,
                namespace=pool.metadata.namespace,
                name=pool.metadata.name,
                mutate=mutate,
            )
        except errors.NotFound:
            return

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
            await self._client.patch_merge(
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
            if await self._step(
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
                f"(cleanupPolicy {pool.spec.cleanup_policy.value}): {_summary(started)}",
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
        metrics.forget(namespace=namespace, pool=name)
        return None

    # --- reporting ---------------------------------------------------------------------

    async def _event(
        self, pool_obj: JsonObj, reason: PoolEvent, message: str, *, warning: bool = False
    ) -> None:
        await self._deps.events.record(
            pool_obj,
            type=EventType.WARNING if warning else EventType.NORMAL,
            reason=reason,
            message=message,
        )

    async def _report(
        self, pool: VsphereAgentPool, pool_obj: JsonObj, plan: planner.Plan, failure: str | None
    ) -> None:
        if failure is not None:
            key = f"{pool.metadata.namespace}/{pool.metadata.name}"
            await self._event(
                pool_obj, PoolEvent.APPLY_FAILED, f"VsphereAgentPool {key}: {failure}", warning=True
            )
        # Agent preparations are reported once, when applied (AgentsPrepared); the
        # Planned event is about everything else, and only when that changed.
        actions = [a for a in plan.actions if a.type is not PlannedActionType.PATCH_AGENT]
        previous = [
            a
            for a in (pool_obj.get("status") or {}).get("plannedActions") or ()
            if not (isinstance(a, dict) and a.get("type") == PlannedActionType.PATCH_AGENT.value)
        ]
        only_noop = all(a.type is PlannedActionType.NOOP and a.name is None for a in actions)
        if [status_.action_wire(a) for a in actions] != previous and not only_noop:
            parts = [f"{a.type.value}/{a.name}" if a.name else a.type.value for a in actions]
            await self._event(
                pool_obj,
                PoolEvent.PLANNED,
                f"planned {len(actions)} action(s): {_summary(parts)}",
            )


def _vm_mutation(record: planner.VMRecord, where: status_.RefNamespaces) -> Any:
    def mutate(fresh: JsonObj) -> JsonObj | None:
        status = fresh.setdefault("status", {})
        vm = status.get("vm")
        vm = dict(vm) if isinstance(vm, dict) else {}
        if not status_.apply_vm(vm, record, where=where):
            return None
        status["vm"] = vm
        return fresh

    return mutate


def controller(deps: Deps) -> Controller:
    """The `pool` controller over the app's informers (indexes installed here)."""
    indexes.install(deps.informers)
    return Controller(
        name=CONTROLLER_NAME,
        reconcile=PoolReconciler(deps).reconcile,
        watches=pool_watches.watches(deps.informers),
        workers=deps.workers,
    )
