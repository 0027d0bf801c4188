"""Adopted VsphereAgents (`created-for: adopted`): take over an existing VM, never create one.

The user names the VM in annotation `vm-name` and may pin it with `vm-bios-uuid`.
Two steps, each recorded before the next (0002 step 7):

1. Record: the VM is looked up (by the pinned UUID, else by name in the pool's
   folder); when its name (and the pinned UUID) match, `status.vm.{name,biosUUID}` is
   written. That record is what every later step compares with.
2. Take over: the VM is looked up by the recorded UUID; its name and UUID must match
   the record. Our markers -> adopted; unmarked -> our markers are stamped (a task
   started, not waited for: `vm_stamp`); another owner's markers ->
   `VMOwnershipMismatch`, nothing touched. Then MAC and the rest
   of the identity are recorded and Ready=True `VMAdopted`.

A VM that cannot be found is reported (`AdoptedVMUnavailable`) and looked for again
with the queue's backoff; nothing is ever created for an adopted VsphereAgent.
"""

from __future__ import annotations

from agentforge import identity, vsphere
from agentforge.api import names
from agentforge.api.conditions import VsphereAgentReason
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm import stamp as vm_stamp
from agentforge.reconcilers.vm.context import StatusWriter, VmInputs, identity_edit
from agentforge.secret_credentials import CredentialsError

__all__ = ["ensure_adopted", "is_adopted"]

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
