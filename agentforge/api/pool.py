"""VsphereAgentPool (agent-forge.containeroo.ch/v1alpha1): one NodePool's VM capacity.

Wire-compatible with the Go operator: the same camelCase names, defaults and bounds
(DOMAIN.md section 2), plus the seed's `spec.iso.ejectAfterInstall` and a per-reason
count of ISO ejections in status. Defaults that depend on other fields (folder, VM
name prefix, ISO path prefix) are not in the CRD; the `effective_*` methods resolve
them, so every reader applies the same rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, ClassVar, Final

from pydantic import ConfigDict, Field, JsonValue, StringConstraints, model_validator

from agentforge.api import names
from agentforge.api.conditions import Conditions, ISOEjectedReason
from agentforge.api.fields import (
    DNS1123_LABEL_PATTERN,
    Count,
    DNS1123Label,
    DNS1123Subdomain,
    GoDuration,
    Int32,
    Int64,
    KubeModel,
    LabelValue,
    OpenEnum,
    OptionalDNS1123Label,
    Time,
    VsphereIdent,
    immutable,
    parse_duration,
)
from agentforge.api.kinds import VSPHERE_AGENT_POOL
from agentforge.api.meta import LocalObjectReference, ObjectMeta
from agentforge.api.vm import OwnedVM

DEFAULT_CHECK_INTERVAL = timedelta(minutes=10)

VsphereName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
VspherePath = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class Firmware(StrEnum):
    EFI = "efi"
    BIOS = "bios"


class CleanupPolicy(StrEnum):
    DELETE = "Delete"
    """Delete released, surplus and orphaned VMs with their unbound Agents."""
    RETAIN = "Retain"
    """Never delete VMs or Agents; clean-up is left to an administrator."""


class SpreadPolicy(StrEnum):
    NONE = "None"
    """Today's behaviour: every VM goes to `resourcePool` and `datastoreCluster`; DRS
    alone picks the host."""
    SPREAD = "Spread"
    """New VMs go to the failure domain holding the fewest of the pool's VMs, on the
    host of its cluster holding the fewest, and a DRS anti-affinity rule per cluster
    keeps them apart."""


class FailureDomain(KubeModel):
    """One place the pool's VMs may go that fails independently of the others: a
    compute cluster (or a DRS host group in one) and the storage its VMs use."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.datastoreCluster) != has(self.datastore)",
                    "message": "set exactly one of datastoreCluster and datastore",
                }
            ]
        }
    )

    name: DNS1123Label
    """The domain's name, unique in the pool (shown in status, events and the rule)."""
    compute_cluster: VspherePath
    """The compute cluster below the datacenter's host folder, e.g. `cluster-a`; VMs
    go to its root resource pool."""
    host_group: VsphereName | None = None
    """A DRS host group of the cluster: only its hosts receive the pool's VMs."""
    datastore_cluster: VsphereName | None = None
    """The datastore cluster (Storage DRS) of the VM disks in this domain."""
    datastore: VsphereName | None = None
    """A single datastore for the VM disks in this domain."""
    network: VsphereName | None = None
    """The network (port group) of the VM's NIC here; empty means `spec.vsphere.network`."""

    @model_validator(mode="after")
    def _one_storage(self) -> FailureDomain:
        if (self.datastore_cluster is None) == (self.datastore is None):
            raise ValueError(
                f"failure domain {self.name}: set exactly one of datastoreCluster and datastore"
            )
        return self

    def resource_pool(self) -> str:
        """The cluster's root resource pool, as `spec.vsphere.resourcePool` writes it."""
        return f"{self.compute_cluster.strip('/')}/Resources"


class SecretReference(KubeModel):
    """A Secret, in the pool's namespace unless `namespace` is set."""

    name: DNS1123Subdomain
    """The Secret's metadata.name."""
    namespace: OptionalDNS1123Label | None = None
    """The Secret's namespace; empty means the pool's namespace. A credentials Secret
    in another namespace is used only when its annotation
    `agent-forge.containeroo.ch/allowed-namespaces` lists the pool's namespace."""


SPREAD_RULE: Final[dict[str, JsonValue]] = {
    "rule": "!has(self.spreadPolicy) || self.spreadPolicy != 'Spread' || "
    "(has(self.failureDomains) && size(self.failureDomains) > 0)",
    "message": "spreadPolicy Spread needs at least one entry in failureDomains",
}


class VsphereSpec(KubeModel):
    """Where the VMs are created in vSphere and how their virtual hardware looks."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [SPREAD_RULE]})

    credentials_secret_ref: SecretReference = Field(
        json_schema_extra=immutable("credentialsSecretRef")
    )
    """A Secret with keys `server`, `username`, `password` and optionally `insecure`
    ("true" skips vCenter certificate verification) and `caBundle` (PEM certificates
    trusted for vCenter in addition to the system store; `ca.crt` is read too)."""
    datacenter: VsphereName = Field(default="dc1", json_schema_extra=immutable("datacenter"))
    """The vSphere datacenter."""
    datastore_cluster: VsphereName
    """The datastore cluster (Storage DRS) holding the VM disks."""
    iso_datastore: VsphereName = Field(json_schema_extra=immutable("isoDatastore"))
    """The datastore holding the cached discovery ISO."""
    resource_pool: VspherePath
    """The resource pool path, e.g. `cluster/Resources`."""
    folder: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, json_schema_extra=immutable("folder")
    )
    """The VM folder path; empty means the hosted cluster's name. The folder in effect
    cannot change: neither a set folder nor, by setting or clearing this field, the
    default (the hosted cluster's name)."""
    network: VsphereName
    """The network (port group) of the VM's NIC."""
    vm_tags: list[str] = Field(default_factory=list, max_length=64, alias="vmTags")
    """vSphere tag IDs attached to each VM."""
    guest_id: VsphereIdent = Field(default="rhel9_64Guest", alias="guestID")
    """The guest OS identifier."""
    scsi_type: VsphereIdent = "pvscsi"
    """The SCSI controller type."""
    firmware: Firmware = Firmware.EFI
    """The VM firmware: efi or bios."""
    network_adapter_type: VsphereIdent = "vmxnet3"
    """The NIC adapter type."""
    disk_eagerly_scrub: bool = False
    """Eagerly zero the primary disk."""
    failure_domains: list[FailureDomain] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    """Where the pool's VMs may go instead of `resourcePool` and `datastoreCluster`
    (read with `spreadPolicy: Spread`); names are unique. Empty: today's placement."""
    spread_policy: SpreadPolicy = SpreadPolicy.NONE
    """None (default): DRS alone places the VMs, exactly as without this field.
    Spread: needs `failureDomains`; see docs/operations.md "Failure domains"."""

    @model_validator(mode="after")
    def _domains(self) -> VsphereSpec:
        names = [d.name for d in self.failure_domains]
        if len(set(names)) != len(names):
            raise ValueError("spec.vsphere.failureDomains: names must be unique")
        if self.spread_policy == SpreadPolicy.SPREAD and not names:
            raise ValueError("spec.vsphere.spreadPolicy Spread needs failureDomains")
        return self


class TemplateSpec(KubeModel):
    """The virtual hardware of each VM."""

    name_prefix: (
        Annotated[str, StringConstraints(max_length=58, pattern=f"^$|{DNS1123_LABEL_PATTERN}")]
        | None
    ) = None
    """Prefix of VM names; empty means `<hostedCluster>-<agent.role>`. Each VM is named
    `<prefix>-<8 hex digits>` (a DNS label, cut to 63 characters: it becomes the
    Agent's hostname); the digits are derived from the VsphereAgent, so a restart
    recomputes the same name."""
    num_cpus: Int32 = Field(default=4, ge=1, le=128, alias="numCPUs")
    """Virtual CPUs."""
    memory_mib: Int32 = Field(default=16384, ge=1024, le=1048576, alias="memoryMiB")
    """Memory in MiB."""
    disk_gib: Int32 = Field(default=100, ge=20, le=65536, alias="diskGiB")
    """Primary disk size in GiB."""


class AgentSpec(KubeModel):
    """How discovered Agents are prepared so the NodePool's AgentMachines can bind them."""

    role: LabelValue = "worker"
    """The Agent role and the value of the nodepool-role label."""
    labels: dict[str, str] = Field(min_length=1, max_length=32)
    """Labels set on each Agent; should match the NodePool's
    `spec.platform.agent.agentLabelSelector`."""
    approve: bool = True
    """Set `spec.approved=true` on prepared Agents."""


class ISOSpec(KubeModel):
    """How the InfraEnv discovery ISO is cached in vSphere and, optionally, ejected."""

    check_interval: GoDuration = "10m"
    """How often the ISO behind an unchanged URL is re-checked (Go duration)."""
    retain_versions: Int32 = Field(default=2, ge=1, le=20)
    """How many content-addressed ISO versions are kept (the current one always is)."""
    path_prefix: (
        Annotated[str, StringConstraints(max_length=512, pattern=r"^$|^[^/\s][^\s]*$")] | None
    ) = None
    """Datastore folder of the cached ISOs; empty means `agent-forge/<namespace>/<pool>`."""
    eject_after_install: bool = False
    """Disconnect and eject the discovery ISO once the VM's Agent reports Installed=True."""


_EFFECTIVE_FOLDER = (
    "(has({o}.vsphere.folder) && {o}.vsphere.folder != '' ? {o}.vsphere.folder "
    ": {o}.hostedClusterRef.name)"
)
MAX_SPARES: Final = 100
"""The most warm spares a pool may keep (CRD validation): each is a running VM."""

FOLDER_RULE: Final[dict[str, JsonValue]] = {
    "rule": f"{_EFFECTIVE_FOLDER.format(o='self')} == {_EFFECTIVE_FOLDER.format(o='oldSelf')}",
    "message": "the VM folder (spec.vsphere.folder, else spec.hostedClusterRef.name) is "
    "immutable: setting, changing or clearing spec.vsphere.folder may not change it; "
    "create another pool for another folder",
}
"""The effective folder is immutable, not only a set `folder`: a field-level
`self == oldSelf` runs only when old and new both have the field, so setting an unset
folder would move new VMs to a second folder while the pool's old VMs stay behind."""


class VsphereAgentPoolSpec(KubeModel):
    """The desired state of a VsphereAgentPool."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [FOLDER_RULE]})

    hosted_cluster_ref: LocalObjectReference = Field(
        json_schema_extra=immutable("hostedClusterRef")
    )
    """The HyperShift HostedCluster this pool serves."""
    node_pool_ref: LocalObjectReference = Field(json_schema_extra=immutable("nodePoolRef"))
    """The HyperShift NodePool whose AgentMachines this pool supplies."""
    infra_env_ref: LocalObjectReference = Field(json_schema_extra=immutable("infraEnvRef"))
    """The InfraEnv (in the pool's namespace) whose discovery ISO the VMs boot."""
    control_plane_namespace: DNS1123Label = Field(
        json_schema_extra=immutable("controlPlaneNamespace")
    )
    """The hosted control plane namespace holding the AgentMachines and Machines."""
    vsphere: VsphereSpec
    """Placement and platform settings of the VMs."""
    template: TemplateSpec
    """The VMs' virtual hardware."""
    agent: AgentSpec
    """How discovered Agents are prepared."""
    iso: ISOSpec = Field(default_factory=ISOSpec, json_schema_extra={"default": {}})
    """Discovery ISO caching and ejection."""
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    """Delete, or Retain the VMs and Agents the pool no longer needs."""
    spares: Int32 = Field(default=0, ge=0, le=MAX_SPARES)
    """Warm spares: how many VMs the pool keeps booted, discovered and approved but
    unbound, so a waiting AgentMachine gets one at once instead of waiting for a VM to
    boot and be discovered. Their Agents carry only a spare selection label, which no
    AgentMachine selects: CAPI cannot bind them before the pool prepares them. 0 (the
    default) keeps none."""


class SparesStatus(KubeModel):
    """The pool's warm spares (`spec.spares`)."""

    wanted: Count = 0
    """`spec.spares`."""
    ready: Count = 0
    """Spares whose Agent is discovered and unbound: handed over at once."""
    creating: Count = 0
    """Spares whose VM is being created or booted, or not discovered yet."""


class PlannedActionType(StrEnum):
    DEMAND_DEFICIT = "DemandDeficit"
    DELETE_VM = "DeleteVM"
    DELETE_AGENT = "DeleteAgent"
    PATCH_AGENT = "PatchAgent"
    HAND_OVER_VM = "HandOverVM"
    """A VM whose AgentMachine went away, or a warm spare, serves an AgentMachine of the pool."""
    CREATE_SPARE = "CreateSpare"
    """A VM is created to keep `spec.spares` warm spares."""
    NOOP = "Noop"


class PlannedAction(KubeModel):
    """One action of the latest plan."""

    type: OpenEnum[PlannedActionType]
    """DemandDeficit, HandOverVM, CreateSpare, DeleteVM, DeleteAgent, PatchAgent or Noop (values in
    `PlannedActionType`); other versions may write others (older Go releases documented
    CreateVM)."""
    name: str | None = None
    """The VM or Agent acted on, when there is one."""
    reason: str
    """Why the action is needed."""


class ISOHistoryEntry(KubeModel):
    """One uploaded content-addressed ISO."""

    path: str
    """The datastore path of the ISO."""
    sha256: str
    """The ISO's content digest."""
    size_bytes: Int64 | None = None
    """The ISO's size."""
    uploaded_at: Time | None = None
    """When it was uploaded."""


class ISOSourceValidators(KubeModel):
    """HTTP validators of the ISO source at the last check, for a conditional re-check."""

    etag: str | None = Field(default=None, max_length=1024, alias="etag")
    """The response's ETag."""
    last_modified: str | None = Field(default=None, max_length=128)
    """The response's Last-Modified."""
    content_length: Int64 | None = None
    """The response's Content-Length."""


class ISOStatus(KubeModel):
    """The cached discovery ISO now inserted into new VMs."""

    url: str | None = None
    """The InfraEnv's `status.isoDownloadURL` at the last check, as shown: credentials
    (the image service's key in the path or query, a password in user info) are
    replaced by `[REDACTED]`; host, path and other parameters are kept."""
    path: str | None = None
    """The datastore path of the current ISO."""
    sha256: str | None = None
    """The current ISO's content digest."""
    size_bytes: Int64 | None = None
    """The current ISO's size."""
    checked_at: Time | None = None
    """When the ISO was last checked."""
    uploaded_at: Time | None = None
    """When the current ISO was uploaded."""
    force_refresh_token: str | None = None
    """The last processed value of the force-iso-refresh annotation."""
    url_hash: str | None = None
    """The sha256 (hex) of the whole download URL at the last check: how a change of
    URL is detected, since `url` does not show its key."""
    validators: ISOSourceValidators | None = None
    """The source's HTTP validators at the last check (a re-check downloads nothing
    while they still match)."""
    history: list[ISOHistoryEntry] = Field(default_factory=list)
    """The retained ISOs, newest first."""


class ISOEjectionCounts(KubeModel):
    """How many of the pool's VsphereAgents report each ISOEjected reason."""

    disabled: Count = 0
    waiting_for_installation: Count = 0
    ejection_in_progress: Count = 0
    ejected: Count = 0
    ejection_failed: Count = 0
    no_owned_media: Count = 0
    """Installed, but no CD-ROM held one of the pool's cached ISOs: nothing ejected."""

    _BY_REASON: ClassVar[dict[ISOEjectedReason, str]] = {
        ISOEjectedReason.DISABLED: "disabled",
        ISOEjectedReason.WAITING_FOR_INSTALLATION: "waiting_for_installation",
        ISOEjectedReason.EJECTION_IN_PROGRESS: "ejection_in_progress",
        ISOEjectedReason.EJECTED: "ejected",
        ISOEjectedReason.EJECTION_FAILED: "ejection_failed",
        ISOEjectedReason.NO_OWNED_MEDIA: "no_owned_media",
    }

    @classmethod
    def from_reasons(cls, reasons: Iterable[ISOEjectedReason]) -> ISOEjectionCounts:
        counts = Counter(reasons)
        return cls(**{field: counts[reason] for reason, field in cls._BY_REASON.items()})


class VsphereAgentPoolStatus(KubeModel):
    """The observed state of a VsphereAgentPool."""

    observed_generation: Int64 | None = None
    """The metadata.generation last reconciled."""
    desired_replicas: Count = 0
    """The observed AgentMachine count."""
    agent_machines: Count = 0
    """Non-deleting AgentMachines of the NodePool."""
    waiting_agent_machines: Count = 0
    """AgentMachines reporting Ready=False, reason NoSuitableAgents."""
    unready_agent_machines: Count = 0
    """AgentMachines whose Ready condition is not True."""
    agent_machines_without_agent: Count = 0
    """Unready AgentMachines without an assigned Agent."""
    matching_agents: Count = 0
    """Agents matching the pool."""
    bound_agents: Count = 0
    """Matching Agents bound to an AgentMachine."""
    available_agents: Count = 0
    """Matching Agents not bound."""
    owned_vms: list[OwnedVM] = Field(default_factory=list, alias="ownedVMs")
    """The VMs created or adopted for this pool."""
    planned_actions: list[PlannedAction] = Field(default_factory=list)
    """The actions of the latest plan."""
    iso: ISOStatus = Field(default_factory=ISOStatus)
    """The cached discovery ISO."""
    iso_ejections: ISOEjectionCounts = Field(default_factory=ISOEjectionCounts)
    """VsphereAgents per ISOEjected reason."""
    spares: SparesStatus | None = None
    """Warm spares wanted, ready and being made (absent while the pool keeps none)."""
    conditions: Conditions = Field(default_factory=list)
    """Ready, AgentMachineDemandFound, InfraEnvAvailable, CapacitySatisfied,
    VsphereReady and ISOReady."""


class VsphereAgentPool(KubeModel):
    """A bridge from one HyperShift Agent NodePool's demand to vSphere VMs."""

    api_version: str = VSPHERE_AGENT_POOL.api_version
    kind: str = VSPHERE_AGENT_POOL.kind
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: VsphereAgentPoolSpec
    status: VsphereAgentPoolStatus = Field(default_factory=VsphereAgentPoolStatus)

    def effective_folder(self) -> str:
        """The VM folder: `spec.vsphere.folder`, else the hosted cluster's name."""
        return self.spec.vsphere.folder or self.spec.hosted_cluster_ref.name

    def effective_name_prefix(self) -> str:
        """The VM name prefix: `spec.template.namePrefix`, else `<hostedCluster>-<role>`."""
        return (
            self.spec.template.name_prefix
            or f"{self.spec.hosted_cluster_ref.name}-{self.spec.agent.role}"
        )

    def effective_path_prefix(self) -> str:
        """The ISO folder: `spec.iso.pathPrefix`, else `agent-forge/<namespace>/<pool>`."""
        prefix = self.spec.iso.path_prefix or (
            f"agent-forge/{self.metadata.namespace}/{self.metadata.name}"
        )
        return prefix.rstrip("/")

    def effective_check_interval(self) -> timedelta:
        """The ISO re-check interval; zero means the default (10m), as in the Go operator."""
        return parse_duration(self.spec.iso.check_interval) or DEFAULT_CHECK_INTERVAL

    def credentials_secret_namespace(self) -> str:
        """The namespace of the vSphere credentials Secret."""
        return self.spec.vsphere.credentials_secret_ref.namespace or self.metadata.namespace

    def node_pool_annotation(self) -> str:
        """The nodePool annotation value of this pool's AgentMachines and Machines."""
        return f"{self.metadata.namespace}/{self.spec.node_pool_ref.name}"

    def force_refresh_token(self) -> str | None:
        """The force-iso-refresh annotation's value, if set."""
        return self.metadata.annotations.get(names.ANNOTATION_FORCE_ISO_REFRESH) or None

    def spread_domains(self) -> list[FailureDomain]:
        """The failure domains in effect: none unless `spreadPolicy` is Spread."""
        v = self.spec.vsphere
        return list(v.failure_domains) if v.spread_policy == SpreadPolicy.SPREAD else []

    @property
    def cleanup_enabled(self) -> bool:
        return self.spec.cleanup_policy == CleanupPolicy.DELETE
