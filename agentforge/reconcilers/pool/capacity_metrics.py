"""Pool capacity metrics (DOMAIN.md section 3), with the Go operator's names and labels.

* `agent_forge_pool_capacity{namespace,pool,state}`: the pool's counts, one series
  per `CapacityState`.
* `agent_forge_pool_vm_cpu_cores`, `agent_forge_pool_vm_memory_bytes`,
  `agent_forge_pool_vm_disk_bytes` `{namespace,pool}`: the hardware of each VM the
  pool creates (`spec.template`), so capacity in VMs converts to cores and bytes.
* `agent_forge_pool_iso_ejections{namespace,pool,reason}`: the pool's VsphereAgents
  per ISOEjected reason (`status.isoEjections`), one series per reason.
* `agent_forge_pool_spares{namespace,pool,state}`: warm spares (`status.spares`),
  `state` one of `wanted`, `ready`, `creating`.

A deleted pool's series are removed (`forget`), so dashboards never show a pool
that no longer exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from prometheus_client import Gauge

from agentforge.api.conditions import ISOEjectedReason
from agentforge.api.pool import TemplateSpec
from agentforge.reconcilers.planning.demand import Counts

MIB: Final = 1024**2
GIB: Final = 1024**3

POOL_CAPACITY: Final = Gauge(
    "agent_forge_pool_capacity",
    "Observed VsphereAgentPool capacity by pool and state.",
    ["namespace", "pool", "state"],
)
POOL_VM_CPU_CORES: Final = Gauge(
    "agent_forge_pool_vm_cpu_cores",
    "Virtual CPUs of each VM the pool creates (spec.template.numCPUs).",
    ["namespace", "pool"],
)
POOL_VM_MEMORY_BYTES: Final = Gauge(
    "agent_forge_pool_vm_memory_bytes",
    "Memory of each VM the pool creates (spec.template.memoryMiB), in bytes.",
    ["namespace", "pool"],
)
POOL_VM_DISK_BYTES: Final = Gauge(
    "agent_forge_pool_vm_disk_bytes",
    "Primary disk of each VM the pool creates (spec.template.diskGiB), in bytes.",
    ["namespace", "pool"],
)

POOL_ISO_EJECTIONS: Final = Gauge(
    "agent_forge_pool_iso_ejections",
    "VsphereAgents of the pool per reason of their ISOEjected condition.",
    ["namespace", "pool", "reason"],
)


POOL_SPARES: Final = Gauge(
    "agent_forge_pool_spares",
    "Warm spare VMs of the pool (spec.spares): wanted, ready, and being made.",
    ["namespace", "pool", "state"],
)
SPARE_STATES: Final = ("wanted", "ready", "creating")


class CapacityState(StrEnum):
    """Values of the `state` label of `agent_forge_pool_capacity`."""

    DESIRED = "desired"
    AGENT_MACHINES = "agent_machines"
    WAITING_AGENT_MACHINES = "waiting_agent_machines"
    UNREADY_AGENT_MACHINES = "unready_agent_machines"
    WITHOUT_AGENT = "without_agent"
    MATCHING_AGENTS = "matching_agents"
    BOUND_AGENTS = "bound_agents"
    AVAILABLE_AGENTS = "available_agents"
    PENDING_OWNED_VMS = "pending_owned_vms"
    DEMAND_DEFICIT = "demand_deficit"


def _values(counts: Counts) -> dict[CapacityState, int]:
    return {
        CapacityState.DESIRED: counts.desired_replicas,
        CapacityState.AGENT_MACHINES: counts.agent_machines,
        CapacityState.WAITING_AGENT_MACHINES: counts.waiting_agent_machines,
        CapacityState.UNREADY_AGENT_MACHINES: counts.unready_agent_machines,
        CapacityState.WITHOUT_AGENT: counts.agent_machines_without_agent,
        CapacityState.MATCHING_AGENTS: counts.matching_agents,
        CapacityState.BOUND_AGENTS: counts.bound_agents,
        CapacityState.AVAILABLE_AGENTS: counts.available_agents,
        CapacityState.PENDING_OWNED_VMS: counts.observed_pending,
        CapacityState.DEMAND_DEFICIT: counts.observed_deficit,
    }


def record(*, namespace: str, pool: str, counts: Counts, template: TemplateSpec) -> None:
    """Set every series of one pool."""
    for state, value in _values(counts).items():
        POOL_CAPACITY.labels(namespace, pool, state.value).set(value)
    POOL_VM_CPU_CORES.labels(namespace, pool).set(template.num_cpus)
    POOL_VM_MEMORY_BYTES.labels(namespace, pool).set(template.memory_mib * MIB)
    POOL_VM_DISK_BYTES.labels(namespace, pool).set(template.disk_gib * GIB)


def record_iso_ejections(
    *, namespace: str, pool: str, counts: Mapping[ISOEjectedReason, int]
) -> None:
    """Set one series per ISOEjected reason (zero for reasons no VsphereAgent reports)."""
    for reason in ISOEjectedReason:
        POOL_ISO_EJECTIONS.labels(namespace, pool, reason.value).set(counts.get(reason, 0))


def record_spares(*, namespace: str, pool: str, wanted: int, ready: int, creating: int) -> None:
    for spare_state, value in zip(SPARE_STATES, (wanted, ready, creating), strict=True):
        POOL_SPARES.labels(namespace, pool, spare_state).set(value)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        return


def forget(*, namespace: str, pool: str) -> None:
    """Remove every series of a deleted pool (a no-op for one never recorded)."""
    for state in CapacityState:
        _remove(POOL_CAPACITY, namespace, pool, state.value)
    for gauge in (POOL_VM_CPU_CORES, POOL_VM_MEMORY_BYTES, POOL_VM_DISK_BYTES):
        _remove(gauge, namespace, pool)
    for reason in ISOEjectedReason:
        _remove(POOL_ISO_EJECTIONS, namespace, pool, reason.value)
    for spare_state in SPARE_STATES:
        _remove(POOL_SPARES, namespace, pool, spare_state)
