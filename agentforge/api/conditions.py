"""Status conditions: the metav1.Condition shape, every type and reason we report.

Users, alerts and the e2e suite key on these strings, so they are enums rather than
literals scattered through the reconcilers. `set_condition` reproduces client-go's
`meta.SetStatusCondition`: `lastTransitionTime` moves only when `status` changes, so
a condition rewritten on every reconcile does not look like a flapping one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import Field, WithJsonSchema

from agentforge.api.fields import Int64, KubeModel, Time


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class PoolConditionType(StrEnum):
    """Condition types on a VsphereAgentPool."""

    READY = "Ready"
    AGENT_MACHINE_DEMAND_FOUND = "AgentMachineDemandFound"
    INFRA_ENV_AVAILABLE = "InfraEnvAvailable"
    CAPACITY_SATISFIED = "CapacitySatisfied"
    VSPHERE_READY = "VsphereReady"
    ISO_READY = "ISOReady"


class VsphereAgentConditionType(StrEnum):
    """Condition types on a VsphereAgent."""

    READY = "Ready"
    ISO_EJECTED = "ISOEjected"


class PoolReason(StrEnum):
    """Reasons of the pool's conditions (grouped by the condition they explain)."""

    # Ready
    RECONCILED = "Reconciled"
    RECONCILE_FAILED = "ReconcileFailed"
    DELETING = "Deleting"
    AWAITING_CHECKS = "AwaitingChecks"
    # AgentMachineDemandFound
    AGENT_MACHINES_FOUND = "AgentMachinesFound"
    NO_AGENT_MACHINES = "NoAgentMachines"
    AMBIGUOUS_POOL_MATCH = "AmbiguousPoolMatch"
    # InfraEnvAvailable
    INFRA_ENV_READY = "InfraEnvReady"
    INFRA_ENV_NOT_FOUND = "InfraEnvNotFound"
    INFRA_ENV_IMAGE_NOT_CREATED = "ImageNotCreated"
    # CapacitySatisfied
    CAPACITY_SATISFIED = "CapacitySatisfied"
    DEMAND_DEFICIT = "DemandDeficit"
    PROVISIONING = "Provisioning"
    # VsphereReady
    VSPHERE_CONNECTED = "VsphereConnected"
    CREDENTIALS_UNAVAILABLE = "CredentialsUnavailable"
    CREDENTIALS_NOT_SHARED = "CredentialsNotShared"
    VSPHERE_UNAVAILABLE = "VsphereUnavailable"
    LOGIN_FAILED = "LoginFailed"
    """vCenter refused the login (wrong user or password); the message says when the
    next attempt is allowed (a changed Secret is tried at once)."""
    LOGIN_DEFERRED = "LoginDeferred"
    """Not tried: the account used its budget of failed logins for the lockout window;
    the message says until when."""
    VCENTER_UNREACHABLE = "VcenterUnreachable"
    """vCenter did not answer within the connect/login timeout, or refused connections."""
    # ISOReady
    ISO_CACHED = "ISOCached"
    ISO_CACHE_FAILED = "ISOCacheFailed"
    ISO_INVALID = "ISOInvalid"
    """The image service answered, but not with a bootable ISO 9660 image (an HTML or
    JSON error page, an archive, a tiny or truncated body): nothing was uploaded, and
    the ISO cached before, if any, stays in use."""
    ISO_PRUNE_FAILED = "ISOPruneFailed"
    WAITING_FOR_INFRA_ENV = "WaitingForInfraEnv"


class VsphereAgentReason(StrEnum):
    """Reasons of a VsphereAgent's Ready condition."""

    POOL_NOT_FOUND = "PoolNotFound"
    WAITING_FOR_ISO = "WaitingForISO"
    VM_NAME_CONFLICT = "VMNameConflict"
    VM_CREATE_PENDING = "VMCreatePending"
    VM_CREATING = "VMCreating"
    VM_CREATE_FAILED = "VMCreateFailed"
    VM_READY = "VMReady"
    VM_ADOPTED = "VMAdopted"
    ADOPTED_VM_UNAVAILABLE = "AdoptedVMUnavailable"
    VM_DELETING = "VMDeleting"
    VM_DELETE_FAILED = "VMDeleteFailed"
    VM_OWNERSHIP_MISMATCH = "VMOwnershipMismatch"


class ISOEjectedReason(StrEnum):
    """Reasons of a VsphereAgent's ISOEjected condition (the seed's five, and
    `NoOwnedMedia`: nothing of the pool's was there to eject)."""

    DISABLED = "Disabled"
    """The pool has not opted in (`spec.iso.ejectAfterInstall` is false)."""
    WAITING_FOR_INSTALLATION = "WaitingForInstallation"
    """Opted in; the Agent does not report Installed=True yet."""
    EJECTION_IN_PROGRESS = "EjectionInProgress"
    """A recorded ejection (`status.isoEjection`) is being carried out."""
    EJECTED = "Ejected"
    """The discovery ISO was disconnected and ejected (status True): by agent-forge, or
    found so (every CD-ROM disconnected and empty); the message says which."""
    EJECTION_FAILED = "EjectionFailed"
    """The last attempt failed; it is retried, the message says why."""
    NO_OWNED_MEDIA = "NoOwnedMedia"
    """Installed, but no CD-ROM of the VM holds one of the pool's cached ISOs
    (`[<isoDatastore>] <pathPrefix>/<sha256>.iso`) while something else is attached (a
    look-alike file, a device): nothing was ejected, and what is attached stays (the
    message names each medium and why it is not the pool's). Not counted as ejected;
    looked at again when the Agent is installed again."""


# --- the Condition shape -------------------------------------------------------------

CONDITION_TYPE_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

# The schema of metav1.Condition exactly as controller-gen emits it for the Go operator.
CONDITIONS_SCHEMA: Final[dict[str, Any]] = {
    "type": "array",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["lastTransitionTime", "message", "reason", "status", "type"],
        "properties": {
            "type": {"type": "string", "maxLength": 316, "pattern": CONDITION_TYPE_PATTERN},
            "status": {"type": "string", "enum": [s.value for s in ConditionStatus]},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "pattern": CONDITION_REASON_PATTERN,
            },
            "message": {"type": "string", "maxLength": 32768},
        },
    },
}


class Condition(KubeModel):
    """One aspect of an object's state (metav1.Condition)."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN)
    status: ConditionStatus
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    message: str = Field(default="", max_length=32768)
    last_transition_time: Time
    observed_generation: Annotated[Int64, Field(ge=0)] | None = None

    @property
    def is_true(self) -> bool:
        return self.status == ConditionStatus.TRUE


Conditions = Annotated[list[Condition], WithJsonSchema(CONDITIONS_SCHEMA)]
"""A `conditions` list keyed by type (listType=map), as every status here carries."""


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of `type_`, or None."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    *,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime,
) -> list[Condition]:
    """A new list with `type_` set; other conditions and their order are kept.

    The transition time is `now` only when the condition is new or its status
    changed, as client-go's meta.SetStatusCondition does.
    """
    previous = find_condition(conditions, type_)
    transition = (
        previous.last_transition_time if previous is not None and previous.status == status else now
    )
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=transition,
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    """A new list without `type_`."""
    return [c for c in conditions if c.type != type_]
