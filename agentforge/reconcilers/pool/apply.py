"""Applying a pool's plan: the API calls, in an order that is safe to stop anywhere.

1. Agent preparation patches (merge patches of the differing fields only), except
   those that follow a hand-over record this plan writes (step 6); then clean-up's
   first step (`planner.Unlabel`): the pool's labels removed from a VM's unbound Agent
   and its approval withdrawn, in one patch conditional on the version the plan saw
   (a 409: it changed, perhaps bound: planned again). The VM is deleted by a later
   plan that sees the labels gone.
2. Clean-up: VsphereAgent deletions (UID precondition: a re-created object of the
   same name is never hit).
3. Each VsphereAgent's `status.vm` phase fields and `status.handover`, written only
   where they differ from the cache. A hand-over's record is written here, and the
   stored version is what the next step builds on: the checkpoint precedes every
   effect of the hand-over. The VM record of a VM whose Agent step 1 unlabelled is
   not written: it only marks progress (`Released`, `MachineDeleted`) of a VM the next
   plan deletes, and that plan derives the same record from the cache again (the
   Agent's labels are the clean-up's checkpoint).
4. Hand-overs: the VsphereAgent's selection label moves to the new AgentMachine, as a
   merge patch conditional on the version that carries the record (a 409 means it
   changed meanwhile: the next pass decides again).
5. Creations: one VsphereAgent per AgentMachine no VM can serve
   (`vsphere_agent_create`), then the warm spares the pool lacks (`spec.spares`).
6. The Agent patches held back in step 1 (`AgentPatch.after_record`): the Agent of a
   handed-over VM gets the new selection label once the record is stored, never
   before, and in the same pass, so the next plan finds nothing left to do.

The first failing call stops the plan (`StepFailed`, with the object and the fix in
its message); the pool reconciles again with backoff. Until the cache shows the
VsphereAgents this pass created, relabelled or deleted (`Expectations`), the pool is not
planned again.

**Expectations**: writes a pool's last pass made that the cache does not show yet
(client-go's expectations). A pool's plan is only as good as the cache it was made from:
planned again before the cache shows the VsphereAgents the last pass created,
relabelled or deleted, the planner would hand over, create or delete a second time. So
the applier records each such write here (name -> the selection label it must carry, or
`DELETED`), and the pool is not planned again while the cache shows any of them
otherwise. A write the cache never
shows stops holding the pool back after `EXPECTATION_TIMEOUT` (the object may have been
deleted meanwhile; the next plan sees whatever is there).

The cache is read through the VsphereAgents' parsed records (`common.records`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agentforge.api import kinds, names, rbac
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube import errors
from agentforge.kube.events import EventType
from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers.common import event_groups, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.planning import naming, planner
from agentforge.reconcilers.planning.snapshot import VsphereAgentFacts
from agentforge.reconcilers.pool import status as status_
from agentforge.reconcilers.pool import vsphere_agent_create
from agentforge.reconcilers.pool.observed import SnapshotSource
from agentforge.reconcilers.pool.plan_reports import summary

log = logging.getLogger(__name__)

EXPECTATION_TIMEOUT = 10.0
"""Seconds after which a write the cache never showed stops holding the pool back."""
DELETED = ""
"""The expectation of a VsphereAgent deleted: the cache shows it deleting, or not at all."""


@dataclass
class Expectations:
    """VsphereAgents a pool's last pass created, relabelled or deleted, until the cache
    shows them so: name -> the selection label they must carry (`DELETED`: deleting)."""

    by_pool: dict[ObjectKey, tuple[float, dict[str, str]]] = field(default_factory=dict)

    def expect(self, key: ObjectKey, name: str, selection: str) -> None:
        _, wanted = self.by_pool.get(key, (0.0, {}))
        wanted[name] = selection
        self.by_pool[key] = (time.monotonic() + EXPECTATION_TIMEOUT, wanted)

    def pending(self, key: ObjectKey, cache: Informer, namespace: str) -> list[str]:
        """The names the cache does not show as written yet (forgotten after the timeout)."""
        entry = self.by_pool.get(key)
        if entry is None:
            return []
        deadline, wanted = entry
        missing = [
            name
            for name, selection in wanted.items()
            if _shown(cache, namespace=namespace, name=name, deleted=selection == DELETED)
            != selection
        ]
        if not missing or time.monotonic() > deadline:
            if missing:
                log.debug("cache never showed VsphereAgents %s of pool %s", missing, key)
            del self.by_pool[key]
            return []
        return missing


def _shown(cache: Informer, *, namespace: str, name: str, deleted: bool) -> str | None:
    """The selection label the cached VsphereAgent carries (None: not cached, or none);
    with `deleted`, `DELETED` when it is deleting or not cached."""
    facts = records.record(cache, key_for(namespace=namespace, name=name), VsphereAgentFacts)
    if deleted:
        return DELETED if facts is None or facts.deleting else facts.agent_machine
    return facts.agent_machine if facts is not None else None


rbac.needs(
    kinds.AGENT,
    "patch",
    why="remove the pool's labels from a VM's unbound Agent before clean-up deletes the VM",
)

JsonObj = dict[str, Any]


class PoolEvent(StrEnum):
    """Reasons of the Events the `pool` controller records (on the pool unless noted)."""

    PLANNED = "Planned"
    AGENTS_PREPARED = "AgentsPrepared"
    CLEANUP_STARTED = "CleanupStarted"
    APPLY_FAILED = "ApplyFailed"
    INVALID_POOL = "InvalidPool"
    FINALIZED = "Finalized"
    VSPHERE_AGENT_CREATED = "VsphereAgentCreated"
    """On the AgentMachine: a VsphereAgent (a VM) was created for it."""
    VSPHERE_AGENT_NAME_TAKEN = "VsphereAgentNameTaken"
    """On the AgentMachine (Warning): every name its VsphereAgent may have is taken."""
    VSPHERE_AGENT_HANDED_OVER = "VsphereAgentHandedOver"
    """On the pool and the AgentMachine: a VM made for another, or a warm spare, serves it."""
    SPARES_CREATED = "SparesCreated"
    """On the pool: warm spare VsphereAgents were created (`spec.spares`)."""


Event = Callable[[JsonObj, PoolEvent, str, bool], Awaitable[None]]


class StepFailed(Exception):
    """One API call of the plan failed; the message names the object and the fix."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


def hint(exc: errors.KubeError) -> str:
    if isinstance(exc, errors.Forbidden):
        return "grant the operator this permission (see config/rbac)"
    if isinstance(exc, errors.Invalid):
        return "the API server rejected it; check admission webhooks on that object"
    return "it is retried with backoff"


@dataclass
class Applied:
    owned: list[JsonObj]
    requeue: bool = False
    """A hand-over met a changed object: plan again soon (no failure)."""


class PlanApplier:
    def __init__(self, deps: Deps, source: SnapshotSource, event: Event) -> None:
        self._deps = deps
        self._client = deps.client
        self._vsphere_agents = deps.informer(kinds.VSPHERE_AGENT)
        self._agent_machines = deps.informer(kinds.AGENT_MACHINE)
        self._source = source
        self._event = event
        self.expectations = Expectations()

    async def step(self, action: str, call: Awaitable[Any]) -> bool:
        """Await one API call; False when its object is gone (nothing to do)."""
        try:
            await call
        except (errors.NotFound, errors.Conflict) as exc:
            if isinstance(exc, errors.NotFound) or "precondition" in exc.message.lower():
                return False
            raise StepFailed(f"could not {action}: {exc}; {hint(exc)}") from exc
        except errors.KubeError as exc:
            raise StepFailed(
                f"could not {action}: {exc}; {hint(exc)}",
                forbidden=isinstance(exc, errors.Forbidden),
            ) from exc
        return True

    async def apply(
        self,
        key: ObjectKey,
        pool: VsphereAgentPool,
        pool_obj: JsonObj,
        plan: planner.Plan,
        prepared: list[str],
        *,
        cleaned: list[str],
    ) -> Applied:
        """Run the plan's API calls. `prepared` collects the Agents patched and `cleaned`
        the VsphereAgents deleted (the caller reports them, `plan_reports`), also when a
        later step fails."""
        namespace = pool.metadata.namespace
        await self._prepare(pool, [p for p in plan.patches if p.after_record is None], prepared)
        changed = await self._unlabel(pool, plan)
        deleted: set[str] = set()
        for deletion in plan.deletions:
            await self.step(
                f"delete VsphereAgent {namespace}/{deletion.vsphere_agent}",
                self._client.delete(
                    kinds.VSPHERE_AGENT,
                    namespace=namespace,
                    name=deletion.vsphere_agent,
                    uid=deletion.uid or None,
                ),
            )
            self.expectations.expect(key, deletion.vsphere_agent, DELETED)
            deleted.add(deletion.vsphere_agent)
            cleaned.append(f"{deletion.vsphere_agent} (VM {deletion.vm}: {deletion.reason})")
        going = {unlabel.vsphere_agent for unlabel in plan.unlabels}
        owned, stored = await self._write_vms(pool, plan, skip=deleted, going=going)
        requeue = await self._hand_over(key, pool, pool_obj, plan, stored)
        await self._create(key, pool, plan)
        await self._create_spares(key, pool, pool_obj, plan)
        # `deleted` now also holds the VsphereAgents found gone while writing records
        held = [p for p in plan.patches if p.after_record is not None]
        await self._prepare(pool, [p for p in held if p.after_record not in deleted], prepared)
        return Applied(owned=owned, requeue=requeue or changed)

    async def _unlabel(self, pool: VsphereAgentPool, plan: planner.Plan) -> bool:
        """Clean-up's first step; True when an Agent changed since the plan saw it."""
        namespace = pool.metadata.namespace
        changed = False
        for unlabel in plan.unlabels:
            try:
                await self._client.patch_merge(
                    kinds.AGENT, namespace=namespace, name=unlabel.agent, patch=unlabel.patch
                )
            except errors.NotFound:
                continue
            except errors.Conflict:
                changed = True  # bound by CAPI, perhaps: the next plan decides again
                continue
            except errors.KubeError as exc:
                raise StepFailed(
                    f"could not remove the pool's labels from Agent {namespace}/"
                    f"{unlabel.agent} before deleting VM {unlabel.vm}: {exc}; {hint(exc)}",
                    forbidden=isinstance(exc, errors.Forbidden),
                ) from exc
            log.info("removed the labels %s from Agent %s/%s and unapproved it: no "
                     "AgentMachine can bind it, "
                     "VM %s is deleted next (%s)", ", ".join(unlabel.labels), namespace,
                     unlabel.agent, unlabel.vm, unlabel.reason)  # fmt: skip
        return changed

    async def _prepare(
        self, pool: VsphereAgentPool, patches: Sequence[planner.AgentPatch], prepared: list[str]
    ) -> None:
        namespace = pool.metadata.namespace
        for patch in patches:
            if await self.step(
                f"patch Agent {namespace}/{patch.agent}",
                self._client.patch_merge(
                    kinds.AGENT, namespace=namespace, name=patch.agent, patch=patch.patch
                ),
            ):
                prepared.append(f"{patch.agent} (VM {patch.vm})")

    async def _write_vms(
        self, pool: VsphereAgentPool, plan: planner.Plan, *, skip: set[str], going: set[str]
    ) -> tuple[list[JsonObj], dict[str, str]]:
        """Write the changed VM records (not the VM record of those `going`: progress
        only); the `ownedVMs` entries, and the resourceVersion each written VsphereAgent
        was stored with."""
        namespace = pool.metadata.namespace
        where = status_.RefNamespaces(agents=namespace, machines=pool.spec.control_plane_namespace)
        owned: list[JsonObj] = []
        stored: dict[str, str] = {}
        for record in plan.vms:
            if record.vsphere_agent in skip:
                continue
            previous = self._source.vm_status(namespace=namespace, name=record.vsphere_agent)
            wire = status_.rendered_vm(previous, record, where=where)
            recorded = self._source.handover(namespace=namespace, name=record.vsphere_agent)
            # A VsphereAgent without a VM record yet gets its first phase with the `vm`
            # controller's first write (`phases.initial`): no VM write here then.
            progress = record.vsphere_agent in going
            if (wire != previous and previous and not progress) or recorded != (
                status_.handover_wire(record)
            ):
                written: JsonObj | None = None

                async def write(record: planner.VMRecord = record) -> None:
                    nonlocal written
                    written = await self._client.update_status(
                        kinds.VSPHERE_AGENT,
                        namespace=namespace,
                        name=record.vsphere_agent,
                        mutate=_vm_mutation(record, where),
                    )

                if not await self.step(
                    f"update the status of VsphereAgent {namespace}/{record.vsphere_agent}",
                    write(),
                ):
                    skip.add(record.vsphere_agent)  # gone: no patch follows its record
                version = ((written or {}).get("metadata") or {}).get("resourceVersion")
                if isinstance(version, str) and version:
                    stored[record.vsphere_agent] = version
            owned.append(status_.owned_vm_entry(wire))
        return owned, stored

    async def _hand_over(
        self,
        key: ObjectKey,
        pool: VsphereAgentPool,
        pool_obj: JsonObj,
        plan: planner.Plan,
        stored: dict[str, str],
    ) -> bool:
        namespace = pool.metadata.namespace
        requeue = False
        for handover in plan.handovers:
            name = handover.vsphere_agent
            version = stored.get(name) or self._source.resource_version(
                namespace=namespace, name=name
            )
            if not version:
                continue
            try:
                await vsphere_agent_create.move_label(
                    self._client,
                    namespace=namespace,
                    name=name,
                    selection=handover.selection,
                    resource_version=version,
                )
            except errors.NotFound:
                continue
            except errors.Conflict:
                log.debug("VsphereAgent %s/%s changed before its hand-over; planned again",
                          namespace, name)  # fmt: skip
                requeue = True
                continue
            except errors.KubeError as exc:
                raise StepFailed(
                    f"could not hand VsphereAgent {namespace}/{name} over to AgentMachine "
                    f"{handover.agent_machine}: {exc}; {hint(exc)}"
                ) from exc
            self.expectations.expect(key, name, handover.selection)
            why = (
                "it was a warm spare (spec.spares), so no new VM is created and a "
                "replacement spare is made"
                if naming.is_spare_selection(handover.from_)
                else f"AgentMachine {handover.from_} it was made for no longer needs it, so "
                "no new VM is created"
            )
            message = (
                f"VsphereAgent {namespace}/{name} (VM {handover.vm}) now serves AgentMachine "
                f"{pool.spec.control_plane_namespace}/{handover.agent_machine}: {why}"
            )
            await self._event(pool_obj, PoolEvent.VSPHERE_AGENT_HANDED_OVER, message, False)
            am = self._agent_machines.get(
                namespace=pool.spec.control_plane_namespace, name=handover.agent_machine
            )
            if am is not None:
                await self._event(am, PoolEvent.VSPHERE_AGENT_HANDED_OVER, message, False)
        return requeue

    async def _create(self, key: ObjectKey, pool: VsphereAgentPool, plan: planner.Plan) -> None:
        namespace, cpns = pool.metadata.namespace, pool.spec.control_plane_namespace
        for creation in plan.creations:
            am = self._agent_machines.get(namespace=cpns, name=creation.agent_machine)
            try:
                created = await vsphere_agent_create.create(
                    self._client,
                    self._vsphere_agents,
                    pool=pool,
                    creation=creation,
                    planned=plan.planned_names,
                )
            except vsphere_agent_create.NamesTaken as exc:
                if am is not None:
                    await self._event(
                        am,
                        PoolEvent.VSPHERE_AGENT_NAME_TAKEN,
                        f"cannot create a VsphereAgent for AgentMachine {cpns}/"
                        f"{creation.agent_machine}: the names {' and '.join(exc.names)} are "
                        "taken by objects of another pool or AgentMachine; delete or rename them",
                        True,
                    )
                continue
            except errors.KubeError as exc:
                raise StepFailed(
                    f"could not create a VsphereAgent in {namespace} for AgentMachine "
                    f"{cpns}/{creation.agent_machine}: {exc}; {hint(exc)}"
                ) from exc
            if created is None:
                continue
            name = created["metadata"]["name"]
            self.expectations.expect(key, name, creation.selection)
            if am is not None:
                vm = created["metadata"]["annotations"][names.ANNOTATION_VM_NAME]
                await self._deps.events.record(
                    am,
                    group=event_groups.pool_ref(
                        namespace=namespace, name=pool.metadata.name, uid=pool.metadata.uid
                    ),  # in a burst, all but the first: combined onto the pool
                    type=EventType.NORMAL,
                    reason=PoolEvent.VSPHERE_AGENT_CREATED,
                    message=f"created VsphereAgent {namespace}/{name} (VM {vm}) of pool "
                    f"{namespace}/{pool.metadata.name} for this AgentMachine; it binds the Agent "
                    f"labelled {names.LABEL_AGENT_MACHINE}={creation.selection}",
                )

    async def _create_spares(
        self, key: ObjectKey, pool: VsphereAgentPool, pool_obj: JsonObj, plan: planner.Plan
    ) -> None:
        if not plan.spare_creations:
            return
        namespace = pool.metadata.namespace
        taken = {record.vsphere_agent for record in plan.vms} | set(plan.spare_creations)
        created: list[str] = []
        for name in plan.spare_creations:
            taken.discard(name)
            try:
                obj = await vsphere_agent_create.create_spare(
                    self._client, self._vsphere_agents, pool=pool, name=name, taken=taken
                )
            except errors.KubeError as exc:
                raise StepFailed(
                    f"could not create a warm spare VsphereAgent in {namespace} for pool "
                    f"{pool.metadata.name}: {exc}; {hint(exc)}",
                    forbidden=isinstance(exc, errors.Forbidden),
                ) from exc
            if obj is None:
                continue
            spare = obj["metadata"]["name"]
            self.expectations.expect(
                key, spare, obj["metadata"]["labels"][names.LABEL_AGENT_MACHINE]
            )
            created.append(
                f"{spare} (VM {obj['metadata']['annotations'][names.ANNOTATION_VM_NAME]})"
            )
        if created:
            await self._event(
                pool_obj,
                PoolEvent.SPARES_CREATED,
                f"created {len(created)} warm spare VsphereAgent(s) to keep {pool.spec.spares} "
                f"(spec.spares): {summary(created)}",
                False,
            )


def _vm_mutation(record: planner.VMRecord, where: status_.RefNamespaces) -> Any:
    def mutate(fresh: JsonObj) -> JsonObj | None:
        status = fresh.setdefault("status", {})
        vm = status.get("vm")
        vm = dict(vm) if isinstance(vm, dict) else {}
        changed = status_.apply_vm(vm, record, where=where)
        changed |= status_.apply_handover(status, record)
        if not changed:
            return None
        status["vm"] = vm
        return fresh

    return mutate
