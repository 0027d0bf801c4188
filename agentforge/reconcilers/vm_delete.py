"""Finalizing a deleted VsphereAgent: its VM and Agent go only when provably ours (0002 step 8).

Order, each step finished before the next:

1. A recorded ISO ejection (`status.isoEjection`) is finished first, through the
   `EjectionHook` the ejection feature provides; without one the deletion waits.
2. Pool gone -> nothing can be proven (the markers name the pool's UID): the VM is
   retained, a Warning event names it, the finalizer goes. `cleanupPolicy: Retain`
   -> VM and Agent are kept, the finalizer goes.
3. The recorded Agent (`status.vm.agentRef`, read from the cache) bound to an
   AgentMachine or cluster -> wait: a bound worker's VM is never deleted. An unbound
   one is unapproved with an optimistic lock first, so CAPI cannot bind it while its
   VM is being deleted.
4. The VM, looked up by recorded BIOS UUID (then by name in the folder), is deleted
   only if ours: markers naming this pool (UID included) and VsphereAgent, or
   unmarked with BIOS UUID and name equal to the record (stamped, then deleted, so
   the vSphere layer's own marker check guards the destroy). A VM not provably ours
   is left alone with a Warning event naming it, and its Agent is kept too.
5. The Agent is deleted with uid + resourceVersion preconditions (never a version
   we did not see unbound); then the finalizer is removed.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from agentforge import vsphere
from agentforge.api import kinds, names, rbac, views
from agentforge.api.conditions import VsphereAgentReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import VsphereAgent
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Result
from agentforge.kube.events import EventType
from agentforge.reconcilers import pool_specs, vm_decide
from agentforge.reconcilers.deps import CredentialsError
from agentforge.reconcilers.event_reasons import VmEvent
from agentforge.reconcilers.vm_context import VmContext

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
    """Finishes a recorded ISO ejection before the VM is deleted (the ejection feature)."""

    async def finish_before_delete(
        self, *, agent: VsphereAgent, pool: VsphereAgentPool | None, ctx: VmContext
    ) -> bool:
        """True when `status.isoEjection` is finished and cleared; False to wait."""
        ...


async def finalize(ctx: VmContext, *, ejection: EjectionHook | None) -> Result | None:
    agent, pool = ctx.agent, ctx.pool
    if names.FINALIZER_VSPHERE_AGENT not in agent.metadata.finalizers:
        return None
    if agent.status.iso_ejection is not None:
        done = ejection is not None and await ejection.finish_before_delete(
            agent=agent, pool=pool, ctx=ctx
        )
        if not done:
            await ctx.ready(
                ok=False,
                reason=R.VM_DELETING,
                message="waiting for the recorded ISO ejection to finish before the VM goes",
            )
            return Result(requeue_after=EJECTION_WAIT_SECONDS)
    name, bios_uuid = vm_decide.recorded_identity(agent)
    if pool is None:
        if name or bios_uuid:
            await ctx.event(
                EventType.WARNING,
                VmEvent.POOL_NOT_FOUND,
                f"VsphereAgentPool {agent.metadata.namespace}/{agent.spec.pool_ref.name} is "
                f"gone: VM {name or bios_uuid} is retained because its ownership cannot be "
                "proven; delete it by hand if it is not needed",
            )
        await remove_finalizer(ctx)
        return None
    if not pool.cleanup_enabled:
        if name or bios_uuid:
            await ctx.event(
                EventType.NORMAL,
                VmEvent.VM_RETAINED,
                f"cleanupPolicy is Retain: VM {name or bios_uuid} and its Agent are kept",
            )
        await remove_finalizer(ctx)
        return None
    if not (name or bios_uuid):
        await remove_finalizer(ctx)  # no VM was ever started
        return None
    found = _agent(ctx)
    if found is not None and found.is_bound:
        message = (
            f"Agent {found.metadata.name} is bound to "
            f"{found.agent_machine_ref or 'a cluster deployment'}: VM {name} is not deleted "
            "while it serves a node; CAPI must release it first"
        )
        await ctx.ready(ok=False, reason=R.VM_DELETING, message=message)
        await ctx.event(EventType.WARNING, VmEvent.VM_DELETING, message)
        return Result(requeue_after=BOUND_AGENT_WAIT_SECONDS)
    try:
        kept, found = await _delete_vm(ctx, pool, name=name, bios_uuid=bios_uuid, agent=found)
        if not kept and found is not None:
            await _delete_agent(ctx, found)
    except (vsphere.VsphereError, CredentialsError) as exc:
        message = f"deleting VM {name or bios_uuid} failed: {exc}; retried with backoff"
        await ctx.ready(ok=False, reason=R.VM_DELETE_FAILED, message=message)
        await ctx.event(EventType.WARNING, VmEvent.VM_DELETE_FAILED, message)
        return Result(requeue=True)
    except kerrors.Conflict:
        return Result(requeue=True)  # the Agent changed since the cache saw it: look again
    await remove_finalizer(ctx)
    return None


def _agent(ctx: VmContext) -> views.Agent | None:
    vm = ctx.agent.status.vm
    ref = vm.agent_ref if vm else None
    if ref is None or not ref.name:
        return None
    raw = ctx.deps.informer(kinds.AGENT).get(
        namespace=ref.namespace or ctx.agent.metadata.namespace, name=ref.name
    )
    return views.Agent.model_validate(raw) if raw is not None else None


async def _delete_vm(
    ctx: VmContext,
    pool: VsphereAgentPool,
    *,
    name: str | None,
    bios_uuid: str | None,
    agent: views.Agent | None,
) -> tuple[bool, views.Agent | None]:
    """Delete the VM if ours. Returns (a VM not ours was left alone, the Agent as now
    stored: after unapproving it, its new resourceVersion is what a delete may name)."""
    service = await ctx.service()
    record = ctx.agent.status.creation
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
        return False, agent
    expected = pool_specs.markers(pool, vsphere_agent=ctx.agent.metadata.name)
    owned = vm_decide.ownership(vm, expected=expected, recorded_uuid=bios_uuid, recorded_name=name)
    if owned is vm_decide.Ownership.NOT_OURS:
        await ctx.event(
            EventType.WARNING,
            VmEvent.VM_OWNERSHIP_MISMATCH,
            f"VM {vm.name} (BIOS UUID {vm.bios_uuid}) is not provably ours (its ownership "
            f"markers do not name {expected.describe()}): it is left alone, and so is its "
            "Agent; delete them by hand if they are not needed",
        )
        return True, agent
    if agent is not None:
        agent = await _unapprove(ctx, agent)
    if owned is vm_decide.Ownership.UNMARKED_MATCH:
        await service.stamp_markers(datacenter=datacenter, bios_uuid=vm.bios_uuid, markers=expected)
    await service.delete_vm(datacenter=datacenter, bios_uuid=vm.bios_uuid, markers=expected)
    await ctx.event(
        EventType.NORMAL, VmEvent.VM_DELETED, f"deleted VM {vm.name} (BIOS UUID {vm.bios_uuid})"
    )
    return False, agent


async def _unapprove(ctx: VmContext, agent: views.Agent) -> views.Agent:
    """`spec.approved=false` on the version seen unbound (a 409 retries the finalizer)."""
    if not agent.spec.approved:
        return agent
    stored = await ctx.deps.client.patch_merge(
        kinds.AGENT,
        namespace=agent.metadata.namespace,
        name=agent.metadata.name,
        patch={
            "metadata": {"resourceVersion": agent.metadata.resource_version},
            "spec": {"approved": False},
        },
    )
    return views.Agent.model_validate(stored)


async def _delete_agent(ctx: VmContext, agent: views.Agent) -> None:
    """Delete the Agent at exactly the version seen unbound (cache or our own patch)."""
    if agent.is_bound:
        return
    try:
        await ctx.deps.client.delete(
            kinds.AGENT,
            namespace=agent.metadata.namespace,
            name=agent.metadata.name,
            uid=agent.metadata.uid,
            resource_version=agent.metadata.resource_version,
        )
    except kerrors.NotFound:
        return
    await ctx.event(
        EventType.NORMAL,
        VmEvent.AGENT_DELETED,
        f"deleted the unbound Agent {agent.metadata.namespace}/{agent.metadata.name}",
    )


async def remove_finalizer(ctx: VmContext) -> None:
    finalizers = list(ctx.agent.metadata.finalizers)
    if names.FINALIZER_VSPHERE_AGENT not in finalizers:
        return
    index = finalizers.index(names.FINALIZER_VSPHERE_AGENT)
    path = f"/metadata/finalizers/{index}"
    try:
        await ctx.deps.client.patch_json(
            kinds.VSPHERE_AGENT,
            namespace=ctx.agent.metadata.namespace,
            name=ctx.agent.metadata.name,
            operations=[
                {"op": "test", "path": path, "value": names.FINALIZER_VSPHERE_AGENT},
                {"op": "remove", "path": path},
            ],
        )
    except kerrors.NotFound:
        return
