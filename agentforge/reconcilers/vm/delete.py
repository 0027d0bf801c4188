"""Finalizing a deleted VsphereAgent: its VM and Agent go only when provably ours (0002 step 8).

Order, each step finished before the next:

1. A recorded ISO ejection (`status.isoEjection`) is finished first, through the
   `EjectionHook` the ejection feature provides; without one the deletion waits.
2. Pool gone -> nothing can be proven (the markers name the pool's UID): the VM is
   retained, a Warning event names it, the finalizer goes. `cleanupPolicy: Retain`
   -> VM and Agent are kept, the finalizer goes.
3. Any Agent that is this VM bound to an AgentMachine or cluster -> wait (Ready=False
   `VMDeleting` and a Warning event naming it): a bound worker's VM is never
   deleted, whatever the bookkeeping says. "Is this VM" does not trust
   `status.vm.agentRef` (the pool controller may have cleared it): the Agent cache
   is asked by identity (`indexes.AGENTS_BY_IDENTITY`) for every Agent reporting the
   VM's recorded BIOS UUID, or its MAC with no BIOS UUID saying otherwise
   (`snapshot.identifies`), in any namespace; the recorded Agent counts too unless
   its identity contradicts the VM's. Asked again with the identity vSphere reports
   once the VM is found. The unbound ones of the VsphereAgent's namespace are the
   VM's Agents: each is unapproved with an optimistic lock first, so CAPI cannot
   bind it while its VM is being deleted (a pool's clean-up has done so already,
   with its unlabelling: then there is nothing to patch).
4. A creation record (`status.creation`: a create was started and not yet recorded
   as done) is resumed first, as a restart resumes it: while the recorded task, or
   any `CreateVM_Task` in the recorded folder, still runs, nothing is deleted and the
   finalizer stays (Ready=False `VMDeleting`), so a VM finished after the lookup
   cannot outlive its VsphereAgent.
5. The VM, looked up by recorded BIOS UUID (then by name in the folder), is deleted
   only if ours: markers naming this pool (UID included) and VsphereAgent, or
   unmarked with BIOS UUID and name equal to the record (stamped, then deleted, so
   the vSphere layer's own marker check guards the destroy). A VM not provably ours
   is left alone with a Warning event naming it, and its Agents are kept too.
   Deleting takes two vCenter tasks (power off, destroy), each claimed a task slot,
   started and not waited for (the destroy recorded in `status.deletion`, the
   power-off only noted in memory: `delete_tasks`): its end reconciles the
   VsphereAgent, which asks vCenter how it ended (a failure is reported, and the
   step is started again after the queue's backoff) and looks the VM up again
   before the next step.
6. The VM's Agents are deleted with uid + resourceVersion preconditions (never a
   version we did not see unbound); then the finalizer is removed. An Agent that
   cannot be tied to the VM is never deleted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from agentforge import identity, vsphere
from agentforge.api import kinds, names, rbac, views
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers.common import indexes, pool_specs
from agentforge.reconcilers.common.event_reasons import VmEvent
from agentforge.reconcilers.planning.snapshot import agent_facts, identifies, identity_conflicts
from agentforge.reconcilers.vm import create as vm_create
from agentforge.reconcilers.vm import decide as vm_decide
from agentforge.reconcilers.vm import delete_tasks as vm_delete_tasks
from agentforge.reconcilers.vm import lookup as vm_lookup
from agentforge.reconcilers.vm import stamp as vm_stamp
from agentforge.reconcilers.vm.context import Edit, StatusWriter, VmInputs
from agentforge.secret_credentials import CredentialsError

__all__ = ["EjectionHook", "finalize", "remove_finalizer"]

R = VsphereAgentReason
EJECTION_WAIT_SECONDS = 30.0
BOUND_AGENT_WAIT_SECONDS = 60.0

rbac.needs(kinds.VSPHERE_AGENT, "patch", why="add and remove the vsphere-agent finalizer")
rbac.needs(
    kinds.AGENT,
    "patch",
    "delete",
    why="unapprove, then delete, the unbound Agent of a VM deleted with its VsphereAgent",
)


class EjectionHook(Protocol):
    """The ejection feature as the `vm` controller sees it: the first `ISOEjected`
    condition carried by the write that records a new VM as up (`along`), and a recorded
    ejection finished before the VM is deleted."""

    def along(self, inputs: VmInputs) -> Edit | None:
        """An edit for `StatusWriter.along`, or None when the condition is there."""
        ...

    async def finish_before_delete(
        self,
        *,
        agent: VsphereAgent,
        pool: VsphereAgentPool | None,
        inputs: VmInputs,
        writer: StatusWriter,
    ) -> bool:
        """True when `status.isoEjection` is finished and cleared; False to wait."""
        ...


async def finalize(
    inputs: VmInputs, writer: StatusWriter, *, ejection: EjectionHook | None
) -> Result | None:
    agent, pool = inputs.agent, inputs.pool
    if names.FINALIZER_VSPHERE_AGENT not in agent.metadata.finalizers:
        return None
    if agent.status.iso_ejection is not None:
        done = ejection is not None and await ejection.finish_before_delete(
            agent=agent, pool=pool, inputs=inputs, writer=writer
        )
        if not done:
            await writer.ready(
                ok=False,
                reason=R.VM_DELETING,
                message="waiting for the recorded ISO ejection to finish before the VM goes",
            )
            return Result(requeue_after=EJECTION_WAIT_SECONDS)
    name, bios_uuid = vm_decide.recorded_identity(agent)
    vm_status = agent.status.vm
    if pool is None:
        if name or bios_uuid:
            await writer.event(
                EventType.WARNING,
                VmEvent.POOL_NOT_FOUND,
                f"VsphereAgentPool {agent.metadata.namespace}/{agent.spec.pool_ref.name} is "
                f"gone: VM {name or bios_uuid} is retained because its ownership cannot be "
                "proven; delete it by hand if it is not needed",
            )
        await remove_finalizer(inputs)
        return None
    if not pool.cleanup_enabled:
        if name or bios_uuid:
            await writer.event(
                EventType.NORMAL,
                VmEvent.VM_RETAINED,
                f"cleanupPolicy is Retain: VM {name or bios_uuid} and its Agent are kept",
            )
        await remove_finalizer(inputs)
        return None
    if not (name or bios_uuid):
        await remove_finalizer(inputs)  # no VM was ever started
        return None
    recorded_mac = identity.normalize_mac(vm_status.mac_address) if vm_status else None
    agents = _agents_of_vm(inputs, bios_uuid=bios_uuid, mac=recorded_mac)
    if agents.bound is not None:
        return await _held(inputs, writer, agents.bound, vm=name or bios_uuid or "")
    try:
        if agent.status.creation is not None:
            waiting = await _creation_settled(inputs, writer)
            if waiting is not None:
                return waiting
        outcome = await _delete_vm(
            inputs, writer, pool, name=name, bios_uuid=bios_uuid, agents=agents
        )
        if isinstance(outcome, Result):  # a task of the deletion runs
            return outcome
        if isinstance(outcome, _Tied):  # vSphere's identity of the VM ties a bound Agent
            return await _held(inputs, writer, outcome, vm=name or bios_uuid or "")
        for unbound in outcome:
            await _delete_agent(inputs, writer, unbound)
    except (vsphere.VsphereError, CredentialsError) as exc:
        message = f"deleting VM {name or bios_uuid} failed: {exc}; retried with backoff"
        await writer.ready(ok=False, reason=R.VM_DELETE_FAILED, message=message)
        await writer.event(EventType.WARNING, VmEvent.VM_DELETE_FAILED, message)
        return Result(requeue=True)
    except kerrors.Conflict:
        return Result(requeue=True)  # the Agent changed since the cache saw it: look again
    await remove_finalizer(inputs)
    return None


async def _creation_settled(inputs: VmInputs, writer: StatusWriter) -> Result | None:
    """A creation record means a create may still be running in vCenter (a crash, or a
    delete while it ran): its VM could appear after the lookup and outlive the
    VsphereAgent. The record is resumed as a restart would (`vm_lookup.look_up`:
    the recorded task is asked about, else any `CreateVM_Task` in the folder) and the
    VM is looked for only once nothing may still make it. None once settled, else the
    result of waiting (for the recorded task's end, or a while)."""
    record = inputs.agent.status.creation
    assert record is not None
    service = await inputs.vcenter.service()
    task, resumed = await vm_lookup.look_up(service, inputs, record)
    if resumed.step is not vm_decide.ResumeStep.WAIT:
        return None
    await writer.ready(
        ok=False,
        reason=R.VM_DELETING,
        message=f"waiting before deleting VM {record.vm_name}: {resumed.why}",
    )
    if task is not None and task.running:
        return inputs.vcenter.wait_task(service, task.moid)
    return Result(requeue_after=vm_create.IN_FLIGHT_RECHECK_S)


# --- which Agents are this VM's ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tied:
    """An Agent tied to the VM, and how."""

    agent: views.Agent
    how: str


@dataclass(frozen=True, slots=True)
class _AgentsOfVm:
    bound: _Tied | None
    """A bound Agent that is this VM (any namespace): the VM must stay."""
    unbound: tuple[views.Agent, ...]
    """The unbound Agents of the VsphereAgent's namespace that are this VM."""


def _agents_of_vm(
    inputs: VmInputs,
    *,
    bios_uuid: str | None,
    mac: str | None,
    already: Iterable[views.Agent] = (),
) -> _AgentsOfVm:
    """Every cached Agent tied to the VM: by identity (`snapshot.identifies`), or the
    recorded `status.vm.agentRef` whose identity does not contradict the VM's (and
    `already`: the ones tied by the recorded identity before vSphere was asked)."""
    informer = inputs.deps.informer(kinds.AGENT)
    found: dict[str, _Tied] = {}
    for earlier in already:  # as cached now: it may have been bound meanwhile
        raw = informer.get(namespace=earlier.metadata.namespace, name=earlier.metadata.name)
        if raw is not None:
            view = views.Agent.model_validate(raw)
            found[view.metadata.key] = _Tied(view, "it reports the VM's recorded identity")
    for key in dict.fromkeys(k for k in (bios_uuid, mac) if k):
        for raw in informer.by_index(indexes.AGENTS_BY_IDENTITY, key):
            facts = agent_facts(raw)
            if not identifies(bios_uuid=bios_uuid, mac=mac, agent=facts):
                continue
            by_uuid = bool(bios_uuid) and facts.bios_uuid == bios_uuid
            view = views.Agent.model_validate(raw)
            how = f"it reports the VM's {f'BIOS UUID {bios_uuid}' if by_uuid else f'MAC {mac}'}"
            found[view.metadata.key] = _Tied(view, how)
    recorded = _recorded_agent(inputs)
    if recorded is not None and not identity_conflicts(
        bios_uuid=bios_uuid, mac=mac, agent=agent_facts(recorded)
    ):
        view = views.Agent.model_validate(recorded)
        found.setdefault(view.metadata.key, _Tied(view, "it is recorded as the VM's Agent"))
    ordered = [found[k] for k in sorted(found)]
    namespace = inputs.agent.metadata.namespace
    return _AgentsOfVm(
        bound=next((t for t in ordered if t.agent.is_bound), None),
        unbound=tuple(
            t.agent
            for t in ordered
            if not t.agent.is_bound and t.agent.metadata.namespace == namespace
        ),
    )


def _recorded_agent(inputs: VmInputs) -> dict[str, Any] | None:
    vm = inputs.agent.status.vm
    ref = vm.agent_ref if vm else None
    if ref is None or not ref.name:
        return None
    return inputs.deps.informer(kinds.AGENT).get(
        namespace=ref.namespace or inputs.agent.metadata.namespace, name=ref.name
    )


async def _held(inputs: VmInputs, writer: StatusWriter, tied: _Tied, *, vm: str) -> Result:
    agent = tied.agent
    name = (
        agent.metadata.name
        if agent.metadata.namespace == inputs.agent.metadata.namespace
        else agent.metadata.key
    )
    message = (
        f"Agent {name} is bound to {agent.agent_machine_ref or 'a cluster deployment'} "
        f"({tied.how}): VM {vm} is not deleted while it serves a node; CAPI must release "
        "it first"
    )
    await writer.ready(ok=False, reason=R.VM_DELETING, message=message)
    await writer.event(EventType.WARNING, VmEvent.VM_DELETING, message)
    return Result(requeue_after=BOUND_AGENT_WAIT_SECONDS)


# --- the VM ---------------------------------------------------------------------------------


async def _delete_vm(
    inputs: VmInputs,
    writer: StatusWriter,
    pool: VsphereAgentPool,
    *,
    name: str | None,
    bios_uuid: str | None,
    agents: _AgentsOfVm,
) -> list[views.Agent] | _Tied | Result:
    """Delete the VM if ours. Returns the Agents to delete next, as now stored (after
    unapproving: their new resourceVersion is what a delete may name; none when a VM
    not ours was left alone), the bound Agent the VM as vSphere reports it is, or the
    result of a pass that started (or found running) a task of the deletion."""
    service = await inputs.vcenter.service()
    deletion = inputs.agent.status.deletion
    noted = vm_delete_tasks.noted_power_off(inputs, service, bios_uuid=bios_uuid)
    if deletion is not None and deletion.task_ref:
        ran = await vm_delete_tasks.outcome(inputs, writer, service, deletion)
    elif noted is not None:
        ran = await vm_delete_tasks.outcome(inputs, writer, service, noted[0], noted=noted[1])
    else:
        ran = False
    if isinstance(ran, Result):
        return ran
    if ran:  # destroyed, as vCenter says
        await vm_delete_tasks.gone(writer, deletion)
        return list(agents.unbound)
    record = inputs.agent.status.creation
    datacenter = record.datacenter if record else pool.spec.vsphere.datacenter
    placement = pool_specs.placement(pool)
    if record is not None:
        placement = dataclasses.replace(placement, datacenter=datacenter, folder=record.folder)
    vm = None
    if bios_uuid:
        vm = await service.vm_by_uuid(datacenter=datacenter, bios_uuid=bios_uuid)
    if vm is None and name:
        vm = await service.vm_by_name(placement=placement, name=name)
    if vm is None or vm.bios_uuid is None:
        await vm_delete_tasks.gone(writer, deletion)
        return list(agents.unbound)
    expected = pool_specs.markers(pool, vsphere_agent=inputs.agent.metadata.name)
    owned = vm_decide.ownership(vm, expected=expected, recorded_uuid=bios_uuid, recorded_name=name)
    if owned is vm_decide.Ownership.NOT_OURS:
        await writer.event(
            EventType.WARNING,
            VmEvent.VM_OWNERSHIP_MISMATCH,
            f"VM {vm.name} (BIOS UUID {vm.bios_uuid}) is not provably ours (its ownership "
            f"markers do not name {expected.describe()}): it is left alone, and so is its "
            "Agent; delete them by hand if they are not needed",
        )
        return []
    actual = _agents_of_vm(
        inputs,
        bios_uuid=identity.normalize_uuid(vm.bios_uuid),
        mac=identity.normalize_mac(vm.primary_mac),
        already=agents.unbound,
    )
    if actual.bound is not None:
        return actual.bound
    unapproved = [await _unapprove(inputs, agent) for agent in actual.unbound]
    if owned is vm_decide.Ownership.UNMARKED_MATCH:
        stamped = await vm_stamp.ensure_stamped(
            inputs.vcenter, service, datacenter=datacenter, bios_uuid=vm.bios_uuid, markers=expected
        )
        if isinstance(stamped, Result):
            return stamped  # the stamp runs; its end wakes this VsphereAgent
    started = await vm_delete_tasks.start(
        inputs, writer, service, vm=vm, datacenter=datacenter, markers=expected
    )
    if started is not None:
        return started
    return unapproved


async def _unapprove(inputs: VmInputs, agent: views.Agent) -> views.Agent:
    """`spec.approved=false` on the version seen unbound (a 409 retries the finalizer)."""
    if not agent.spec.approved:
        return agent
    stored = await inputs.deps.client.patch_merge(
        kinds.AGENT,
        namespace=agent.metadata.namespace,
        name=agent.metadata.name,
        patch={
            "metadata": {"resourceVersion": agent.metadata.resource_version},
            "spec": {"approved": False},
        },
    )
    return views.Agent.model_validate(stored)


async def _delete_agent(inputs: VmInputs, writer: StatusWriter, agent: views.Agent) -> None:
    """Delete an Agent of the VM at exactly the version seen unbound (cache or our own
    patch)."""
    if agent.is_bound:
        return
    try:
        await inputs.deps.client.delete(
            kinds.AGENT,
            namespace=agent.metadata.namespace,
            name=agent.metadata.name,
            uid=agent.metadata.uid,
            resource_version=agent.metadata.resource_version,
        )
    except kerrors.NotFound:
        return
    await writer.event(
        EventType.NORMAL,
        VmEvent.AGENT_DELETED,
        f"deleted the unbound Agent {agent.metadata.namespace}/{agent.metadata.name}",
    )


async def remove_finalizer(inputs: VmInputs) -> None:
    finalizers = list(inputs.agent.metadata.finalizers)
    if names.FINALIZER_VSPHERE_AGENT not in finalizers:
        return
    index = finalizers.index(names.FINALIZER_VSPHERE_AGENT)
    path = f"/metadata/finalizers/{index}"
    try:
        await inputs.deps.client.patch_json(
            kinds.VSPHERE_AGENT,
            namespace=inputs.agent.metadata.namespace,
            name=inputs.agent.metadata.name,
            operations=[
                {"op": "test", "path": path, "value": names.FINALIZER_VSPHERE_AGENT},
                {"op": "remove", "path": path},
            ],
        )
    except kerrors.NotFound:
        return
