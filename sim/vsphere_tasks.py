"""Running vCenter tasks the one way the operator does, for tests and benchmarks.

There is one task model (docs/design/0005): claim a task slot, start the task, record
its moref, and come back when the task's end wakes the key. `TaskDriver` does exactly
that with the production pieces: `VsphereService`'s starts, the session registry's
news and the controllers' `TaskWaits` (each operation a key of its own), then reads
the outcome by the moref as the next pass does. Nothing here waits on vCenter other
than through that news, so a test or a benchmark measures what production runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Callable

from agentforge import vsphere
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.waits import TaskWaits

__all__ = ["TaskDriver"]

GROUP = "driver"
"""The task slot group (the pool, for a controller) every operation here waits in."""

Start = Callable[[vsphere.Slot], Awaitable[str | None]]


class TaskDriver:
    """Claims slots, starts tasks and hears their end through `registry`'s news."""

    def __init__(self, registry: vsphere.SessionRegistry) -> None:
        self.waits = TaskWaits(registry, controller="driver")
        self.waits.bind(self._woken)
        self._events: dict[ObjectKey, asyncio.Event] = {}
        self._keys = itertools.count()

    def close(self) -> None:
        self.waits.unsubscribe()

    # --- the task model -------------------------------------------------------------

    async def run(self, service: vsphere.VsphereService, start: Start) -> vsphere.TaskFacts | None:
        """Claim a slot, `start(slot)` a task, come back when it ended: its facts (None:
        nothing was started). A failed task raises its typed error."""
        key = self._key()
        try:
            task = await start(await self.slot(service, key))
            if task is None:
                return None
            done = await self.ended(service, key, task)
        finally:
            self.waits.forget(key)
        if done.error is not None:
            raise done.error
        return done

    async def slot(self, service: vsphere.VsphereService, key: ObjectKey) -> vsphere.Slot:
        """A task slot for `key`, in its turn (woken by the registry when one is free)."""
        while True:
            woken = self._arm(key)
            try:
                return service.claim_task_slot(group=GROUP, token=self.waits.token(key))
            except vsphere.TaskSlotPending:
                await woken.wait()

    async def ended(
        self, service: vsphere.VsphereService, key: ObjectKey, task: str
    ) -> vsphere.TaskFacts:
        """Come back when `task` (followed since it started) ended, or its VM asked a
        question, then read it by its moref."""
        woken = self._arm(key)
        self.waits.wait_task(key, vcenter=service.vcenter, task=task)
        await woken.wait()
        return await service.task(task_ref=task)

    # --- VM operations as the vm controller runs them --------------------------------

    async def create(
        self, service: vsphere.VsphereService, request: vsphere.VmRequest
    ) -> vsphere.VmFacts:
        """Create the VM (or take over ours of that name), then, unless it runs, converge
        it (tags, power on): its facts."""
        started: list[vsphere.Started] = []

        async def start(slot: vsphere.Slot) -> str | None:
            started.append(await service.start_create(request=request, slot=slot))
            return started[-1].task

        created = await self.run(service, start)
        existing = started[-1].existing
        vm_moid = created.result_moid if created is not None else None
        if existing is not None:
            vm_moid = existing.moid
        if vm_moid is None:
            raise vsphere.NotFound(f"VM {request.name}: created, but no VM", subject=request.name)
        moid: str = vm_moid
        if existing is not None and existing.power_state is vsphere.PowerState.ON:
            return existing  # (ours, running: done, as the vm controller decides)
        await self.run(
            service, lambda slot: service.converge_vm(request=request, vm_moid=moid, slot=slot)
        )
        got = await service.vm_by_moid(moid=moid)  # (powered on: its devices connected)
        if got is None:
            raise vsphere.NotFound(f"VM {request.name} vanished", subject=request.name)
        return got

    async def delete(
        self,
        service: vsphere.VsphereService,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
    ) -> bool:
        """Power off, then destroy our VM: True, or False when it was gone already."""
        steps: list[str] = []

        async def start(slot: vsphere.Slot) -> str | None:
            step = await service.start_delete(
                datacenter=datacenter, bios_uuid=bios_uuid, markers=markers, slot=slot
            )
            steps.append(step.action)
            return step.task

        while steps[-1:] != ["destroy"]:
            if await self.run(service, start) is None:
                return len(steps) > 1
        return True

    async def stamp(
        self,
        service: vsphere.VsphereService,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
    ) -> vsphere.VmFacts:
        """Our markers on an unmarked VM (nothing when ours already): its facts."""
        seen: list[vsphere.VmFacts] = []

        async def start(slot: vsphere.Slot) -> str | None:
            vm, task = await service.start_stamp(
                datacenter=datacenter, bios_uuid=bios_uuid, markers=markers, slot=slot
            )
            seen.append(vm)
            return task

        if await self.run(service, start) is None:
            return seen[-1]
        got = await service.vm_by_uuid(datacenter=datacenter, bios_uuid=bios_uuid)
        if got is None:
            raise vsphere.NotFound(f"VM {bios_uuid} vanished", subject=bios_uuid)
        return got

    async def eject(
        self,
        service: vsphere.VsphereService,
        *,
        datacenter: str,
        vm_uuid: str,
        device_key: int,
        expected_backing: str,
        markers: vsphere.OwnershipMarkers,
    ) -> vsphere.EjectOutcome:
        """Start the disconnect, then `settle` it."""
        key = self._key()
        try:
            outcome = await service.eject_cdrom(
                datacenter=datacenter,
                vm_uuid=vm_uuid,
                device_key=device_key,
                expected_backing=expected_backing,
                markers=markers,
                slot=await self.slot(service, key),
            )
            return await self._settle(service, key, outcome, datacenter, vm_uuid)
        finally:
            self.waits.forget(key)

    async def settle(
        self, service: vsphere.VsphereService, *, datacenter: str, vm_uuid: str, device_key: int
    ) -> vsphere.EjectOutcome:
        """The disconnect's outcome once it no longer runs without a question (its
        question pending, ejected, or not), as the ejection resumes and observes it; a
        failed reconfigure raises its typed error."""
        key = self._key()
        try:
            outcome = await service.resume_eject(
                datacenter=datacenter, vm_uuid=vm_uuid, device_key=device_key
            )
            return await self._settle(service, key, outcome, datacenter, vm_uuid)
        finally:
            self.waits.forget(key)

    async def _settle(
        self,
        service: vsphere.VsphereService,
        key: ObjectKey,
        outcome: vsphere.EjectOutcome,
        datacenter: str,
        vm_uuid: str,
    ) -> vsphere.EjectOutcome:
        while outcome.state is vsphere.EjectState.IN_PROGRESS and outcome.task_id:
            task = await self.ended(service, key, outcome.task_id)
            if task.running:  # the VM asks a question: the ejection resumes
                outcome = await service.resume_eject(
                    datacenter=datacenter, vm_uuid=vm_uuid, device_key=outcome.device_key
                )
                continue
            if task.error is not None:
                raise task.error
            # ended: the VM's facts decide, as the ejection's next pass reads them
            got = await service.vm_by_uuid(datacenter=datacenter, bios_uuid=vm_uuid)
            device = got.cdrom(outcome.device_key) if got is not None else None
            empty = device is not None and device.is_empty()
            return dataclasses.replace(
                outcome,
                state=vsphere.EjectState.EJECTED if empty else vsphere.EjectState.NOT_EJECTED,
                cdrom=device,
            )
        return outcome

    # --- keys -----------------------------------------------------------------------

    def _key(self) -> ObjectKey:
        return ObjectKey(f"driver/op-{next(self._keys)}")

    def _arm(self, key: ObjectKey) -> asyncio.Event:
        event = self._events[key] = asyncio.Event()
        return event

    def _woken(self, key: ObjectKey) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.set()
