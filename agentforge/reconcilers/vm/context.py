"""One `vm` reconcile's inputs, and the only way it writes a VsphereAgent's status.

A pass gets `VmInputs` (immutable: the cached VsphereAgent, its pool, `now`, `Deps`,
and `VcenterHandle`, the pass's way to vCenter) and a `StatusWriter`; each function
takes only the ones it uses.

The `pool` controller writes `status.vm.{phase,reason,agentRef,machineRef,
lastTransitionTime}` of the same objects, so every write here is `update_status` with
a mutation that touches only this controller's fields: `status.vm.{name,
biosUUID,macAddress,instanceUUID,moRef}`, `status.creation`, `status.placement`,
`status.deletion` and the `Ready` condition; the one exception is the first phase of a
record that has none yet (`phases.initial`), which the pool controller leaves to this
first write. A mutation
that finds the object replaced (another UID) writes nothing; one that changes nothing
makes no request beyond the fresh GET.

vCenter (`VcenterApi`): the part of `vsphere.VsphereService` the `vm` and `ejection`
controllers call, as a `Protocol` (the seam below vCenter); `VcenterHandle.service`
builds the real service, a unit test hands in a fake one.

Tasks (`VcenterHandle`): `claim_slot` takes one of the vCenter's task slots for this
VsphereAgent (in its pool's turn, `vsphere.TaskSlotPending` when none is free) and
`wait_task` ends a pass that started (or found running) a vCenter task: the controller's `TaskWaits`
reconciles the key again when the task ends. Nothing waits for a task: there is one
way to run one, the controller's.

Read your writes: the writer reports the resourceVersion of every write to the
controller (`kube.controller.Controller.wrote`), which does not reconcile the key
again from a cached version those writes superseded.

One write per reconcile pass where the order allows: edits that need no read-back
(`ready(...)`, `defer(...)`: conditions, the recorded identity) are kept until the
next `write` of the pass, which carries them along, or until `flush()`, which the
controller calls when the pass ends. Checkpoints (`write`) are never delayed: their
read-back must come before the vSphere call they guard.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from agentforge import identity, vsphere
from agentforge.api import conditions, kinds, names, rbac, wire
from agentforge.api.conditions import VsphereAgentConditionType, VsphereAgentReason
from agentforge.api.fields import format_time
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import CreationRecord, VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.client import KubeClient
from agentforge.kube.controller import Result, resource_version
from agentforge.kube.events import EventRecorder, EventType
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.planning import phases
from agentforge.reconcilers.vm.spread_choice import SpreadLedger

if TYPE_CHECKING:
    from agentforge.reconcilers.waits import Noted, TaskWaits

JsonObj = dict[str, Any]
Edit = Callable[[JsonObj], None]

rbac.needs(kinds.VSPHERE_AGENT, "get", why="fresh read before a status write")
rbac.needs(
    kinds.VSPHERE_AGENT,
    "update",
    subresource="status",
    why="record the VM identity, the creation checkpoint and Ready (PUT with resourceVersion)",
)
rbac.needs(kinds.EVENT, "create", "patch", why="events about VM creation, adoption and deletion")

_OURS = ("name", "biosUUID", "macAddress", "instanceUUID", "moRef")


class VcenterApi(Protocol):
    """What the `vm` and `ejection` controllers call on vCenter: the part of
    `vsphere.VsphereService` they use, with its signatures (the seam below vCenter).

    `VcenterHandle.service` builds the real service; the unit tests hand in a fake
    vCenter with the same task model (`tests/unit/reconcilers/ejection_support.py`), so
    the crash and resume of every checkpoint is a unit table
    (`tests/unit/reconcilers/test_vm_crash_table.py`, docs/design/0005)."""

    @property
    def vcenter(self) -> str:
        """The vCenter (`host:port`) these credentials reach: where the task cap applies."""
        ...

    # --- reads ---------------------------------------------------------------------------

    async def inspect_storage(
        self, *, placement: vsphere.Placement
    ) -> tuple[list[vsphere.Problem], int]: ...

    async def cluster_hosts(
        self, *, datacenter: str, cluster: str, host_group: str | None = None
    ) -> list[vsphere.HostState]: ...

    async def vm_by_moid(self, *, moid: str) -> vsphere.VmFacts | None: ...

    async def vm_by_uuid(self, *, datacenter: str, bios_uuid: str) -> vsphere.VmFacts | None: ...

    async def vm_by_name(
        self, *, placement: vsphere.Placement, name: str
    ) -> vsphere.VmFacts | None: ...

    # --- tasks: started, never waited for ------------------------------------------------

    def claim_task_slot(self, *, group: str, token: str, keep: bool = False) -> vsphere.Slot: ...

    async def start_create(
        self, *, request: vsphere.VmRequest, slot: vsphere.Slot
    ) -> vsphere.Started: ...

    async def converge_vm(
        self, *, request: vsphere.VmRequest, vm_moid: str, slot: vsphere.Slot
    ) -> str | None: ...

    async def start_delete(
        self,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> vsphere.DeleteStep: ...

    async def start_stamp(
        self,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> tuple[vsphere.VmFacts, str | None]: ...

    async def follow_task(self, *, task_ref: str) -> None: ...

    async def task(self, *, task_ref: str) -> vsphere.TaskFacts: ...

    async def creates_in_flight(
        self, *, placement: vsphere.Placement
    ) -> list[vsphere.TaskFacts]: ...

    # --- CD-ROM --------------------------------------------------------------------------

    async def eject_cdrom(
        self,
        *,
        datacenter: str,
        vm_uuid: str,
        device_key: int,
        expected_backing: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> vsphere.EjectOutcome: ...

    async def answer_cdrom_lock_question(
        self, *, datacenter: str, vm_uuid: str, question_id: str, markers: vsphere.OwnershipMarkers
    ) -> None: ...

    async def resume_eject(
        self, *, datacenter: str, vm_uuid: str, device_key: int
    ) -> vsphere.EjectOutcome: ...


@dataclass(slots=True)
class VcenterHandle:
    """The pass's way to vCenter: the pool's service, its task slots and task waits."""

    deps: Deps
    pool: VsphereAgentPool | None
    key: ObjectKey
    waits: TaskWaits = field(repr=False)
    _service: VcenterApi | None = field(default=None, repr=False)

    async def service(self) -> VcenterApi:
        """The pool's vSphere service; raises `CredentialsError`."""
        if self._service is None:
            assert self.pool is not None
            credentials = await self.deps.credentials.get(
                namespace=self.pool.credentials_secret_namespace(),
                name=self.pool.spec.vsphere.credentials_secret_ref.name,
                for_namespace=self.pool.metadata.namespace,
            )
            self._service = vsphere.VsphereService(
                registry=self.deps.vsphere, credentials=credentials
            )
        return self._service

    def claim_slot(self, service: VcenterApi) -> vsphere.Slot:
        """A task slot on the pool's vCenter (raises `vsphere.TaskSlotPending`: the key
        waits its pool's turn). The slot is handed over to
        this VsphereAgent when its task ends, for the VM's next task (the pass that
        needs none gives it back: `TaskWaits.give_back`)."""
        assert self.pool is not None
        return service.claim_task_slot(
            group=f"{self.pool.metadata.namespace}/{self.pool.metadata.name}",
            token=self.waits.token(self.key),
            keep=True,
        )

    def awaiting(self, service: VcenterApi, task: str) -> bool:
        """This key already waits for `task` (followed, not ended): a pass woken by
        something else (its own status write) has nothing to ask vCenter."""
        return self.waits.awaiting(self.key, vcenter=service.vcenter, task=task)

    def note(
        self,
        service: VcenterApi,
        purpose: str,
        *,
        task: str,
        about: str = "",
        vm: vsphere.VmFacts | None = None,
    ) -> None:
        """Remember for this key's next pass a task no status field records."""
        self.waits.note(self.key, purpose, vcenter=service.vcenter, task=task, about=about, vm=vm)

    def take_note(self, service: VcenterApi, purpose: str) -> Noted | None:
        """The task noted for `purpose` on this vCenter, forgotten now (read once)."""
        return self.waits.take(self.key, purpose, vcenter=service.vcenter)

    def wait_task(self, service: VcenterApi, task: str) -> Result:
        """End the pass: reconciled again when `task` (recorded in status) ends."""
        return self.waits.wait_task(self.key, vcenter=service.vcenter, task=task)


@dataclass(frozen=True, slots=True)
class VmInputs:
    """What one pass decides from: the cached VsphereAgent (`raw` and parsed), its pool,
    the pass's clock reading, the app's `Deps` (cache reads, Kubernetes writes other
    than this status) and the pass's vCenter handle. Immutable."""

    deps: Deps
    raw: JsonObj
    agent: VsphereAgent
    pool: VsphereAgentPool | None
    now: datetime
    vcenter: VcenterHandle
    spread: SpreadLedger | None = None
    """The controller's spread choices in flight (`vm_spread`); None: a fresh one."""

    @classmethod
    def of(
        cls,
        deps: Deps,
        *,
        raw: JsonObj,
        agent: VsphereAgent,
        pool: VsphereAgentPool | None,
        now: datetime,
        key: ObjectKey,
        waits: TaskWaits,
        spread: SpreadLedger | None = None,
    ) -> VmInputs:
        vcenter = VcenterHandle(deps=deps, pool=pool, key=key, waits=waits)
        return cls(
            deps=deps, raw=raw, agent=agent, pool=pool, now=now, vcenter=vcenter, spread=spread
        )

    @property
    def where(self) -> str:
        return f"VsphereAgent {self.agent.metadata.namespace}/{self.agent.metadata.name}"

    def shows_ready(self, *, ok: bool, reason: VsphereAgentReason) -> bool:
        """The cached Ready condition has this status and reason (any message)."""
        current = _cached_ready(self.agent)
        return current is not None and current.is_true == ok and current.reason == reason


def _cached_ready(agent: VsphereAgent) -> Any:
    return next(
        (c for c in agent.status.conditions if c.type == VsphereAgentConditionType.READY),
        None,
    )


@dataclass(slots=True)
class StatusWriter:
    """The one thing that writes this VsphereAgent's status (and records its events);
    every version a write stored is reported to `wrote` (the controller's
    read-your-writes guard, `kube.controller`)."""

    client: KubeClient
    events: EventRecorder
    raw: JsonObj
    agent: VsphereAgent
    now: datetime
    wrote: Callable[[str], None] | None = field(default=None, repr=False)
    _pending: list[Edit] = field(default_factory=list, repr=False)
    _pending_ready: Edit | None = field(default=None, repr=False)
    _latest: JsonObj | None = field(default=None, repr=False)
    _along: tuple[Edit, ...] = field(default=(), repr=False)

    @classmethod
    def of(
        cls, deps: Deps, inputs: VmInputs, *, wrote: Callable[[str], None] | None = None
    ) -> StatusWriter:
        return cls(
            client=deps.client,
            events=deps.events,
            raw=inputs.raw,
            agent=inputs.agent,
            now=inputs.now,
            wrote=wrote,
        )

    async def event(self, type_: EventType, reason: VmEvent, message: str) -> None:
        await self.events.record(self.raw, type=type_, reason=reason, message=message)

    def saw(self, stored: JsonObj) -> None:
        """Note the VsphereAgent as the API server returned it (a write's result)."""
        version = resource_version(stored)
        if version:
            self._latest = stored
            if self.wrote is not None:
                self.wrote(version)

    def defer(self, edit: Edit) -> None:
        """Apply `edit` with the next write of this pass, or at its end (`flush`)."""
        self._pending.append(edit)

    def along(self, edit: Edit) -> None:
        """Apply `edit` last in every write of this pass, without causing a write: it
        sets what follows from what the write holds (as `_first_phase` does)."""
        self._along = (*self._along, edit)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending) or self._pending_ready is not None

    async def flush(self) -> None:
        """Write what is pending, in one request (none when nothing is, or nothing
        changes). A VsphereAgent gone meanwhile has nothing left to record."""
        if not self.has_pending:
            return
        try:
            await self.write()
        except kerrors.NotFound:
            return

    async def write(self, *edits: Edit) -> JsonObj:
        """Apply the pending edits, then `edits`, to the fresh status (only our fields)
        in one request; returns the stored object."""
        edits = (
            *self._pending,
            *_some(self._pending_ready),
            *edits,
            self._first_phase(),
            *self._along,
        )
        self._pending, self._pending_ready = [], None
        uid = self.agent.metadata.uid

        def mutate(obj: JsonObj) -> JsonObj | None:
            if (obj.get("metadata") or {}).get("uid") != uid:
                return None
            before = copy.deepcopy(obj.get("status") or {})
            obj.setdefault("status", {})
            for edit in edits:
                edit(obj)
            return obj if obj["status"] != before else None

        stored = await self.client.update_status(
            kinds.VSPHERE_AGENT,
            namespace=self.agent.metadata.namespace,
            name=self.agent.metadata.name,
            mutate=mutate,
            start=self._latest or self.raw,  # no GET first while ours is the latest
        )
        self.saw(stored)
        return stored

    def _first_phase(self) -> Edit:
        """A VM record that has just begun (a name, no phase) gets the pool controller's
        first phase along (`phases.initial`): one write instead of two."""
        adopted = self.agent.metadata.labels.get(names.LABEL_CREATED_FOR) == (
            names.CreatedFor.ADOPTED.value
        )
        phase, reason = phases.initial(adopted=adopted)
        now = format_time(self.now)

        def edit(obj: JsonObj) -> None:
            vm = obj["status"].get("vm")
            if isinstance(vm, dict) and vm.get("name") and not vm.get("phase"):
                vm.update(phase=phase.value, reason=reason.value, lastTransitionTime=now)

        return edit

    async def ready(self, *, ok: bool, reason: VsphereAgentReason, message: str) -> None:
        """Set Ready with the pass's next write (or at its end); the last call of a pass
        wins, and nothing is written when the cache already shows exactly this."""
        current = _cached_ready(self.agent)
        if (
            current is not None
            and current.is_true == ok
            and current.reason == reason
            and current.message == message
        ):
            self._pending_ready = None
            return
        self._pending_ready = self.ready_edit(ok=ok, reason=reason, message=message)

    def ready_edit(self, *, ok: bool, reason: VsphereAgentReason, message: str) -> Edit:
        now, generation = self.now, self.agent.metadata.generation

        def edit(obj: JsonObj) -> None:
            conditions.set_condition(
                obj["status"],
                type=VsphereAgentConditionType.READY,
                value=conditions.ConditionStatus.TRUE if ok else conditions.ConditionStatus.FALSE,
                reason=reason,
                message=message,
                now=now,
                observed_generation=generation,
            )

        return edit


def _some(edit: Edit | None) -> tuple[Edit, ...]:
    return (edit,) if edit is not None else ()


def creation_edit(record: CreationRecord | None) -> Edit:
    """Set (or clear, with None) `status.creation`; setting also records `status.vm.name`."""

    def edit(obj: JsonObj) -> None:
        status = obj["status"]
        if record is None:
            status.pop("creation", None)
            return
        status["creation"] = wire.to_wire(record)
        vm = status.setdefault("vm", {})
        vm["name"] = record.vm_name
        placement_edit(record)(obj)

    return edit


def placement_edit(record: CreationRecord) -> Edit:
    """Keep the record's failure domain and host in `status.placement` (the pool's spread
    counts read it after the record is cleared); nothing without a domain."""

    def edit(obj: JsonObj) -> None:
        if record.failure_domain:
            placed = {"failureDomain": record.failure_domain}
            if record.host:
                placed["host"] = record.host
            obj["status"]["placement"] = placed

    return edit


def identity_edit(*, name: str, vm: vsphere.VmFacts | None = None) -> Edit:
    """Record the VM's name and, when known, its BIOS UUID, MAC, instance UUID, moref."""

    def edit(obj: JsonObj) -> None:
        recorded = obj["status"].setdefault("vm", {})
        recorded["name"] = name
        if vm is None:
            return
        values = {
            "biosUUID": vm.bios_uuid,
            "macAddress": identity.hyphenated_mac(vm.primary_mac),
            "instanceUUID": vm.instance_uuid,
            "moRef": vm.moid,
        }
        for key in _OURS[1:]:
            if values[key]:
                recorded[key] = values[key]

    return edit


def is_checkpointed(stored: JsonObj, record: CreationRecord) -> bool:
    """Did the server keep exactly our record? (the read-back of the checkpoint)."""
    creation = (stored.get("status") or {}).get("creation") or {}
    return bool(
        creation.get("biosUUID") == record.bios_uuid and creation.get("vmName") == record.vm_name
    )
