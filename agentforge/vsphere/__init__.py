"""The operator's hands in vCenter: an async service over pyVmomi. Knows nothing of Kubernetes.

Entry points: `SessionRegistry` (one shared login per whole credential, guarded
against lockouts and black holes, owned by the app),
`VsphereService` (the narrow API the reconcilers call), and the frozen value types
they exchange. Everything raises `errors.VsphereError` subclasses.
"""

from agentforge.vsphere.iso.datastore_files import DatastoreFile, Location
from agentforge.vsphere.iso.image_http import CaBundle, CaBundleFile, Proxies
from agentforge.vsphere.iso.pipeline import (
    IsoAccess,
    IsoLimits,
    IsoRecord,
    IsoResult,
    IsoSource,
    Validators,
)
from agentforge.vsphere.model.errors import (
    UNTRUSTED_CERTIFICATE_FAULT,
    AlreadyExists,
    ConnectionFailed,
    CreationInFlight,
    InvalidSpec,
    InvalidState,
    IsoDownloadFailed,
    IsoInvalid,
    IsoRedirectRefused,
    IsoSourceError,
    IsoSourceUntrusted,
    LoginDeferred,
    LoginFailed,
    LoginPending,
    MediaMismatch,
    NetworkError,
    NotFound,
    OwnershipMismatch,
    PermissionDenied,
    QuestionRefused,
    SessionExpired,
    SessionUnavailable,
    SizeLimitExceeded,
    TaskFailed,
    TaskSlotPending,
    TransientError,
    VcenterUnreachable,
    VsphereError,
)
from agentforge.vsphere.model.facts import EjectOutcome, EjectState, TaskFacts, TaskState
from agentforge.vsphere.model.markers import OwnershipMarkers, Verdict
from agentforge.vsphere.service import VsphereService
from agentforge.vsphere.session.credentials import AccountKey, Credentials, SessionKey
from agentforge.vsphere.session.logins import LoginPolicy
from agentforge.vsphere.session.registry import WAIT_FOR_LOGIN, SessionRegistry, TaskNews
from agentforge.vsphere.session.vcenter_session import Session, SessionOptions
from agentforge.vsphere.tasks.slots import Slot, TaskSlots
from agentforge.vsphere.vm.build_specs import Firmware, Hardware, NicType, ScsiType
from agentforge.vsphere.vm.compute_cluster import HostState
from agentforge.vsphere.vm.owned import DeleteStep
from agentforge.vsphere.vm.provision import Started, VmRequest
from agentforge.vsphere.vm.read_facts import (
    Cdrom,
    Choice,
    MediumKind,
    PowerState,
    Question,
    VmFacts,
)
from agentforge.vsphere.vm.resolve_placement import Placement, PlacementInvalid, Problem

__all__ = [
    "UNTRUSTED_CERTIFICATE_FAULT",
    "WAIT_FOR_LOGIN",
    "AccountKey",
    "AlreadyExists",
    "CaBundle",
    "CaBundleFile",
    "Cdrom",
    "Choice",
    "ConnectionFailed",
    "CreationInFlight",
    "Credentials",
    "DatastoreFile",
    "DeleteStep",
    "EjectOutcome",
    "EjectState",
    "Firmware",
    "Hardware",
    "HostState",
    "InvalidSpec",
    "InvalidState",
    "IsoAccess",
    "IsoDownloadFailed",
    "IsoInvalid",
    "IsoLimits",
    "IsoRecord",
    "IsoRedirectRefused",
    "IsoResult",
    "IsoSource",
    "IsoSourceError",
    "IsoSourceUntrusted",
    "Location",
    "LoginDeferred",
    "LoginFailed",
    "LoginPending",
    "LoginPolicy",
    "MediaMismatch",
    "MediumKind",
    "NetworkError",
    "NicType",
    "NotFound",
    "OwnershipMarkers",
    "OwnershipMismatch",
    "PermissionDenied",
    "Placement",
    "PlacementInvalid",
    "PowerState",
    "Problem",
    "Proxies",
    "Question",
    "QuestionRefused",
    "ScsiType",
    "Session",
    "SessionExpired",
    "SessionKey",
    "SessionOptions",
    "SessionRegistry",
    "SessionUnavailable",
    "SizeLimitExceeded",
    "Slot",
    "Started",
    "TaskFacts",
    "TaskFailed",
    "TaskNews",
    "TaskSlotPending",
    "TaskSlots",
    "TaskState",
    "TransientError",
    "Validators",
    "VcenterUnreachable",
    "Verdict",
    "VmFacts",
    "VmRequest",
    "VsphereError",
    "VsphereService",
]
