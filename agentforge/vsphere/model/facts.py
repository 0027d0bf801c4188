"""What the operator knows about a VM, as frozen values (pure: no pyVmomi, no I/O).

`vsphere.facts` reads them from vCenter in one PropertyCollector round trip. The facts
cover identity (name, BIOS and instance UUID, primary MAC), power state, ownership
markers, every CD-ROM (device key, backing file, connection state) and a pending
question, which is all that the reconcilers and the ejection recovery need to decide.
A task we started is known by its `TaskFacts` (state, result, typed error).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from agentforge.vsphere.model import errors, markers
from agentforge.vsphere.model.markers import OwnershipMarkers

CDROM_LOCK_MESSAGE = "msg.cdromdisconnect.locked"
"""The message id of the question vCenter asks when a guest has locked its CD-ROM."""


class PowerState(enum.Enum):
    ON = "poweredOn"
    OFF = "poweredOff"
    SUSPENDED = "suspended"
    UNKNOWN = "unknown"


class MediumKind(enum.Enum):
    ISO = "iso"
    CLIENT = "client"
    HOST = "host"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Cdrom:
    key: int
    controller_key: int
    unit_number: int
    kind: MediumKind
    backing_file: str | None
    connected: bool
    start_connected: bool

    def is_empty(self) -> bool:
        """Disconnected and holding no ISO: what a finished eject leaves behind."""
        return self.kind is not MediumKind.ISO and not self.connected and not self.start_connected


@dataclass(frozen=True, slots=True)
class Choice:
    key: str
    label: str


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    text: str
    message_ids: tuple[str, ...]
    choices: tuple[Choice, ...]

    @property
    def is_cdrom_lock(self) -> bool:
        return CDROM_LOCK_MESSAGE in self.message_ids


@dataclass(frozen=True, slots=True)
class VmFacts:
    moid: str
    name: str
    bios_uuid: str | None
    instance_uuid: str | None
    primary_mac: str | None
    macs: tuple[str, ...]
    power_state: PowerState
    markers: Mapping[str, str]
    cdroms: tuple[Cdrom, ...]
    question: Question | None

    @property
    def ownership(self) -> OwnershipMarkers | None:
        return markers.parse(self.markers)

    def cdrom(self, key: int) -> Cdrom | None:
        return next((c for c in self.cdroms if c.key == key), None)


class TaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TaskFacts:
    moid: str
    state: TaskState
    description_id: str = ""
    result_moid: str | None = None
    """The moref of `info.result` when it is a managed object (a created VM)."""
    error: errors.VsphereError | None = None
    """The task's fault, typed as every other error of this layer."""

    @property
    def running(self) -> bool:
        return self.state in (TaskState.QUEUED, TaskState.RUNNING)


class EjectState(enum.Enum):
    EJECTED = "Ejected"
    QUESTION_PENDING = "QuestionPending"
    NOT_EJECTED = "NotEjected"
    IN_PROGRESS = "InProgress"
    """The reconfigure runs and no question is pending yet; it is followed."""


@dataclass(frozen=True, slots=True)
class EjectOutcome:
    """What an eject started or resumed found (`vsphere.vm.cdrom`)."""

    state: EjectState
    vm_moid: str
    device_key: int
    task_id: str | None = None
    question: Question | None = None
    cdrom: Cdrom | None = None
    already: bool = False
