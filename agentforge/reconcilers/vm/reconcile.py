"""The `vm` controller (key: VsphereAgent): one VM per VsphereAgent, created once, deleted safely.

Dispatch per reconcile, reading only the informer cache (0002 "VM lifecycle"):

* deleting -> `vm_delete.finalize` (ejection first, ownership-checked delete, Agent,
  finalizer);
* no finalizer -> add `agent-forge.containeroo.ch/vsphere-agent` first;
* pool missing -> Ready=False `PoolNotFound`, nothing in vSphere;
* `created-for: adopted` -> `ensure_adopted` (never creates);
* a recorded ISO ejection (`status.isoEjection`) -> nothing: the `ejection`
  controller owns the VM until it clears the record (its write wakes this key);
* otherwise -> `vm_create.ensure_created` (checkpoint, create, record; resume after
  a crash by looking the VM up by recorded UUID and name).

The `ejection` controller (`reconcilers.ejection`) runs its passes with this module's
pass machinery (`VmReconciler` with its own `step`, queue, waits and name). A pass of
either holds the key's lock (`Deps.vm_keys`) from its first cache read to its last
write, so an ejection never runs concurrently with the creation or deletion of the same
VM; which of the two acts is decided from the stored VsphereAgent (docs/design/0009).

No worker waits on vCenter. A pass that starts a vCenter task (create, power on, power
off, destroy, CD-ROM disconnect) records its moref and ends; the task's end reconciles
the key again (`waits.TaskWaits`). Every vCenter task slot taken (`vsphere.TaskSlotPending`,
`--vsphere-max-tasks-in-flight`), or a vCenter login that takes longer than a caller may
wait (`vsphere.LoginPending`), ends the pass without a failure: what it learnt is
written, and the key is reconciled again when its pool's turn for a slot comes, or when
the login ends (`waits.LoginWaits`), so neither a busy nor a black-holed vCenter holds a
worker. A VsphereAgent whose VM is recorded costs no vSphere call and no write on later
reconciles. Watches: VsphereAgents; pools (-> their VsphereAgents, only when the pool's
generation, UID, deletion or cached ISO path changed); Agents (-> the VsphereAgent whose
`status.vm.agentRef` names them, and deleting VsphereAgents whose recorded VM identity
is theirs: a bound Agent holds a deletion, and the ejection feature reacts to
installation).

Fair between pools: the work queue hands keys out in turn between pools
(`kube.queue.WorkQueue` fairness, the key's `spec.poolRef`), as the vCenter task
slots do, so a pool asking for one VM during another pool's burst of hundreds is
reconciled within one turn of the pools at each step of its task chain, not after
the burst's keys.

Status writes: one per pass where the steps allow it (`vm_context.StatusWriter`:
conditions and a new VM's identity ride along with the pass's next write, or go at its
end). Read your writes: the writer reports every version it stored to the controller
(`kube.controller`), which never reconciles a key from a cached version its own write
superseded (it waits for the watch to deliver the newer one), so finished work is not
redone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from agentforge import identity, vsphere
from agentforge.api import kinds, names
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Controller, Result, Watch
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers.common import indexes, pool_specs, records
from agentforge.reconcilers.common.deps import DEFAULT_RETRY_BASE, Deps, retry_limiter
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.vm import create as vm_create
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm import delete as vm_delete
from agentforge.reconcilers.vm import spread_choice as vm_spread
from agentforge.reconcilers.vm import stamp as vm_stamp
from agentforge.reconcilers.vm.context import StatusWriter, VmInputs, identity_edit
from agentforge.reconcilers.waits import LoginWaits, TaskWaits
from agentforge.secret_credentials import CredentialsError

__all__ = ["CONTROLLER_NAME", "Step", "VmReconciler", "controller"]

log = logging.getLogger(__name__)

CONTROLLER_NAME: Final = "vm"
JsonObj = dict[str, Any]


Step = Callable[[VmInputs, StatusWriter], Awaitable[Result | None]]
"""What a controller does in one pass of a VsphereAgent's key (the `vm` flow by default)."""


class VmReconciler:
    def __init__(
        self,
        *,
        deps: Deps,
        ejection: vm_delete.EjectionHook | None = None,
        iso_quiet: float = vm_create.WAITING_FOR_ISO_QUIET_S,
        name: str = CONTROLLER_NAME,
        step: Step | None = None,
    ) -> None:
        self._deps = deps
        self._step: Step = step or self._reconcile
        self._iso_quiet = iso_quiet
        self._agents = deps.informer(kinds.VSPHERE_AGENT)
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._ejection = ejection
        self._wrote: Callable[[ObjectKey, str], None] | None = None
        self.waits = LoginWaits(deps.vsphere)
        self.tasks = TaskWaits(deps.vsphere, controller=name)
        self.spread = vm_spread.SpreadLedger()

    async def reconcile(self, key: ObjectKey) -> Result | None:
        async with self._deps.vm_keys.hold(key):  # one controller at a time per VM
            return await self._pass(key)

    async def _pass(self, key: ObjectKey) -> Result | None:
        raw = self._agents.get_by_key(key)
        if raw is None:
            self.tasks.forget(key)  # nothing to wait for any more: give its turn away
            return None
        agent = VsphereAgent.model_validate(raw)
        pool_key = key_for(namespace=agent.metadata.namespace, name=agent.spec.pool_ref.name)
        pool = records.record(self._pools, pool_key, VsphereAgentPool)
        if pool is None and (unreadable := self._pools.rejection(pool_key)) is not None:
            raise unreadable  # the pool controller says what is wrong with it
        inputs = VmInputs.of(
            self._deps,
            raw=raw,
            agent=agent,
            pool=pool,
            now=self._deps.now(),
            key=key,
            waits=self.tasks,
            spread=self.spread,
        )
        wrote = self._wrote
        writer = StatusWriter.of(
            self._deps,
            inputs,
            wrote=None if wrote is None else (lambda version: wrote(key, version)),
        )
        try:
            result = await self._step(inputs, writer)
        except vsphere.LoginPending as pending:  # back when the login ends; no failure
            with contextlib.suppress(kerrors.KubeError):
                await writer.flush()
            result = self.waits.wait(pending, key)
        except vsphere.TaskSlotPending as pending:  # back in its pool's turn; no failure
            with contextlib.suppress(kerrors.KubeError):
                await writer.flush()
            result = self.tasks.wait_slot(key, pending)
        except Exception:
            # what the pass learnt (a condition, a VM's identity) is still recorded
            with contextlib.suppress(kerrors.KubeError):
                await writer.flush()
            raise
        else:
            await writer.flush()  # one status write per pass where the steps allow
        finally:
            self.tasks.give_back(key)  # a slot handed over for a next task not started
        return result

    def bind(self, wrote: Callable[[ObjectKey, str], None]) -> None:
        """Report the versions this reconciler's writes stored (the controller's
        read-your-writes guard, `Controller.wrote`)."""
        self._wrote = wrote

    async def _reconcile(self, inputs: VmInputs, writer: StatusWriter) -> Result | None:
        agent, pool = inputs.agent, inputs.pool
        if agent.metadata.deleting:
            return await vm_delete.finalize(inputs, writer, ejection=self._ejection)
        if names.FINALIZER_VSPHERE_AGENT not in agent.metadata.finalizers and not (
            await self._add_finalizer(agent, writer)
        ):
            return Result(requeue=True)
        if pool is None:
            await writer.ready(
                ok=False,
                reason=VsphereAgentReason.POOL_NOT_FOUND,
                message=(
                    f"VsphereAgentPool {agent.metadata.namespace}/{agent.spec.pool_ref.name} "
                    "not found: create it or fix spec.poolRef.name"
                ),
            )
            return None
        if agent.status.iso_ejection is not None:
            return None  # the ejection controller's until it clears the record
        if self._ejection is not None and (first := self._ejection.along(inputs)) is not None:
            writer.along(first)  # ISOEjected with the write that records the VM as up
        if is_adopted(inputs):
            return await ensure_adopted(inputs, writer)
        if (quiet := vm_create.waits_quietly_for_iso(inputs, self._iso_quiet)) is not None:
            return quiet  # nothing written yet
        return await vm_create.ensure_created(inputs, writer)

    async def _add_finalizer(self, agent: VsphereAgent, writer: StatusWriter) -> bool:
        """Merge patch guarded by the cached resourceVersion: a 409 (the pool controller
        wrote `status.vm` meanwhile: expected) retries quietly with backoff rather than
        overwrite a finalizer list someone changed meanwhile. False on a 409."""
        try:
            stored = await self._deps.client.patch_merge(
                kinds.VSPHERE_AGENT,
                namespace=agent.metadata.namespace,
                name=agent.metadata.name,
                patch={
                    "metadata": {
                        "resourceVersion": agent.metadata.resource_version,
                        "finalizers": [*agent.metadata.finalizers, names.FINALIZER_VSPHERE_AGENT],
                    }
                },
            )
        except kerrors.Conflict as exc:
            log.debug(
                "VsphereAgent %s changed since the cache saw it (%s); finalizer retried",
                agent.metadata.key,
                exc,
            )
            return False
        writer.saw(stored)
        return True


def _pool_changed(old: JsonObj, new: JsonObj) -> bool:
    def watched(obj: JsonObj) -> tuple[Any, ...]:
        meta = obj.get("metadata") or {}
        iso = (obj.get("status") or {}).get("iso") or {}
        return (
            meta.get("uid"),
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            iso.get("path"),
        )

    return watched(old) != watched(new)


def controller(
    deps: Deps,
    *,
    ejection: vm_delete.EjectionHook | None = None,
    retry_base: float = DEFAULT_RETRY_BASE,
    iso_quiet: float = vm_create.WAITING_FOR_ISO_QUIET_S,
    name: str = CONTROLLER_NAME,
    step: Step | None = None,
) -> Controller:
    """The `vm` controller over the app's informers (see the module doc); `iso_quiet`:
    how long a new VsphereAgent waits for its pool's ISO before saying so. With `name`
    and `step`: another controller keyed by VsphereAgent with the same watches, pass
    machinery and per-key lock (the `ejection` controller)."""
    agents = deps.informer(kinds.VSPHERE_AGENT)
    indexes.install(deps.informers)
    reconciler = VmReconciler(
        deps=deps, ejection=ejection, iso_quiet=iso_quiet, name=name, step=step
    )

    def agents_of_pool(obj: JsonObj) -> list[ObjectKey]:
        meta = obj.get("metadata") or {}
        value = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return indexes.keys_of(agents.by_index(indexes.VSPHERE_AGENTS_BY_POOL, value))

    def agents_of_agent(obj: JsonObj) -> list[ObjectKey]:
        """The VsphereAgent recording the Agent, and deleting ones whose VM it is by
        identity (a bound Agent holds that deletion: its unbinding resumes it)."""
        meta = obj.get("metadata") or {}
        value = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        found = agents.by_index(indexes.VSPHERE_AGENTS_BY_AGENT, value)
        for key in indexes.agent_identity_keys(obj):
            found += [
                va
                for va in agents.by_index(indexes.VSPHERE_AGENTS_BY_IDENTITY, key)
                if (va.get("metadata") or {}).get("deletionTimestamp")
            ]
        return indexes.keys_of(found)

    def pool_of(key: ObjectKey) -> str:
        """The pool a VsphereAgent's key takes turns in (`WorkQueue` fairness); a key
        no longer cached goes with the keys of no pool."""
        raw = agents.get_by_key(key)
        if raw is None:
            return ""
        pool = ((raw.get("spec") or {}).get("poolRef") or {}).get("name") or ""
        return f"{(raw.get('metadata') or {}).get('namespace', '')}/{pool}"

    built = Controller(
        name=name,
        reconcile=reconciler.reconcile,
        watches=[
            Watch(source=agents),
            Watch(
                source=deps.informer(kinds.VSPHERE_AGENT_POOL),
                map=agents_of_pool,
                predicate=_pool_changed,
            ),
            Watch(source=deps.informer(kinds.AGENT), map=agents_of_agent),
        ],
        workers=deps.workers,
        rate_limiter=retry_limiter(base=retry_base),
        cache=agents,
        fairness=pool_of,
    )
    reconciler.waits.bind(built.enqueue)
    reconciler.tasks.bind(built.enqueue)
    reconciler.bind(built.wrote)
    return built


# Adopted VsphereAgents (`created-for: adopted`): take over an existing VM, never create one.
#
# The user names the VM in annotation `vm-name` and may pin it with `vm-bios-uuid`.
# Two steps, each recorded before the next (0002 step 7):
#
# 1. Record: the VM is looked up (by the pinned UUID, else by name in the pool's
#    folder); when its name (and the pinned UUID) match, `status.vm.{name,biosUUID}` is
#    written. That record is what every later step compares with.
# 2. Take over: the VM is looked up by the recorded UUID; its name and UUID must match
#    the record. Our markers -> adopted; unmarked -> our markers are stamped (a task
#    started, not waited for: `vm_stamp`); another owner's markers ->
#    `VMOwnershipMismatch`, nothing touched. Then MAC and the rest
#    of the identity are recorded and Ready=True `VMAdopted`.
#
# A VM that cannot be found is reported (`AdoptedVMUnavailable`) and looked for again
# with the queue's backoff; nothing is ever created for an adopted VsphereAgent.

R = VsphereAgentReason


def is_adopted(inputs: VmInputs) -> bool:
    return (
        inputs.agent.metadata.labels.get(names.LABEL_CREATED_FOR) == names.CreatedFor.ADOPTED.value
    )


async def ensure_adopted(inputs: VmInputs, writer: StatusWriter) -> Result | None:
    agent, pool = inputs.agent, inputs.pool
    assert pool is not None
    recorded = agent.status.vm
    if (
        recorded is not None
        and recorded.bios_uuid
        and inputs.shows_ready(ok=True, reason=R.VM_ADOPTED)
    ):
        return None  # adopted earlier: steady state costs nothing
    annotations = agent.metadata.annotations
    name = (recorded.name if recorded and recorded.bios_uuid else None) or annotations.get(
        names.ANNOTATION_VM_NAME
    )
    if not name:
        return await _unavailable(
            writer,
            f"set annotation {names.ANNOTATION_VM_NAME} on {inputs.where} to the name of the VM "
            "to adopt",
            retry=False,
        )
    pinned = identity.normalize_uuid(annotations.get(names.ANNOTATION_VM_BIOS_UUID))
    bios_uuid = (recorded.bios_uuid if recorded and recorded.bios_uuid else None) or pinned
    expected = pool_specs.markers(pool, vsphere_agent=agent.metadata.name)
    datacenter = pool.spec.vsphere.datacenter
    try:
        service = await inputs.vcenter.service()
        if bios_uuid:
            vm = await service.vm_by_uuid(datacenter=datacenter, bios_uuid=bios_uuid)
        else:
            vm = await service.vm_by_name(placement=pool_specs.placement(pool), name=name)
        decision = vm_decide.adoption(vm, name=name, bios_uuid=bios_uuid, expected=expected)
        if decision.step is vm_decide.AdoptStep.UNAVAILABLE:
            return await _unavailable(writer, decision.message, retry=True)
        if decision.step is vm_decide.AdoptStep.MISMATCH:
            message = f"cannot adopt: {decision.message}"
            await writer.ready(ok=False, reason=R.VM_OWNERSHIP_MISMATCH, message=message)
            await writer.event(EventType.WARNING, VmEvent.VM_OWNERSHIP_MISMATCH, message)
            return Result(requeue=True)
        assert vm is not None
        assert vm.bios_uuid is not None
        if not (recorded and recorded.bios_uuid):
            # Step 1: record name + UUID before anything is written to the VM.
            await writer.write(
                identity_edit(name=vm.name, vm=vm),
                writer.ready_edit(
                    ok=False,
                    reason=R.VM_CREATE_PENDING,
                    message=f"adopting VM {vm.name} (BIOS UUID {vm.bios_uuid})",
                ),
            )
        if decision.step is vm_decide.AdoptStep.STAMP:
            stamped = await vm_stamp.ensure_stamped(
                inputs.vcenter,
                service,
                datacenter=datacenter,
                bios_uuid=vm.bios_uuid,
                markers=expected,
            )
            if isinstance(stamped, Result):
                return stamped  # the stamp runs; its end wakes this VsphereAgent
            vm = stamped
    except (vsphere.VsphereError, CredentialsError) as exc:
        return await _unavailable(writer, f"adopting VM {name} failed: {exc}", retry=True)
    message = f"VM {vm.name} (BIOS UUID {vm.bios_uuid}, MAC {vm.primary_mac}) adopted"
    await writer.write(
        identity_edit(name=vm.name, vm=vm),
        writer.ready_edit(ok=True, reason=R.VM_ADOPTED, message=message),
    )
    await writer.event(EventType.NORMAL, VmEvent.VM_ADOPTED, message)
    return None


async def _unavailable(writer: StatusWriter, message: str, *, retry: bool) -> Result | None:
    await writer.ready(ok=False, reason=R.ADOPTED_VM_UNAVAILABLE, message=message)
    await writer.event(EventType.WARNING, VmEvent.ADOPTED_VM_UNAVAILABLE, message)
    return Result(requeue=True) if retry else None
