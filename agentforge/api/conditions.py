"""Status conditions: the metav1.Condition shape, every type and reason we report.

Users, alerts and the e2e suite key on these strings, so they are enums rather than
literals scattered through the reconcilers. This module is the one place conditions
are read and written: `find_condition`/`condition_true` read a typed list (ours, or
another controller's as `api.views` parses it); `get_condition`/`set_condition` work
on the status dict a reconciler writes. `set_condition` reproduces client-go's
`meta.SetStatusCondition`: `lastTransitionTime` moves only when `status` changes, so
a condition rewritten on every reconcile does not look like a flapping one, and it
returns whether anything changed (write only if changed).

`ACTIONABLE` lists the (kind, condition, reason) an admin must act on, each with the
fix, and `RETRYING` the reasons a condition passes through while the operator retries
the same step; `agentforge.kube.condition_log` logs each actionable reason once when
it starts and once when it clears, never per retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Protocol, TypeVar

from pydantic import Field, WithJsonSchema

from agentforge import redaction
from agentforge.api import fields
from agentforge.api.fields import Int64, KubeModel, Time
from agentforge.api.kinds import VSPHERE_AGENT, VSPHERE_AGENT_POOL


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
    FORBIDDEN = "Forbidden"
    """Applying the plan failed because the API server refused the operator a
    permission (403): its RBAC lacks a rule (see config/rbac)."""
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
    CREDENTIALS_NAMESPACE_NOT_ALLOWED = "CredentialsNamespaceNotAllowed"
    """The credentials Secret is in a namespace the operator reads no Secrets in (outside
    --credential-namespace); it was not read."""
    VSPHERE_UNAVAILABLE = "VsphereUnavailable"
    LOGIN_FAILED = "LoginFailed"
    """vCenter refused the login (wrong user or password); the message says when the
    next attempt is allowed (a changed Secret is tried at once)."""
    LOGIN_DEFERRED = "LoginDeferred"
    """Not tried: the account used its budget of failed logins for the lockout window;
    the message says until when."""
    VCENTER_UNREACHABLE = "VcenterUnreachable"
    """vCenter did not answer within the connect/login timeout, or refused connections."""
    VCENTER_UNTRUSTED = "VcenterUntrusted"
    """vCenter's TLS certificate did not verify against the Secret's CA bundle and the
    system store."""
    FAILURE_DOMAIN_UNUSABLE = "FailureDomainUnusable"
    """A failure domain of a spread pool cannot take VMs (its cluster or datastore is
    gone, full or inaccessible, or no host of it is usable); new VMs skip it, and the
    message names each such domain and why. False only when no domain is usable."""
    # ISOReady
    ISO_CACHED = "ISOCached"
    ISO_CACHE_FAILED = "ISOCacheFailed"
    ISO_SOURCE_UNTRUSTED = "ISOSourceUntrusted"
    """The image service's TLS certificate did not verify (system store + --iso-ca-bundle)."""
    ISO_REDIRECT_REFUSED = "ISORedirectRefused"
    """The image service redirected to a URL that is not https, or too often."""
    ISO_TOO_LARGE = "ISOTooLarge"
    """The image is larger than --iso-max-size."""
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


# --- what an admin must act on ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Actionable:
    """A condition reason that needs a person, and what that person does."""

    kind: str
    type: str
    reason: str
    fix: str


_POOL, _VA = VSPHERE_AGENT_POOL.kind, VSPHERE_AGENT.kind
_P, _V = PoolConditionType, VsphereAgentConditionType

ACTIONABLE: Final[tuple[Actionable, ...]] = (
    # credentials
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.CREDENTIALS_UNAVAILABLE,
               "create the credentials Secret the pool names, or add the key the message names"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.CREDENTIALS_NOT_SHARED,
               "whoever manages the Secret's namespace lists the pool's namespace in its "
               "annotation agent-forge.containeroo.ch/allowed-namespaces, or use a Secret in "
               "the pool's namespace"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.CREDENTIALS_NAMESPACE_NOT_ALLOWED,
               "use a Secret in a namespace the message lists, or the cluster admin adds the "
               "Secret's namespace to --credential-namespace and binds "
               "agent-forge-credentials-reader there"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.LOGIN_FAILED,
               "correct username or password in the credentials Secret (a changed Secret is "
               "tried at once)"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.LOGIN_DEFERRED,
               "fix the Secrets whose password vCenter refused (pools with LoginFailed) before "
               "vCenter SSO locks the account"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.VCENTER_UNREACHABLE,
               "check the Secret's server, DNS, the NetworkPolicy's egress and vCenter itself"),
    # TLS
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.VCENTER_UNTRUSTED,
               "add the CA of vCenter's certificate to the Secret's caBundle"),
    # datastore, placement, privileges
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.VSPHERE_UNAVAILABLE,
               "fix the spec.vsphere names or the vCenter privileges the message lists"),
    Actionable(_POOL, _P.VSPHERE_READY, PoolReason.FAILURE_DOMAIN_UNUSABLE,
               "fix or remove the failure domains the message names (spec.vsphere."
               "failureDomains); until then new VMs go to the other domains"),
    # the pool's own references
    Actionable(_POOL, _P.INFRA_ENV_AVAILABLE, PoolReason.INFRA_ENV_NOT_FOUND,
               "create the InfraEnv or fix spec.infraEnvRef.name"),
    Actionable(_POOL, _P.AGENT_MACHINE_DEMAND_FOUND, PoolReason.AMBIGUOUS_POOL_MATCH,
               "delete the duplicate pools so exactly one serves the NodePool"),
    # ISO
    Actionable(_POOL, _P.ISO_READY, PoolReason.ISO_CACHE_FAILED,
               "check the InfraEnv's isoDownloadURL, the image service and the ISO datastore"),
    Actionable(_POOL, _P.ISO_READY, PoolReason.ISO_SOURCE_UNTRUSTED,
               "add the image service's CA to ConfigMap agent-forge-trusted-ca "
               "(--iso-ca-bundle)"),
    Actionable(_POOL, _P.ISO_READY, PoolReason.ISO_REDIRECT_REFUSED,
               "serve the image over https or make the InfraEnv's URL the final one"),
    Actionable(_POOL, _P.ISO_READY, PoolReason.ISO_TOO_LARGE,
               "raise --iso-max-size if the image is genuine"),
    Actionable(_POOL, _P.ISO_READY, PoolReason.ISO_INVALID,
               "fix the InfraEnv's isoDownloadURL (an expired link, a proxy's login page, a "
               "compressed image), then force a re-check with the force-iso-refresh annotation"),
    # API permissions
    Actionable(_POOL, _P.READY, PoolReason.FORBIDDEN,
               "apply config/rbac of the running version"),
    # VMs
    Actionable(_VA, _V.READY, VsphereAgentReason.VM_NAME_CONFLICT,
               "rename or remove the VM that holds the name (not made by this VsphereAgent)"),
    Actionable(_VA, _V.READY, VsphereAgentReason.VM_OWNERSHIP_MISMATCH,
               "find out who changed or replaced the VM; the operator leaves it alone"),
    Actionable(_VA, _V.READY, VsphereAgentReason.VM_CREATE_FAILED,
               "fix what vCenter refused (the message has its fault), e.g. privileges or space"),
    Actionable(_VA, _V.READY, VsphereAgentReason.VM_DELETE_FAILED,
               "fix what vCenter refused (the message has its fault)"),
    Actionable(_VA, _V.READY, VsphereAgentReason.ADOPTED_VM_UNAVAILABLE,
               "check the adopted VM named in the VsphereAgent"),
    # ejection refused or failed
    Actionable(_VA, _V.ISO_EJECTED, ISOEjectedReason.EJECTION_FAILED,
               "see the message: a refused ejection touched nothing and waits for the VM, its "
               "media or its Agent to match again; docs/iso-ejection.md"),
)  # fmt: skip
"""Every reason an admin must act on; `condition_log` logs their start and end."""

RETRYING: Final[Mapping[tuple[str, str], frozenset[str]]] = {
    (_VA, _V.READY): frozenset(
        {
            VsphereAgentReason.WAITING_FOR_ISO,
            VsphereAgentReason.VM_CREATE_PENDING,
            VsphereAgentReason.VM_CREATING,
            VsphereAgentReason.VM_DELETING,
        }
    ),
    (_VA, _V.ISO_EJECTED): frozenset({ISOEjectedReason.EJECTION_IN_PROGRESS}),
}
"""Reasons a condition passes through while the failed step is retried: they neither
start nor clear an actionable problem."""


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


class _Typed(Protocol):
    @property
    def type(self) -> str: ...


class _HasStatus(_Typed, Protocol):
    @property
    def status(self) -> str: ...


_T = TypeVar("_T", bound=_Typed)


def find_condition(conditions: Iterable[_T], type_: str) -> _T | None:
    """The condition of `type_` in a typed list (ours or another controller's), or None."""
    return next((c for c in conditions if c.type == type_), None)


def condition_true(conditions: Iterable[_HasStatus], type_: str) -> bool:
    """True when the condition of `type_` exists with status True."""
    found = find_condition(conditions, type_)
    return found is not None and found.status == ConditionStatus.TRUE


# --- writing conditions into a status dict ---------------------------------------------
# Reconcilers build the status they PUT as a dict (only the fields they own); these
# keep metav1.Condition semantics there. Messages pass `redaction.redact` (as log
# lines and Events do): a credential that reached a message never reaches status.


def format_time(moment: datetime) -> str:
    """`fields.format_time` for a condition's transition: a naive time is refused, not
    taken for UTC (the caller's clock must say where it is)."""
    if moment.tzinfo is None:
        raise ValueError("condition times must be timezone-aware")
    return fields.format_time(moment)


def get_condition(status: Mapping[str, Any] | None, /, *, type: str) -> dict[str, Any] | None:
    """The condition of `type` in a status dict, or None."""
    for condition in (status or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == type:
            return condition
    return None


def set_condition(
    status: dict[str, Any],
    /,
    *,
    type: str,
    value: ConditionStatus | str,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> bool:
    """Create or update the condition of `type` in `status`; True when it changed.

    One condition per type, others kept in order; `lastTransitionTime` is `now` only
    when the condition is new or its status changed (client-go's
    meta.SetStatusCondition). Pure: the caller passes `now`.
    """
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    desired: dict[str, Any] = {
        "type": type,
        "status": str(value),
        "reason": reason,
        "message": redaction.redact(message),
    }
    if observed_generation is not None:
        desired["observedGeneration"] = observed_generation
    current = get_condition(status, type=type)
    if current is None:
        desired["lastTransitionTime"] = format_time(now)
        conditions.append(desired)
        return True
    if current.get("status") != desired["status"] or "lastTransitionTime" not in current:
        desired["lastTransitionTime"] = format_time(now)
    else:
        desired["lastTransitionTime"] = current["lastTransitionTime"]
    if observed_generation is None and "observedGeneration" in current:
        desired["observedGeneration"] = current["observedGeneration"]
    if desired == current:
        return False
    current.clear()
    current.update(desired)
    return True
