"""The reasons of the Events the `vm`, `spread-rules` and `infra` controllers record.

Users and alerts filter events by reason (`kubectl get events --field-selector
reason=VMNameConflict`), so the strings are enums, spelled once. Where an event
explains a condition it carries the condition's reason.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["InfraEvent", "RuleEvent", "VmEvent"]


class VmEvent(StrEnum):
    """Events about a VsphereAgent and its VM."""

    VM_CREATING = "VMCreating"
    VM_CREATED = "VMCreated"
    VM_CREATE_FAILED = "VMCreateFailed"
    VM_NAME_CONFLICT = "VMNameConflict"
    VM_ADOPTED = "VMAdopted"
    ADOPTED_VM_UNAVAILABLE = "AdoptedVMUnavailable"
    VM_OWNERSHIP_MISMATCH = "VMOwnershipMismatch"
    VM_DELETING = "VMDeleting"
    VM_DELETE_FAILED = "VMDeleteFailed"
    VM_DELETED = "VMDeleted"
    VM_RETAINED = "VMRetained"
    POOL_NOT_FOUND = "PoolNotFound"
    AGENT_DELETED = "AgentDeleted"


class RuleEvent(StrEnum):
    """Events about a spread pool's DRS anti-affinity rules (on the pool)."""

    SPREAD_RULE_UPDATED = "SpreadRuleUpdated"
    SPREAD_RULE_FAILED = "SpreadRuleFailed"


class InfraEvent(StrEnum):
    """Events about a pool's vSphere access and ISO cache."""

    CREDENTIALS_UNAVAILABLE = "CredentialsUnavailable"
    CREDENTIALS_NOT_SHARED = "CredentialsNotShared"
    CREDENTIALS_NAMESPACE_NOT_ALLOWED = "CredentialsNamespaceNotAllowed"
    VSPHERE_UNAVAILABLE = "VsphereUnavailable"
    LOGIN_FAILED = "LoginFailed"
    LOGIN_DEFERRED = "LoginDeferred"
    VCENTER_UNREACHABLE = "VcenterUnreachable"
    VCENTER_UNTRUSTED = "VcenterUntrusted"
    INFRA_ENV_NOT_FOUND = "InfraEnvNotFound"
    ISO_URL_MISSING = "ISOURLMissing"
    ISO_CACHE_FAILED = "ISOCacheFailed"
    ISO_INVALID = "ISOInvalid"
    ISO_UPLOADED = "ISOUploaded"
    ISO_PRUNED = "ISOPruned"
    ISO_PRUNE_FAILED = "ISOPruneFailed"
