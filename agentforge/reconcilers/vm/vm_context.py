"""One `vm` reconcile's context, and the only way it writes a VsphereAgent's status.

The `pool` controller writes `status.vm.{phase,reason,agentRef,machineRef,
lastTransitionTime}` of the same objects, so every write here is `update_status` with
a mutation that touches only this controller's fields: `status.vm.{name,
biosUUID,macAddress,instanceUUID,moRef}`, `status.creation`, `status.deletion` and the
`Ready` condition; the one exception is the first phase of a record that has none yet
(`phases.initial`), which the pool controller leaves to this first write. A mutation
that finds the object replaced (another UID) writes nothing; one that changes nothing
makes no request beyond the fresh GET.

Tasks: `claim_slot` takes one of the vCenter's task slots for this VsphereAgent (in
its pool's turn, `vsphere.TaskSlotPending` when none is free) and `wait_task` ends a
pass that started (or found running) a vCenter task: the controller's `TaskWaits`
reconciles the key again when the task ends. A context made outside a controller
(no `waits`: unit tests with a stand-in service) claims no slot.

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
from typing import TYPE_CHECKING, Any

from agentforge import identity, vsphere
from agentforge.api import conditions, kinds, names, rbac, wire
from agentforge.api.conditions import VsphereAgentConditionType, VsphereAgentReason
from agentforge.api.fields import format_time
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import CreationRecord, VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.planning import phases

if TYPE_CHECKING:
    from agentforge.reconcilers.waits.task_waits import TaskWaits

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


@dataclass(slots=True)
class VmContext:
    deps: Deps
    raw: JsonObj
    agent: VsphereAgent
    pool: VsphereAgentPool | None
    now: datetime
    key: ObjectKey | None = None
    waits: TaskWaits | None = field(default=None, repr=False)
    in_flight: bool = False
    """The VM's creation waits on vCenter (a task, a slot, a create in the folder)."""
    _service: vsphere.VsphereService | None = field(default=None, repr=False)
    _pending: list[Edit] = field(default_factory=list, repr=False)
    _pending_ready: Edit | None = field(default=None, repr=False)
    _seen: list[str] = field(default_factory=list, repr=False)
    _latest: JsonObj | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        return f"VsphereAgent {self.agent.metadata.namespace}/{self.agent.metadata.name}"

    async def service(self) -> vsphere.VsphereService:
        """The pool's vSphere service; raises `deps.CredentialsError`."""
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

    def claim_slot(self, service: vsphere.VsphereService) -> vsphere.Slot | None:
        """A task slot on the pool's vCenter (raises `vsphere.TaskSlotPending`: the key
        waits its pool's turn); None outside a controller."""
        if self.waits is None or self.key is None:
            return None
        assert self.pool is not None
        return service.claim_task_slot(
            group=f"{self.pool.metadata.namespace}/{self.pool.metadata.name}",
            token=self.waits.token(self.key),
        )

    def awaiting(self, service: vsphere.VsphereService, task: str) -> bool:
        """This key already waits for `task` (followed, not ended): a pass woken by
        something else (its own status write) has nothing to ask vCenter."""
        if self.waits is None or self.key is None:
            return False
        return self.waits.awaiting(self.key, vcenter=service.vcenter, task=task)

    def wait_task(self, service: vsphere.VsphereService, task: str) -> Result:
        """End the pass: reconciled again when `task` (recorded in status) ends."""
        assert self.waits is not None
        assert self.key is not None
        self.in_flight = True
        return self.waits.wait_task(self.key, vcenter=service.vcenter, task=task)

    async def event(self, type_: EventType, reason: VmEvent, message: str) -> None:
        await self.deps.events.record(self.raw, type=type_, reason=reason, message=message)

    def saw(self, stored: JsonObj) -> None:
        """Note the VsphereAgent as the API server returned it (a write's result)."""
        version = (stored.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            self._seen.append(version)
            self._latest = stored

    def superseded(self) -> frozenset[str]:
        """The resourceVersions this pass knows to be outdated: the cached one it
        started from and the intermediate ones of its own writes (never the last)."""
        if not self._seen:
            return frozenset()
        latest = self._seen[-1]
        older = {self.agent.metadata.resource_version, *self._seen[:-1]}
        return frozenset(v for v in older if v and v != latest)

    def defer(self, edit: Edit) -> None:
        """Apply `edit` with the next write of this pass, or at its end (`flush`)."""
        self._pending.append(edit)

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
        edits = (*self._pending, *_some(self._pending_ready), *edits, self._first_phase())
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

        stored = await self.deps.client.update_status(
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

    def shows_ready(self, *, ok: bool, reason: VsphereAgentReason) -> bool:
        """The cached Ready condition has this status and reason (any message)."""
        current = next(
            (c for c in self.agent.status.conditions if c.type == VsphereAgentConditionType.READY),
            None,
        )
        return current is not None and current.is_true == ok and current.reason == reason

    async def ready(self, *, ok: bool, reason: VsphereAgentReason, message: str) -> None:
        """Set Ready with the pass's next write (or at its end); the last call of a pass
        wins, and nothing is written when the cache already shows exactly this."""
        current = next(
            (c for c in self.agent.status.conditions if c.type == VsphereAgentConditionType.READY),
            None,
        )
        if self.shows_ready(ok=ok, reason=reason) and current and current.message == message:
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
