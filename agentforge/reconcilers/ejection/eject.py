"""The `ejection` controller (key: VsphereAgent): ISO ejection after installation, and the
`vm` controller's deletion hook.

What it promises (the seed's "Discovery ISO lifecycle"; decisions in `gate` and
`decide`, steps in `run`):

* Opt-in per pool (`spec.iso.ejectAfterInstall`); off keeps today's media. On covers
  the pool's existing installed workers, adopted VMs included, because the gate looks
  at every VsphereAgent's Agent, not at events.
* A VsphereAgent **with** a record (`status.isoEjection`) resumes exactly that
  operation before anything else is started for its VM, whatever the pool's setting,
  and the record is cleared only after success. Deletion waits for it too
  (`finish_before_delete`), so a recorded ejection finishes before the VM goes.
* A VsphereAgent **without** a record decides from the cache alone (no vSphere call):
  `Ejected` is kept, `NoOwnedMedia` too while opted in; opted out -> `Disabled`;
  Released VM (or a phase this version does not know, until the pool controller
  recomputes it), deleting Machine or Agent -> no new ejection; otherwise the Agent
  must report `Installed=True`. Only then is the VM read once, ownership, hardware
  identity and the candidate CD-ROM checked, and the intent recorded and read back
  before vSphere is touched; with no CD-ROM holding one of the pool's cached ISOs
  but something attached, the VM reports `NoOwnedMedia` (never `Ejected`: nothing
  was ejected) and nothing is touched. A record the API server pruned (an old CRD)
  stops everything with `EjectionFailed` saying to update the CRDs.
* Steady state costs nothing: an Ejected, NoOwnedMedia, Disabled or waiting
  VsphereAgent makes no vSphere call and no write.

Its own controller and queue (`controller`), with the `vm` controller's pass machinery
and watches. Serialised with the `vm` controller's creation and deletion of the same VM
(docs/design/0009): a pass of either holds the key's lock (`Deps.vm_keys`), and which
one acts is decided from the stored VsphereAgent: this controller acts only on a VM
recorded as up (`Ready=True`) and not deleting; the `vm` controller leaves a VM alone
while `status.isoEjection` is recorded, and when it is deleting finishes that record
itself (`finish_before_delete`) before the VM goes.
"""

from __future__ import annotations

import logging
from typing import Final

from agentforge import vsphere
from agentforge.api import conditions, kinds, names, views
from agentforge.api.conditions import (
    ISOEjectedReason,
    VsphereAgentConditionType,
    VsphereAgentReason,
)
from agentforge.api.fields import known
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vm import VMPhase, VMReason
from agentforge.api.vsphereagent import ISOEjectionRecord, Ownership, VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Controller, Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import indexes, pool_specs
from agentforge.reconcilers.common.deps import DEFAULT_RETRY_BASE, Deps
from agentforge.reconcilers.ejection import gate, run, status
from agentforge.reconcilers.ejection.run import CrashPoint, reached
from agentforge.reconcilers.vm import reconcile as vm_reconcile
from agentforge.reconcilers.vm.context import Edit, JsonObj, StatusWriter, VmInputs
from agentforge.secret_credentials import CredentialsError
from agentforge.vsphere import metrics as vmetrics

__all__ = ["CONTROLLER_NAME", "Ejection", "controller"]

CONTROLLER_NAME: Final = "ejection"

log = logging.getLogger(__name__)

R = ISOEjectedReason
E = status.EjectionEvent
_VM_UP: Final = (VsphereAgentReason.VM_READY, VsphereAgentReason.VM_ADOPTED)


def controller(deps: Deps, *, retry_base: float = DEFAULT_RETRY_BASE) -> Controller:
    """The `ejection` controller: its own queue keyed by VsphereAgent (see the module doc)."""
    return vm_reconcile.controller(
        deps, name=CONTROLLER_NAME, step=Ejection().reconcile, retry_base=retry_base
    )


class Ejection:
    """The `ejection` controller's pass, and the `vm` controller's `EjectionHook`."""

    async def reconcile(self, inputs: VmInputs, writer: StatusWriter) -> Result | None:
        """Resume a recorded ejection, or start one when the gate allows; never raises
        for a VsphereAgent that vanished meanwhile."""
        pool = inputs.pool
        if pool is None or inputs.agent.metadata.deleting:
            return None
        try:
            record = inputs.agent.status.iso_ejection
            if record is not None:
                return (await _resume(inputs, writer, pool, record, finalizing=False)).result
            if not _vm_up(inputs):
                return None  # the vm controller's: its Ready=True write wakes this key
            return await _maybe_start(inputs, writer, pool)
        except kerrors.NotFound:
            return None

    def along(self, inputs: VmInputs) -> Edit | None:
        """The first `ISOEjected` condition, for the `vm` controller's write that records
        the VM as up: what this controller's first pass would decide from the cache
        (the gate's hold), set only when that write holds the VM up (`status.vm` with a
        BIOS UUID, Ready=True VMReady/VMAdopted) and neither a condition nor a record, so
        a new VM costs one status write less (docs/design/0009). A gate that would start
        an ejection sets nothing: starting is this controller's."""
        pool = inputs.pool
        if pool is None or inputs.agent.metadata.deleting or _has_iso_condition(inputs):
            return None
        generation, now = inputs.agent.metadata.generation, inputs.now

        def edit(obj: JsonObj) -> None:
            stored = obj["status"]
            vm = stored.get("vm")
            if stored.get("isoEjection") or not isinstance(vm, dict) or not vm.get("biosUUID"):
                return
            if not _shows_up(stored) or _iso_condition(stored) is not None:
                return
            agent = _agent(inputs)
            decision = gate.gate(
                enabled=pool.spec.iso.eject_after_install,
                pool=f"{pool.metadata.namespace}/{pool.metadata.name}",
                current=None,
                vm_name=str(vm.get("name") or "") or None,
                vm_ready=True,
                released=vm.get("phase") == VMPhase.RELEASED.value,
                machine_deleting=_machine_deleting(inputs, pool),
                agent=agent,
                unmatched=_unmatched(inputs, pool) if agent is None else None,
            )
            if isinstance(decision, gate.Hold) and decision.reason is not None:
                status.set_condition(
                    stored, decision.reason, decision.message, now=now, generation=generation
                )

        return edit

    async def finish_before_delete(
        self,
        *,
        agent: VsphereAgent,
        pool: VsphereAgentPool | None,
        inputs: VmInputs,
        writer: StatusWriter,
    ) -> bool:
        """True once no ejection is recorded (finished, or moot); False to wait."""
        record = agent.status.iso_ejection
        if record is None:
            return True
        if pool is None:
            await status.emit(
                inputs,
                EventType.WARNING,
                E.ABANDONED,
                f"VsphereAgentPool {agent.metadata.namespace}/{agent.spec.pool_ref.name} is gone, "
                f"so the recorded ejection of {record.iso_path} from CD-ROM {record.device_key} of "
                f"VM {record.vm_name} cannot be finished; the VM is retained: check in vSphere "
                "that its CD-ROM holds no pending question",
            )
            return True
        try:
            return (await _resume(inputs, writer, pool, record, finalizing=True)).done
        except kerrors.NotFound:
            return True


async def _resume(
    inputs: VmInputs,
    writer: StatusWriter,
    pool: VsphereAgentPool,
    record: ISOEjectionRecord,
    *,
    finalizing: bool,
) -> run.Finished:
    """The recorded operation only: read the VM by the recorded UUID, then carry on."""
    try:
        service = await inputs.vcenter.service()
        if record.task_ref and inputs.vcenter.awaiting(service, record.task_ref):
            # (a pass woken by our own write while the reconfigure runs: nothing to ask)
            return run.Finished(False, inputs.vcenter.wait_task(service, record.task_ref))
        vm = await service.vm_by_uuid(datacenter=record.datacenter, bios_uuid=record.bios_uuid)
    except (CredentialsError, vsphere.VsphereError) as exc:
        await status.failed(
            inputs,
            writer,
            record,
            f"reading VM {record.vm_name} failed: {exc}",
            result=_result_of(exc),
        )
        return run.Finished(False, Result(requeue=True))
    return await run.carry_out(
        inputs, writer, service=service, pool=pool, record=record, vm=vm, finalizing=finalizing
    )


async def _maybe_start(
    inputs: VmInputs, writer: StatusWriter, pool: VsphereAgentPool
) -> Result | None:
    agent = _agent(inputs)
    recorded = inputs.agent.status.vm
    if recorded is not None and recorded.phase and known(VMPhase, recorded.phase) is None:
        # Another version's phase (it may mean Released): start nothing. The pool
        # controller recomputes the phase, and its write wakes this VsphereAgent again.
        return None
    decision = gate.gate(
        enabled=pool.spec.iso.eject_after_install,
        pool=f"{pool.metadata.namespace}/{pool.metadata.name}",
        current=status.current_reason(inputs),
        vm_name=recorded.name if recorded else None,
        vm_ready=_vm_up(inputs),
        released=bool(recorded and recorded.phase is VMPhase.RELEASED),
        machine_deleting=_machine_deleting(inputs, pool),
        agent=agent,
        unmatched=_unmatched(inputs, pool) if agent is None else None,
    )
    if isinstance(decision, gate.Hold):
        if decision.reason is not None and not status.shows(
            inputs, decision.reason, decision.message
        ):
            # with what the pass has pending (a new VM's Ready and identity): one write
            await writer.write(
                status.condition_edit(
                    inputs, expect=None, reason=decision.reason, message=decision.message
                )
            )
        return None
    assert agent is not None
    assert recorded is not None
    assert recorded.bios_uuid
    return await _start(inputs, writer, pool, agent, bios_uuid=recorded.bios_uuid)


async def _start(
    inputs: VmInputs,
    writer: StatusWriter,
    pool: VsphereAgentPool,
    agent: views.Agent,
    *,
    bios_uuid: str,
) -> Result | None:
    datacenter = pool.spec.vsphere.datacenter
    try:
        service = await inputs.vcenter.service()
        vm = await service.vm_by_uuid(datacenter=datacenter, bios_uuid=bios_uuid)
    except (CredentialsError, vsphere.VsphereError) as exc:
        await status.failed(
            inputs,
            writer,
            None,
            f"reading VM with BIOS UUID {bios_uuid} failed: {exc}",
            result=_result_of(exc),
        )
        return Result(requeue=True)
    expected = pool_specs.markers(pool, vsphere_agent=inputs.agent.metadata.name)
    plan = gate.plan_start(
        vm=vm,
        vm_name=(inputs.agent.status.vm.name if inputs.agent.status.vm else None) or "",
        bios_uuid=bios_uuid,
        datacenter=datacenter,
        expected=expected,
        agent=agent,
        datastore=pool.spec.vsphere.iso_datastore,
        prefix=pool.effective_path_prefix(),
    )
    if plan.cdrom is None or vm is None:
        if plan.reason in (R.EJECTED, R.NO_OWNED_MEDIA):  # nothing to eject: say what is there
            if not status.shows(inputs, plan.reason, plan.message):
                await status.write(
                    inputs, writer, expect=None, reason=plan.reason, message=plan.message
                )
            return None
        await status.failed(inputs, writer, None, plan.message)
        return Result(requeue=True)
    record = ISOEjectionRecord(
        vm_name=vm.name,
        bios_uuid=bios_uuid,
        instance_uuid=vm.instance_uuid,
        owner_uid=inputs.agent.metadata.uid,
        ownership=Ownership(
            pool_namespace=expected.pool_namespace,
            pool_name=expected.pool_name,
            pool_uid=expected.pool_uid,
            vsphere_agent=expected.vsphere_agent,
        ),
        server=service.vcenter,
        datacenter=datacenter,
        device_key=plan.cdrom.key,
        iso_path=plan.cdrom.backing_file or "",
        started_at=inputs.now,
    )
    # The record alone first: were the condition written with it, an old CRD (which
    # keeps conditions but prunes the record) would flip the condition on every retry.
    written = await status.write(inputs, writer, expect=None, record=record)
    if not written.applied:
        return Result(requeue_after=run.STALE_SECONDS)
    if not status.same_record(written.stored, record):
        await status.failed(
            inputs, writer, written.stored, status.CRDS_OUTDATED, event=E.CRDS_OUTDATED
        )
        return Result(requeue=True)
    await status.emit(
        inputs,
        EventType.NORMAL,
        E.STARTED,
        f"Agent {agent.metadata.name} reports Installed=True: ejecting {record.iso_path} from "
        f"CD-ROM {record.device_key} of VM {record.vm_name}",
    )
    reached(CrashPoint.RECORDED)
    finished = await run.carry_out(
        inputs, writer, service=service, pool=pool, record=record, vm=vm, finalizing=False
    )
    return finished.result


def _has_iso_condition(inputs: VmInputs) -> bool:
    return any(
        c.type == VsphereAgentConditionType.ISO_EJECTED for c in inputs.agent.status.conditions
    )


def _iso_condition(stored: JsonObj) -> JsonObj | None:
    return conditions.get_condition(stored, type=VsphereAgentConditionType.ISO_EJECTED)


def _shows_up(stored: JsonObj) -> bool:
    """A raw status (a write's) says Ready=True with a reason of a VM that is up."""
    ready = conditions.get_condition(stored, type=VsphereAgentConditionType.READY)
    if ready is None or ready.get("status") != "True":
        return False
    return str(ready.get("reason")) in _VM_UP


def _vm_up(inputs: VmInputs) -> bool:
    """The stored VsphereAgent records its VM as created or adopted (`Ready=True`)."""
    recorded = inputs.agent.status.vm
    return bool(recorded and recorded.bios_uuid) and any(
        inputs.shows_ready(ok=True, reason=r) for r in _VM_UP
    )


def _result_of(exc: Exception) -> str:
    return vmetrics.result_of(exc) if isinstance(exc, vsphere.VsphereError) else "error"


def _agent(inputs: VmInputs) -> views.Agent | None:
    """The Agent matched to the VM (`status.vm.agentRef`), from the cache."""
    vm = inputs.agent.status.vm
    ref = vm.agent_ref if vm else None
    if ref is None or not ref.name:
        return None
    raw = inputs.deps.informer(kinds.AGENT).get(
        namespace=ref.namespace or inputs.agent.metadata.namespace, name=ref.name
    )
    return views.Agent.model_validate(raw) if raw is not None else None


_ONCE_MATCHED: Final = frozenset({VMPhase.AVAILABLE, VMPhase.BOUND, VMPhase.RELEASED})


def _unmatched(inputs: VmInputs, pool: VsphereAgentPool) -> gate.Unmatched | None:
    """What the gate says about a VM without an Agent: whether one was matched before
    and, only then (a rare state, so the InfraEnv's Agents are looked through), the
    Agents that still claim the VM by its selection label or its MAC."""
    vm = inputs.agent.status.vm
    if vm is None:
        return None
    once = bool(vm.agent_ref and vm.agent_ref.name) or vm.phase in _ONCE_MATCHED
    once = once or (vm.phase is VMPhase.ORPHANED and vm.reason == VMReason.AGENT_MISSING)
    if not once:
        return gate.Unmatched(once_matched=False)
    selection = inputs.agent.metadata.labels.get(names.LABEL_AGENT_MACHINE)
    key = indexes.namespaced_key(pool.metadata.namespace, pool.spec.infra_env_ref.name)
    claimants = []
    for raw in inputs.deps.informer(kinds.AGENT).by_index(indexes.AGENTS_BY_INFRA_ENV, key):
        agent = views.Agent.model_validate(raw)
        labelled = bool(selection) and agent.metadata.labels.get(names.LABEL_AGENT_MACHINE) == (
            selection
        )
        if labelled or (vm.mac is not None and vm.mac in agent.mac_addresses):
            claimants.append(agent)
    claimants.sort(key=lambda a: a.metadata.name)
    return gate.Unmatched(
        once_matched=True,
        phase="/".join(str(p) for p in (vm.phase, vm.reason) if p),
        bios_uuid=vm.bios_uuid,
        mac=vm.mac,
        claimants=tuple(claimants),
    )


def _machine_deleting(inputs: VmInputs, pool: VsphereAgentPool) -> str | None:
    """The recorded Machine's name when it is deleting or already gone, else None."""
    vm = inputs.agent.status.vm
    ref = vm.machine_ref if vm else None
    machines = inputs.deps.informers.get(kinds.MACHINE)
    if ref is None or not ref.name or machines is None:
        return None
    raw = machines.get(namespace=ref.namespace or pool.spec.control_plane_namespace, name=ref.name)
    if raw is None:
        return f"{ref.name} (gone)"
    return ref.name if views.Machine.model_validate(raw).is_deleting else None
