"""The pool conditions the `pool` controller decides, and how Ready combines them all.

The `pool` controller owns AgentMachineDemandFound, InfraEnvAvailable,
CapacitySatisfied and Ready; the `infra` controller owns VsphereReady and ISOReady.
Ready says whether the pool can do its job: it is True only when the InfraEnv
serves an ISO, vSphere answers, the ISO is cached and no AgentMachine is claimed by
two pools. A capacity deficit is normal while VMs boot, so it does not make the pool
unready. `ready` is a pure function of the other conditions so the controller can
recompute it from the freshest VsphereReady/ISOReady inside its status write.

Messages name the object and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentforge.api import names
from agentforge.api.conditions import ConditionStatus, PoolConditionType, PoolReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.planning.demand import Counts
from agentforge.reconcilers.planning.snapshot import InfraEnvFacts


@dataclass(frozen=True, slots=True)
class ConditionDecision:
    type: PoolConditionType
    status: ConditionStatus
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Observed:
    """A condition another controller wrote: only what Ready needs of it."""

    status: str
    reason: str
    message: str


def _where(pool: VsphereAgentPool) -> str:
    return f"VsphereAgentPool {pool.metadata.namespace}/{pool.metadata.name}"


def demand_found(
    *, pool: VsphereAgentPool, agent_machines: int, competing: Sequence[str]
) -> ConditionDecision:
    annotation = f"{names.ANNOTATION_NODEPOOL}={pool.node_pool_annotation()}"
    namespace = pool.spec.control_plane_namespace
    if competing:
        others = ", ".join(f"{pool.metadata.namespace}/{p}" for p in sorted(competing))
        return ConditionDecision(
            PoolConditionType.AGENT_MACHINE_DEMAND_FOUND,
            ConditionStatus.FALSE,
            PoolReason.AMBIGUOUS_POOL_MATCH,
            f"AgentMachines in {namespace} with {annotation} also match {others}; "
            "delete the duplicate pools or point them at another NodePool so exactly one "
            "pool serves it (no VMs are created or cleaned up meanwhile)",
        )
    if agent_machines == 0:
        return ConditionDecision(
            PoolConditionType.AGENT_MACHINE_DEMAND_FOUND,
            ConditionStatus.FALSE,
            PoolReason.NO_AGENT_MACHINES,
            f"no AgentMachine in {namespace} carries {annotation}; normal for a NodePool "
            "scaled to zero, otherwise check spec.controlPlaneNamespace and spec.nodePoolRef",
        )
    return ConditionDecision(
        PoolConditionType.AGENT_MACHINE_DEMAND_FOUND,
        ConditionStatus.TRUE,
        PoolReason.AGENT_MACHINES_FOUND,
        f"{agent_machines} AgentMachine(s) in {namespace} carry {annotation}",
    )


def infra_env_available(
    *, pool: VsphereAgentPool, infra_env: InfraEnvFacts | None
) -> ConditionDecision:
    ref = f"InfraEnv {pool.metadata.namespace}/{pool.spec.infra_env_ref.name}"
    if infra_env is None:
        return ConditionDecision(
            PoolConditionType.INFRA_ENV_AVAILABLE,
            ConditionStatus.FALSE,
            PoolReason.INFRA_ENV_NOT_FOUND,
            f"{ref} does not exist; create it or fix spec.infraEnvRef.name of {_where(pool)}",
        )
    if not infra_env.iso_url:
        detail = f" ({infra_env.image_message})" if infra_env.image_message else ""
        return ConditionDecision(
            PoolConditionType.INFRA_ENV_AVAILABLE,
            ConditionStatus.FALSE,
            PoolReason.INFRA_ENV_IMAGE_NOT_CREATED,
            f"{ref} has no status.isoDownloadURL yet{detail}; "
            "check its ImageCreated condition and the Assisted Installer service",
        )
    return ConditionDecision(
        PoolConditionType.INFRA_ENV_AVAILABLE,
        ConditionStatus.TRUE,
        PoolReason.INFRA_ENV_READY,
        f"{ref} serves a discovery ISO",
    )


def capacity_satisfied(*, counts: Counts) -> ConditionDecision:
    summary = (
        f"agentMachines={counts.agent_machines} waiting={counts.waiting_agent_machines} "
        f"withoutAgent={counts.agent_machines_without_agent} "
        f"pendingOwnedVMs={counts.pending_owned_vms} boundAgents={counts.bound_agents} "
        f"availableAgents={counts.available_agents}"
    )
    if counts.demand_deficit > 0:
        return ConditionDecision(
            PoolConditionType.CAPACITY_SATISFIED,
            ConditionStatus.FALSE,
            PoolReason.DEMAND_DEFICIT,
            f"{counts.demand_deficit} AgentMachine(s) lack an Agent and no VM is pending "
            f"for them ({summary}); VsphereAgents are created for each waiting "
            "AgentMachine, see the AgentMachines' events if this persists",
        )
    if counts.waiting_agent_machines > 0 or counts.agent_machines_without_agent > 0:
        return ConditionDecision(
            PoolConditionType.CAPACITY_SATISFIED,
            ConditionStatus.FALSE,
            PoolReason.PROVISIONING,
            f"VMs are being provisioned for waiting AgentMachines ({summary})",
        )
    return ConditionDecision(
        PoolConditionType.CAPACITY_SATISFIED,
        ConditionStatus.TRUE,
        PoolReason.CAPACITY_SATISFIED,
        f"every AgentMachine has an Agent ({summary})",
    )


def ready(
    *,
    decided: Sequence[ConditionDecision],
    vsphere: Observed | None,
    iso: Observed | None,
) -> ConditionDecision:
    """Ready from the pool's own decisions and the `infra` controller's conditions."""
    by_type = {d.type: d for d in decided}
    blockers: list[tuple[str, str, str]] = []
    demand = by_type.get(PoolConditionType.AGENT_MACHINE_DEMAND_FOUND)
    if demand is not None and demand.reason == PoolReason.AMBIGUOUS_POOL_MATCH:
        blockers.append((demand.type, demand.reason, demand.message))
    infra = by_type.get(PoolConditionType.INFRA_ENV_AVAILABLE)
    if infra is not None and infra.status != ConditionStatus.TRUE:
        blockers.append((infra.type, infra.reason, infra.message))
    waiting: list[str] = []
    for type_, observed in (
        (PoolConditionType.VSPHERE_READY, vsphere),
        (PoolConditionType.ISO_READY, iso),
    ):
        if observed is None or observed.status == ConditionStatus.UNKNOWN:
            waiting.append(type_)
        elif observed.status != ConditionStatus.TRUE:
            blockers.append((type_, observed.reason, observed.message))
    if blockers:
        blocker, reason, message = blockers[0]
        return ConditionDecision(
            PoolConditionType.READY,
            ConditionStatus.FALSE,
            reason or PoolReason.RECONCILE_FAILED,
            f"{blocker} is not True: {message}",
        )
    if waiting:
        return ConditionDecision(
            PoolConditionType.READY,
            ConditionStatus.UNKNOWN,
            PoolReason.AWAITING_CHECKS,
            f"waiting for {' and '.join(waiting)} to be reported",
        )
    return ConditionDecision(
        PoolConditionType.READY,
        ConditionStatus.TRUE,
        PoolReason.RECONCILED,
        "the InfraEnv serves an ISO, vSphere is reachable and the ISO is cached",
    )


def failed(*, message: str, forbidden: bool = False) -> ConditionDecision:
    """Ready when applying the plan failed (the controller retries); `forbidden`: the
    API server refused the operator a permission, which only an admin can grant."""
    reason = PoolReason.FORBIDDEN if forbidden else PoolReason.RECONCILE_FAILED
    return ConditionDecision(PoolConditionType.READY, ConditionStatus.FALSE, reason, message)


def deleting(*, remaining: int) -> ConditionDecision:
    return ConditionDecision(
        PoolConditionType.READY,
        ConditionStatus.FALSE,
        PoolReason.DELETING,
        f"deleting: waiting for {remaining} VsphereAgent(s) to release their VMs",
    )
