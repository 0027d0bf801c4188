"""Read-only views of the kinds other projects own: Agent, AgentMachine, Machine, InfraEnv.

Each view models only the fields DOMAIN.md section 1 says matter (spelled as in the
upstream CRDs under `sim/crds/external/`) and answers the questions the reconcilers
ask ("is this Agent bound?", "does this AgentMachine wait for an Agent?") in one
place, so the answer cannot differ between reconcilers. Views are frozen, tolerate
missing spec/status, and parse both full objects and the cache's trimmed ones.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic import Field

from agentforge import identity
from agentforge.api import names
from agentforge.api.conditions import ConditionStatus, condition_true, find_condition
from agentforge.api.fields import Time, View
from agentforge.api.kinds import AGENT_MACHINE, INFRA_ENV
from agentforge.api.meta import NamespacedName, ObjectMeta

CONDITION_READY = "Ready"
CONDITION_INSTALLED = "Installed"
CONDITION_IMAGE_CREATED = "ImageCreated"
REASON_NO_SUITABLE_AGENTS = "NoSuitableAgents"
MACHINE_PHASE_DELETING = "Deleting"


class NodePoolKey(NamedTuple):
    namespace: str
    name: str


def parse_node_pool_annotation(value: str | None) -> NodePoolKey | None:
    """`<namespace>/<name>` of the nodePool annotation, or None when malformed."""
    if not value:
        return None
    namespace, sep, name = value.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        return None
    return NodePoolKey(namespace, name)


class StatusCondition(View):
    """A condition as other controllers write it: type, status and reason only."""

    type: str
    status: str = "Unknown"
    reason: str = ""

    @property
    def is_true(self) -> bool:
        return self.status == ConditionStatus.TRUE


class ObservedCondition(StatusCondition):
    """A condition with its message and transition time."""

    message: str = ""
    last_transition_time: Time | None = None


class _Conditioned(View):
    conditions: tuple[ObservedCondition, ...] = ()

    def condition(self, type_: str) -> ObservedCondition | None:
        return find_condition(self.conditions, type_)

    def condition_true(self, type_: str) -> bool:
        return condition_true(self.conditions, type_)


# --- Agent (agent-install.openshift.io/v1beta1) ---------------------------------------


class ClusterDeploymentRef(View):
    name: str = ""
    namespace: str = ""


class AgentSpec(View):
    approved: bool = False
    role: str = ""
    hostname: str = ""
    cluster_deployment_name: ClusterDeploymentRef | None = None


class Interface(View):
    mac_address: str = ""


class SystemVendor(View):
    serial_number: str = ""


class Inventory(View):
    hostname: str = ""
    interfaces: tuple[Interface, ...] = ()
    system_vendor: SystemVendor = Field(default_factory=SystemVendor)


class DebugInfo(View):
    state: str = ""


class AgentStatus(View):
    conditions: tuple[StatusCondition, ...] = ()
    inventory: Inventory = Field(default_factory=Inventory)
    debug_info: DebugInfo = Field(default_factory=DebugInfo)

    def condition(self, type_: str) -> StatusCondition | None:
        return find_condition(self.conditions, type_)

    def condition_true(self, type_: str) -> bool:
        return condition_true(self.conditions, type_)


class Agent(View):
    """An Assisted Installer host registered by a booted discovery ISO."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: AgentSpec = Field(default_factory=AgentSpec)
    status: AgentStatus = Field(default_factory=AgentStatus)

    @property
    def bios_uuid(self) -> str | None:
        """The VM BIOS UUID encoded in the inventory's SMBIOS serial, if VMware's."""
        return identity.bios_uuid_from_serial(self.status.inventory.system_vendor.serial_number)

    @property
    def mac_addresses(self) -> frozenset[str]:
        """The inventory's MACs in canonical lower-case colon form."""
        macs = (identity.normalize_mac(i.mac_address) for i in self.status.inventory.interfaces)
        return frozenset(mac for mac in macs if mac)

    @property
    def hostname(self) -> str:
        """The hostname the host reported (empty before the inventory arrives)."""
        return self.status.inventory.hostname

    @property
    def infra_env_name(self) -> str | None:
        """The InfraEnv that registered the Agent: its label, else an ownerReference."""
        label = self.metadata.labels.get(names.LABEL_INFRAENV)
        if label:
            return label
        owner = self.metadata.owner(kind=INFRA_ENV.kind)
        if owner is None or owner.api_version.partition("/")[0] != INFRA_ENV.group:
            return None
        return owner.name or None

    @property
    def agent_machine_ref(self) -> str | None:
        """The name of the AgentMachine the Agent is bound to (label `agentMachineRef`)."""
        return self.metadata.labels.get(names.LABEL_AGENT_MACHINE_REF) or None

    @property
    def cluster_deployment(self) -> NamespacedName | None:
        """The ClusterDeployment the Agent is assigned to (`spec.clusterDeploymentName`).

        A reference without a namespace (hand-written, or from an old writer) names one
        in the Agent's own namespace: the Kubernetes rule for a reference that omits it.
        """
        ref = self.spec.cluster_deployment_name
        if ref is None or not ref.name:
            return None
        return NamespacedName(ref.namespace or self.metadata.namespace, ref.name)

    @property
    def agent_machine_namespace(self) -> str | None:
        """The namespace of the AgentMachine named by `agentMachineRef`: the provider's
        annotation `agentMachineRefNamespace`, else the ClusterDeployment's namespace (the
        provider binds Agents to AgentMachines of the cluster's namespace), else None."""
        if not self.agent_machine_ref:
            return None
        annotated = self.metadata.annotations.get(names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE)
        if annotated:
            return annotated
        deployment = self.cluster_deployment
        return deployment.namespace if deployment else None

    @property
    def is_bound(self) -> bool:
        """Bound to an AgentMachine or assigned to a cluster: never ours to delete."""
        deployment = self.spec.cluster_deployment_name
        return bool(self.agent_machine_ref) or bool(deployment and deployment.name)

    @property
    def is_installed(self) -> bool:
        """Installed=True: covers `installed` and `added-to-existing-cluster`; Bound does not."""
        return self.status.condition_true(CONDITION_INSTALLED)

    @property
    def is_deleting(self) -> bool:
        return self.metadata.deleting


# --- AgentMachine (capi-provider.agent-install.openshift.io/v1beta1) ------------------


class LabelSelector(View):
    match_labels: dict[str, str] = Field(default_factory=dict)


class AgentMachineSpec(View):
    agent_label_selector: LabelSelector = Field(default_factory=LabelSelector)
    provider_id: str = Field(default="", alias="providerID")


class AgentRef(View):
    name: str = ""
    namespace: str = ""


class AgentMachineStatus(_Conditioned):
    agent_ref: AgentRef | None = None


class AgentMachine(View):
    """CAPI's infrastructure machine for one Agent-platform node."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: AgentMachineSpec = Field(default_factory=AgentMachineSpec)
    status: AgentMachineStatus = Field(default_factory=AgentMachineStatus)

    @property
    def node_pool(self) -> NodePoolKey | None:
        return parse_node_pool_annotation(self.metadata.annotations.get(names.ANNOTATION_NODEPOOL))

    @property
    def is_ready(self) -> bool:
        return self.status.condition_true(CONDITION_READY)

    @property
    def is_waiting(self) -> bool:
        """Ready=False with reason NoSuitableAgents: demand for one more Agent."""
        ready = self.status.condition(CONDITION_READY)
        return (
            ready is not None
            and ready.status == ConditionStatus.FALSE
            and ready.reason == REASON_NO_SUITABLE_AGENTS
        )

    @property
    def agent_name(self) -> str | None:
        """The assigned Agent's name, if CAPI recorded one."""
        ref = self.status.agent_ref
        return ref.name if ref and ref.name else None

    @property
    def agent_key(self) -> NamespacedName | None:
        """The assigned Agent (`status.agentRef`); without a namespace, in the
        AgentMachine's own (the Kubernetes rule for a reference that omits it)."""
        ref = self.status.agent_ref
        if ref is None or not ref.name:
            return None
        return NamespacedName(ref.namespace or self.metadata.namespace, ref.name)

    @property
    def provider_agent(self) -> str | None:
        """What `spec.providerID` names after `agent://`: the Agent's name (current
        cluster-api-provider-agent) or its UID (older ones)."""
        prefix = names.AGENT_PROVIDER_ID_PREFIX
        if not self.spec.provider_id.startswith(prefix):
            return None
        return self.spec.provider_id[len(prefix) :] or None

    @property
    def has_agent(self) -> bool:
        """An Agent is assigned: `status.agentRef.name`, or an `agent://` providerID."""
        return bool(self.agent_name) or self.spec.provider_id.startswith(
            names.AGENT_PROVIDER_ID_PREFIX
        )

    @property
    def is_deleting(self) -> bool:
        return self.metadata.deleting


# --- Machine (cluster.x-k8s.io/v1beta1) ------------------------------------------------


class NamedRef(View):
    kind: str = ""
    name: str = ""


class MachineSpec(View):
    infrastructure_ref: NamedRef | None = None


class MachineStatus(View):
    phase: str = ""
    node_ref: NamedRef | None = None


class Machine(View):
    """A CAPI Machine; only its deletion matters to the operator."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSpec = Field(default_factory=MachineSpec)
    status: MachineStatus = Field(default_factory=MachineStatus)

    @property
    def node_pool(self) -> NodePoolKey | None:
        return parse_node_pool_annotation(self.metadata.annotations.get(names.ANNOTATION_NODEPOOL))

    @property
    def is_deleting(self) -> bool:
        """Deletion requested, or CAPI reports phase Deleting."""
        return self.metadata.deleting or self.status.phase == MACHINE_PHASE_DELETING

    @property
    def infrastructure_name(self) -> str | None:
        """The name of its infrastructure machine, when that is an AgentMachine (of the
        Machine's namespace: CAPI's infrastructureRef is always local)."""
        ref = self.spec.infrastructure_ref
        if ref is None or not ref.name or ref.kind not in ("", AGENT_MACHINE.kind):
            return None
        return ref.name


# --- InfraEnv (agent-install.openshift.io/v1beta1) -------------------------------------


class InfraEnvStatus(_Conditioned):
    iso_download_url: str = Field(default="", alias="isoDownloadURL")


class InfraEnv(View):
    """The Assisted Installer environment that serves the discovery ISO."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    status: InfraEnvStatus = Field(default_factory=InfraEnvStatus)

    @property
    def iso_download_url(self) -> str | None:
        return self.status.iso_download_url or None

    @property
    def image_created(self) -> bool:
        """ImageCreated=True: the ISO behind the URL is ready to download."""
        return self.status.condition_true(CONDITION_IMAGE_CREATED)
