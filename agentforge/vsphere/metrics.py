"""The counters the vSphere layer exports (prometheus-client default registry).

Names and labels are the Go operator's, so dashboards keep working:
`agent_forge_vsphere_vm_operations_total{operation,result}` and
`agent_forge_iso_operations_total{operation,result}`; `result` is `success` or the
error class (`error`, `refused`, `not_found`...). Bytes pulled from ISO sources are
counted too, so a revalidation that downloads nothing is visible. The task cap per
vCenter shows its use: `agent_forge_vsphere_tasks_in_flight{vcenter}` and
`agent_forge_vsphere_task_slot_waiters{vcenter}`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from agentforge.vsphere.model import errors

VM_OPERATIONS = Counter(
    "agent_forge_vsphere_vm_operations_total",
    "vSphere VM operations by operation and result",
    ["operation", "result"],
)
ISO_OPERATIONS = Counter(
    "agent_forge_iso_operations_total",
    "ISO cache, upload and ejection operations by operation and result",
    ["operation", "result"],
)
TASKS_IN_FLIGHT = Gauge(
    "agent_forge_vsphere_tasks_in_flight",
    "vCenter tasks of ours in flight (or their slot reserved), per vCenter; at most "
    "--vsphere-max-tasks-in-flight, except tasks found running after a restart",
    ["vcenter"],
)
TASKS_WAITING = Gauge(
    "agent_forge_vsphere_task_slot_waiters",
    "Objects waiting for a task slot of the vCenter (its cap is reached)",
    ["vcenter"],
)
ISO_BYTES_DOWNLOADED = Counter(
    "agent_forge_iso_downloaded_bytes_total",
    "Bytes read from ISO sources (InfraEnv image service)",
)


def vm_op(operation: str, result: str) -> None:
    VM_OPERATIONS.labels(operation=operation, result=result).inc()


def iso_op(operation: str, result: str) -> None:
    ISO_OPERATIONS.labels(operation=operation, result=result).inc()


def result_of(exc: BaseException | None) -> str:
    """A low-cardinality label for an outcome."""
    if exc is None:
        return "success"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    table: tuple[tuple[type[BaseException], str], ...] = (
        (errors.OwnershipMismatch, "refused"),
        (errors.MediaMismatch, "refused"),
        (errors.QuestionRefused, "refused"),
        (errors.IsoInvalid, "invalid"),
        (errors.AlreadyExists, "conflict"),
        (errors.NotFound, "not_found"),
        (errors.PermissionDenied, "denied"),
        (errors.TransientError, "transient"),
    )
    for cls, label in table:
        if isinstance(exc, cls):
            return label
    return "error"


@dataclass
class Outcome:
    """The label a counted block reports on success; the block may refine it."""

    result: str = "success"


@contextlib.contextmanager
def counted(kind: str, operation: str) -> Iterator[Outcome]:
    """Count one operation (`kind` is "vm" or "iso") with its result label."""
    counter = VM_OPERATIONS if kind == "vm" else ISO_OPERATIONS
    outcome = Outcome()
    try:
        yield outcome
    except BaseException as exc:
        counter.labels(operation=operation, result=result_of(exc)).inc()
        raise
    counter.labels(operation=operation, result=outcome.result).inc()


@contextlib.contextmanager
def failures(kind: str, operation: str) -> Iterator[None]:
    """Count only a failure of the block: a task it starts is counted when it ends
    (by whoever reads its outcome, `vm_op`)."""
    counter = VM_OPERATIONS if kind == "vm" else ISO_OPERATIONS
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, asyncio.CancelledError):
            counter.labels(operation=operation, result=result_of(exc)).inc()
        raise
