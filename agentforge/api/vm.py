"""The record of one VM, shared by a pool's `status.ownedVMs[]` and `VsphereAgent.status.vm`.

The shape is the Go operator's OwnedVMStatus, field for field, so status written by
either operator parses in the other; `moRef` and `instanceUUID` are optional
additions that let a lookup go BIOS UUID -> instance UUID -> name, as CAPV does.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, Field

from agentforge import identity
from agentforge.api.fields import KubeModel, OpenEnum, Time
from agentforge.api.meta import ObjectReference


class VMPhase(StrEnum):
    """Where an owned VM is in its life (DOMAIN.md section 3)."""

    PROVISIONING = "Provisioning"
    """Created, no Agent discovered yet (Orphaned after 30 minutes)."""
    AVAILABLE = "Available"
    """Its Agent is prepared and unbound."""
    BOUND = "Bound"
    """Its Agent is bound to an AgentMachine."""
    RELEASED = "Released"
    """Unbound after being bound, or its Machine is deleting or gone; or spare: its
    AgentMachine went away (or got another Agent) before the VM was bound."""
    ORPHANED = "Orphaned"
    """Its Agent vanished, never appeared in time, or is bound elsewhere."""


class VMReason(StrEnum):
    """Machine-readable explanations of a VM's phase."""

    AGENT_PENDING = "AgentPending"
    """Provisioning: no Agent discovered yet. How far the VM's creation got is the
    VsphereAgent's `Ready` condition and `status.creation` (the `vm` controller's)."""
    VM_CREATE_PENDING = "VMCreatePending"
    """Written by earlier versions and the Go operator only (now `AgentPending`)."""
    VM_CREATING = "VMCreating"
    """Written by earlier versions and the Go operator only (now `AgentPending`)."""
    VM_CREATED = "VMCreated"
    """Written by earlier versions and the Go operator only (now `AgentPending`)."""
    VM_ADOPTED = "VMAdopted"
    """Provisioning, for an adopted VM (no Agent discovered yet)."""
    AGENT_AVAILABLE = "AgentAvailable"
    AGENT_BOUND = "AgentBound"
    AGENT_UNBOUND = "AgentUnbound"
    MACHINE_DELETED = "MachineDeleted"
    MACHINE_DELETING = "MachineDeleting"
    AGENT_MISSING = "AgentMissing"
    DISCOVERY_TIMEOUT = "DiscoveryTimeout"
    AGENT_MACHINE_SERVED = "AgentMachineServed"
    """Released, spare: its AgentMachine is bound to the Agent of another VM."""
    AGENT_BOUND_ELSEWHERE = "AgentBoundElsewhere"
    """Orphaned: an Agent that is this VM is bound to another cluster, or claimed by
    another pool; the VM serves none of this pool's AgentMachines."""


class VMSource(StrEnum):
    """Whether a VM is backed by a VsphereAgent or was only seen through an Agent."""

    VSPHERE_AGENT = "VsphereAgent"
    DISCOVERED_AGENT = "DiscoveredAgent"


def _lenient_mac(value: object) -> object:
    """Store MACs in the Go operator's hyphen form; leave malformed input to fail."""
    if isinstance(value, str) and value:
        return identity.hyphenated_mac(value) or value
    return value


def _lenient_uuid(value: object) -> object:
    if isinstance(value, str) and value:
        return identity.normalize_uuid(value) or value
    return value


# Well-formed values are normalised on input; anything else is kept as written (the
# Go operator's CRD has no pattern here, and a status must always parse).
MacAddress = Annotated[str, BeforeValidator(_lenient_mac)]
"""A MAC in the Go operator's status form (`00-50-56-aa-bb-cc`); colons accepted on input."""

LenientUUID = Annotated[str, BeforeValidator(_lenient_uuid)]
"""A UUID, lower-case 8-4-4-4-12 when well-formed."""


class OwnedVM(KubeModel):
    """A VM created (or adopted) for a pool, and what is known about it."""

    name: str
    """The vSphere VM name."""
    bios_uuid: LenientUUID | None = Field(default=None, alias="biosUUID")
    """The VM's BIOS UUID (`config.uuid`), once known; the primary identity."""
    instance_uuid: LenientUUID | None = Field(default=None, alias="instanceUUID")
    """The VM's vCenter instance UUID, once known; a second identity."""
    mo_ref: str | None = Field(default=None, max_length=64)
    """The VM's managed object reference value (e.g. `vm-42`), once known."""
    mac_address: MacAddress | None = None
    """The primary NIC's MAC address, normalised with hyphens."""
    owner_uid: str | None = Field(default=None, alias="ownerUID")
    """The UID of the VsphereAgent recorded in the VM's ownership markers."""
    agent_ref: ObjectReference | None = None
    """The Assisted Installer Agent matched to this VM."""
    machine_ref: ObjectReference | None = None
    """The CAPI Machine, while bound."""
    phase: OpenEnum[VMPhase] | None = None
    """Where the VM is in its life: Provisioning, Available, Bound, Released or Orphaned
    (values in `VMPhase`); another value, written by another version, is recomputed by the
    pool controller."""
    reason: str | None = None
    """A short machine-readable explanation of the phase (values in `VMReason`)."""
    source: OpenEnum[VMSource] | None = None
    """VsphereAgent, or DiscoveredAgent for a VM only seen through an Agent (never
    cleaned up automatically; values in `VMSource`)."""
    last_transition_time: Time | None = None
    """When the phase last changed."""

    @property
    def mac(self) -> str | None:
        """The MAC in canonical lower-case colon form, for comparisons."""
        return identity.normalize_mac(self.mac_address)
