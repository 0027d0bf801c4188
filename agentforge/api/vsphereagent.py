"""VsphereAgent (agent-forge.containeroo.ch/v1alpha1): one requested VM, and the
checkpoints that make its two slow vSphere operations safe across restarts.

Creating a VM and ejecting its discovery ISO both change vSphere in several steps.
Before the first step the intent is written to status (`status.creation`,
`status.isoEjection`) and read back; each further step is recorded before it is taken,
and the reference of each vSphere task once it has started (`taskRef`), so the next
reconcile reads how it ended instead of a worker waiting for it. Deleting the VM records
its tasks the same way (`status.deletion`). After a crash the record, not memory, says
what to resume, and a record is cleared only after success. `isoEjection` keeps every
field of the Go operator's record (`vmName`, `biosUUID`, `ownerUID`, `datacenter`,
`deviceKey`, `isoPath`, `startedAt`, `disconnectStarted`, `questionID`), so an operation
either operator recorded can be finished by the other.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import Field, field_serializer, model_validator

from agentforge.api.conditions import Conditions
from agentforge.api.fields import (
    BiosUUID,
    Count,
    DatastorePath,
    Int32,
    Int64,
    KubeModel,
    OpenEnum,
    Time,
    immutable,
    known,
)
from agentforge.api.kinds import VSPHERE_AGENT
from agentforge.api.meta import LocalObjectReference, ObjectMeta
from agentforge.api.vm import OwnedVM


class Ownership(KubeModel):
    """The ownership markers a VM carries in its extraConfig (`agentforge.owner.*`).

    A destructive step runs only when the VM's markers equal these values.
    """

    pool_namespace: str = Field(min_length=1)
    """Marker `agentforge.owner.pool-namespace`."""
    pool_name: str = Field(min_length=1)
    """Marker `agentforge.owner.pool-name`."""
    pool_uid: str = Field(min_length=1, alias="poolUID")
    """Marker `agentforge.owner.pool-uid`: a re-created pool of the same name differs."""
    vsphere_agent: str = Field(min_length=1)
    """Marker `agentforge.owner.vsphere-agent`: the VsphereAgent's name."""


class CreationPhase(StrEnum):
    """Steps of a VM creation, each recorded before it is taken."""

    RECORDED = "Recorded"
    """Intent written; nothing issued in vSphere yet."""
    CREATE_ISSUED = "CreateIssued"
    """CreateVM_Task issued: the VM may exist; find it by `biosUUID`, never create again
    before looking."""
    CREATED = "Created"
    """The VM exists and matches the record; not yet powered on."""
    POWER_ON_ISSUED = "PowerOnIssued"
    """PowerOnVM_Task issued, its moref and the VM's identity recorded. Written by earlier
    versions only: this version no longer writes it (a power-on is idempotent; the VM's
    power state tells after a restart) but still reads and resumes such a record."""


class CreationRecord(KubeModel):
    """An in-flight VM creation (`status.creation`), cleared once the VM runs.

    The BIOS UUID is chosen before creation and passed as `config.uuid`, so a restart
    finds a half-created VM by UUID even when the task reference was never recorded.
    """

    vm_name: str = Field(min_length=1, max_length=80)
    """The VM's name; also written to `status.vm.name` before creation."""
    bios_uuid: BiosUUID = Field(alias="biosUUID")
    """The BIOS UUID requested in the create spec."""
    ownership: Ownership
    """The markers written into the VM's extraConfig at creation."""
    datacenter: str = Field(min_length=1)
    """The datacenter the VM is created in (the spec may change; the record does not)."""
    folder: str = Field(min_length=1)
    """The VM folder used, for a lookup by inventory path as the last resort."""
    iso_path: DatastorePath | None = None
    """The discovery ISO inserted into the CD-ROM; counted as in use while recorded."""
    phase: OpenEnum[CreationPhase] = CreationPhase.RECORDED
    """The last step recorded before it was taken (values in `CreationPhase`). A restart
    resumes a record whatever its phase, known or not: vCenter is asked about the task and
    the VM before anything is created. `PowerOnIssued` (an earlier version's power-on, its
    moref in `taskRef`) is resumed by that moref; this version no longer writes it."""
    task_ref: str | None = None
    """The managed object reference of the last issued vSphere task, once known."""
    started_at: Time
    """When the creation was recorded."""
    attempts: Count = 0
    """Failed attempts so far (a failed, half-created VM is removed before a retry)."""
    failure_domain: str | None = None
    """The failure domain chosen before creation (`spreadPolicy: Spread`); a resumed
    creation uses it, never chooses again. Unset: the pool's own placement."""
    host: str | None = None
    """The ESXi host chosen in the domain's cluster (its name), placed at create time."""


class DeletionPhase(StrEnum):
    """The task last started to delete the VM, recorded once it has started."""

    POWER_OFF_ISSUED = "PowerOffIssued"
    """PowerOffVM_Task started; next, destroy. Written by earlier versions only (a
    power-off is idempotent: the VM's power state tells), still read and resumed."""
    DESTROY_ISSUED = "DestroyIssued"
    """Destroy_Task started; next, the VM's Agents and the finalizer."""


class DeletionRecord(KubeModel):
    """The deletion of the VM in flight (`status.deletion`), while the VsphereAgent is
    finalized: the vSphere task last started, so the next pass (or a restart) asks
    vCenter how it ended instead of waiting for it. The VM is always looked up again
    by its BIOS UUID and its markers checked before the next step."""

    vm_name: str = Field(min_length=1)
    """The VM's name (for messages; identity is the UUID)."""
    bios_uuid: BiosUUID = Field(alias="biosUUID")
    """The BIOS UUID of the VM being deleted."""
    phase: OpenEnum[DeletionPhase]
    """The step whose task was started (values in `DeletionPhase`)."""
    task_ref: str | None = None
    """The managed object reference of that task, until its outcome was reported."""
    started_at: Time
    """When the task was started."""
    attempts: Count = 0
    """Failed tasks so far."""


class ISOEjectionPhase(StrEnum):
    """Steps of an ISO ejection, each recorded before it is taken."""

    RECORDED = "Recorded"
    """VM, device and medium recorded; nothing issued yet."""
    DISCONNECT_ISSUED = "DisconnectIssued"
    """The CD-ROM reconfigure was (about to be) issued. A question pending before this
    phase was not raised by us and is never answered."""
    QUESTION_RECORDED = "QuestionRecorded"
    """A `msg.cdromdisconnect.locked` question was seen; `questionID` is recorded and
    only that question may be answered."""
    ANSWERED = "Answered"
    """The recorded question was answered Yes; waiting for the reconfigure to finish."""

    @property
    def disconnect_started(self) -> bool:
        return self is not ISOEjectionPhase.RECORDED


class ISOEjectionRecord(KubeModel):
    """An authorised ejection of one cached discovery ISO (`status.isoEjection`).

    Everything recovery checks is captured before the disconnect: a resumed operation
    touches only this VM (UUID and markers), this CD-ROM device and exactly this
    medium, and answers only the recorded question.
    """

    vm_name: str = Field(min_length=1)
    """The VM's name (for messages; identity is the UUID)."""
    bios_uuid: BiosUUID = Field(alias="biosUUID")
    """The VM's BIOS UUID; the VM is looked up by it, in `datacenter`."""
    instance_uuid: BiosUUID | None = Field(default=None, alias="instanceUUID")
    """The VM's instance UUID when known; a second identity check."""
    owner_uid: str | None = Field(default=None, alias="ownerUID")
    """The VsphereAgent's UID (the Go operator's ownership check)."""
    ownership: Ownership | None = None
    """The markers the VM must carry. Always set by this operator; absent only on a
    record the Go operator wrote, which is then checked by `ownerUID`."""
    server: str | None = None
    """The vCenter the operation began on; recovery refuses a different one."""
    datacenter: str = Field(min_length=1)
    """The datacenter of the VM at recording time."""
    device_key: Int32 = Field(ge=0)
    """The CD-ROM's device key."""
    iso_path: DatastorePath
    """The exact medium, `[datastore] path`; recovery refuses any other."""
    phase: OpenEnum[ISOEjectionPhase] = ISOEjectionPhase.RECORDED
    """The last step recorded before it was taken (values in `ISOEjectionPhase`). With a
    phase this version does not know (another version wrote it), a running disconnect is
    waited for and an emptied CD-ROM ends the operation, but nothing is issued, answered or
    dropped."""
    disconnect_started: bool = False
    """The Go operator's flag for phase >= DisconnectIssued; derived from a known `phase`,
    kept as written with an unknown one."""
    question_id: str | None = Field(default=None, alias="questionID")
    """The id of the CD-lock question, recorded before it is answered."""
    task_ref: str | None = None
    """The managed object reference of the reconfigure task, once known."""
    started_at: Time
    """When the operation was recorded."""
    attempts: Count = 0
    """Failed attempts so far (drives back-off and the EjectionFailed message)."""

    _ORDER: ClassVar[tuple[ISOEjectionPhase, ...]] = tuple(ISOEjectionPhase)

    @model_validator(mode="after")
    def _phase_from_go_record(self) -> ISOEjectionRecord:
        """A record without `phase` was written by the Go operator: derive it."""
        if "phase" not in self.model_fields_set:
            if self.question_id:
                self.phase = ISOEjectionPhase.QUESTION_RECORDED
            elif self.disconnect_started:
                self.phase = ISOEjectionPhase.DISCONNECT_ISSUED
        return self

    @property
    def known_phase(self) -> ISOEjectionPhase | None:
        """The phase, or None when another version wrote one this version does not know."""
        return known(ISOEjectionPhase, self.phase)

    @field_serializer("disconnect_started")
    def _serialize_disconnect_started(self, stored: bool) -> bool:
        phase = self.known_phase
        return phase.disconnect_started if phase is not None else stored

    def advanced(
        self,
        phase: ISOEjectionPhase,
        *,
        question_id: str | None = None,
        task_ref: str | None = None,
    ) -> ISOEjectionRecord:
        """A copy moved forward to `phase` (never backwards), with what it learned."""
        current = self.known_phase
        if current is None:
            raise ValueError(f"ISO ejection in unknown phase {self.phase!r} cannot be advanced")
        if self._ORDER.index(phase) < self._ORDER.index(current):
            raise ValueError(f"ISO ejection cannot move from {current} back to {phase}")
        if phase is ISOEjectionPhase.QUESTION_RECORDED and not (question_id or self.question_id):
            raise ValueError("QuestionRecorded needs the question id")
        update: dict[str, object] = {
            "phase": phase,
            "disconnect_started": phase.disconnect_started,
        }
        if question_id is not None:
            update["question_id"] = question_id
        if task_ref is not None:
            update["task_ref"] = task_ref
        return self.model_copy(update=update)


class PlacementRecord(KubeModel):
    """Where the VM was placed when it was created (`status.placement`): kept after the
    creation record is cleared, so a spread pool counts its VMs per domain and host."""

    failure_domain: str | None = None
    """The pool's failure domain the VM was created in."""
    host: str | None = None
    """The ESXi host the VM was created on (DRS may move it later)."""


class VsphereAgentSpec(KubeModel):
    """The desired state of a VsphereAgent."""

    pool_ref: LocalObjectReference = Field(json_schema_extra=immutable("poolRef"))
    """The VsphereAgentPool whose configuration creates and manages this VM."""


class HandoverRecord(KubeModel):
    """The pool controller's record of a VM whose AgentMachine went away before it was
    bound (`status.handover`).

    While no other AgentMachine of the pool needs it, the VM is spare (phase Released)
    and only `fromAgentMachine` and `since` are set. Handing it to an AgentMachine that
    waits for an Agent records `toAgentMachine` first and reads it back; only then does
    the VsphereAgent's selection label move, and only then is its Agent relabelled. The
    record is cleared once both name the new AgentMachine.
    """

    from_agent_machine: str = Field(min_length=1)
    """The selection label value of the AgentMachine the VM was made for or last served."""
    to_agent_machine: str | None = None
    """The AgentMachine the VM is being handed to (its name), while that runs."""
    to_agent_machine_uid: str | None = Field(default=None, alias="toAgentMachineUID")
    """That AgentMachine's UID: a re-created one of the same name is not the target."""
    since: Time
    """When the VM became spare, or when the hand-over began."""


class VsphereAgentStatus(KubeModel):
    """The observed state of a VsphereAgent."""

    observed_generation: Int64 | None = None
    """The metadata.generation last reconciled."""
    vm: OwnedVM | None = None
    """The VM; `name` is recorded before the VM is created."""
    creation: CreationRecord | None = None
    """The in-flight creation of the VM, if any."""
    placement: PlacementRecord | None = None
    """The failure domain and host chosen for the VM (spread pools only)."""
    iso_ejection: ISOEjectionRecord | None = None
    """The in-flight ejection of the discovery ISO, if any. It is finished even after
    the pool opts out, and cleared only after success."""
    handover: HandoverRecord | None = None
    """Set by the pool controller while the VM is spare or being handed to another
    AgentMachine of the pool."""
    deletion: DeletionRecord | None = None
    """The VM's deletion in flight while the VsphereAgent is deleted: the task last
    started (power off, destroy)."""
    conditions: Conditions = Field(default_factory=list)
    """Ready and ISOEjected."""


class VsphereAgent(KubeModel):
    """One vSphere VM requested to satisfy AgentMachine demand."""

    api_version: str = VSPHERE_AGENT.api_version
    kind: str = VSPHERE_AGENT.kind
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: VsphereAgentSpec
    status: VsphereAgentStatus = Field(default_factory=VsphereAgentStatus)

    @property
    def vm_name(self) -> str | None:
        """The VM's name once recorded."""
        return self.status.vm.name if self.status.vm and self.status.vm.name else None
