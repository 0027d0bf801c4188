"""The planner's input: small frozen facts extracted once per object version.

A pool of 5,000 VMs must be planned in milliseconds, but parsing 5,000 Agents with
their pydantic views costs a quarter of a second. So the pool controller turns each
cached object into a slotted, frozen fact record once per resourceVersion, on its
first read (the informer's parse hook, `reconcilers.common.records`), and the planner
works on those records with dict lookups only.

The rules that decide a fact ("is this Agent bound?", "does this AgentMachine
wait?") stay in `agentforge.api.views`: the extractors here call the views, so the
answer cannot differ between reconcilers. VsphereAgents are our own kind and are
read from the raw dict leniently (a status written by the Go operator, or by an
older version of this one, must never stop planning).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from agentforge import identity
from agentforge.api import kinds, names, views, wire
from agentforge.api.conditions import ISOEjectedReason, VsphereAgentConditionType
from agentforge.api.meta import NamespacedName
from agentforge.api.vm import VMPhase
from agentforge.reconcilers.planning import naming

JsonObj = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}
_E = TypeVar("_E")


# --- Kubernetes kinds other projects own ----------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentFacts:
    """An Assisted Installer Agent, as far as planning cares."""

    name: str
    uid: str
    labels: Mapping[str, str]
    deleting: bool
    bound: bool
    """Bound to an AgentMachine or assigned to a cluster: never ours to delete."""
    agent_machine_ref: str | None
    """The name of the AgentMachine it is bound to (label `agentMachineRef`)."""
    agent_machine_namespace: str | None
    """... and that AgentMachine's namespace, when the Agent says (`views.Agent`)."""
    cluster_deployment: NamespacedName | None
    """The ClusterDeployment it is assigned to, namespace defaulted (`views.Agent`)."""
    bios_uuid: str | None
    macs: tuple[str, ...]
    """Its distinct canonical MACs, sorted (a tuple: a record per cached Agent, and a
    set of two costs four times the bytes; readers only ask membership)."""
    hostname: str
    """`spec.hostname` when set (we set it to the VM name), else the inventory's."""
    spec_hostname: str
    approved: bool
    role: str
    resource_version: str = ""
    """The version these facts were read from: the precondition of the pool's clean-up
    unlabelling (`planner_actions.Unlabel`), so it never touches a later version."""


def agent_facts(obj: JsonObj) -> AgentFacts:
    view = views.Agent.model_validate(obj)
    meta = obj.get("metadata") or _EMPTY
    labels = meta.get("labels")
    version = meta.get("resourceVersion")
    return AgentFacts(
        name=view.metadata.name,
        uid=view.metadata.uid,
        # the cached dict itself (read-only): no copy per Agent in its record
        labels=labels if isinstance(labels, Mapping) else view.metadata.labels,
        deleting=view.is_deleting,
        bound=view.is_bound,
        agent_machine_ref=view.agent_machine_ref,
        agent_machine_namespace=view.agent_machine_namespace,
        cluster_deployment=view.cluster_deployment,
        bios_uuid=view.bios_uuid,
        macs=tuple(sorted(view.mac_addresses)),
        hostname=view.spec.hostname or view.hostname,
        spec_hostname=view.spec.hostname,
        approved=view.spec.approved,
        role=view.spec.role,
        resource_version=version if isinstance(version, str) else "",  # the cached str
    )


@dataclass(frozen=True, slots=True)
class AgentMachineFacts:
    name: str
    deleting: bool
    ready: bool
    waiting: bool
    """Ready=False, reason NoSuitableAgents."""
    has_agent: bool
    pinned: str | None
    """The selection label pinned into `spec.agentLabelSelector.matchLabels`."""
    selection: str
    """The selection label value its VsphereAgent and Agent carry (`naming`)."""
    uid: str = ""
    created: str = ""
    """`metadata.creationTimestamp` as written (RFC 3339 sorts as text): oldest first."""
    agent: NamespacedName | None = None
    """The Agent CAPI assigned (`status.agentRef`, namespace defaulted)."""
    provider_agent: str | None = None
    """The Agent name or UID in `spec.providerID` (`agent://...`)."""


def agent_machine_facts(obj: JsonObj) -> AgentMachineFacts:
    view = views.AgentMachine.model_validate(obj)
    created = (obj.get("metadata") or _EMPTY).get("creationTimestamp")
    return AgentMachineFacts(
        name=view.metadata.name,
        deleting=view.is_deleting,
        ready=view.is_ready,
        waiting=view.is_waiting,
        has_agent=view.has_agent,
        pinned=view.spec.agent_label_selector.match_labels.get(names.LABEL_AGENT_MACHINE),
        selection=naming.selection_label_value(agent_machine=view.metadata.name),
        uid=view.metadata.uid,
        created=created if isinstance(created, str) else "",
        agent=view.agent_key,
        provider_agent=view.provider_agent,
    )


@dataclass(frozen=True, slots=True)
class MachineFacts:
    name: str
    uid: str
    deleting: bool
    infrastructure_name: str | None


def machine_facts(obj: JsonObj) -> MachineFacts:
    view = views.Machine.model_validate(obj)
    return MachineFacts(
        name=view.metadata.name,
        uid=view.metadata.uid,
        deleting=view.is_deleting,
        infrastructure_name=view.infrastructure_name,
    )


@dataclass(frozen=True, slots=True)
class InfraEnvFacts:
    name: str
    iso_url: str | None
    image_created: bool
    image_message: str


def infra_env_facts(obj: JsonObj) -> InfraEnvFacts:
    view = views.InfraEnv.model_validate(obj)
    created = view.status.condition(views.CONDITION_IMAGE_CREATED)
    return InfraEnvFacts(
        name=view.metadata.name,
        iso_url=view.iso_download_url,
        image_created=view.image_created,
        image_message=created.message if created else "",
    )


# --- our VsphereAgents ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandoverFacts:
    """`status.handover`: the VM is spare (`to` None) or being handed to AgentMachine `to`."""

    from_: str
    """The selection label value of the AgentMachine it was made for or last served."""
    to: str | None
    to_uid: str | None
    since: datetime

    @property
    def selection(self) -> str | None:
        """The selection label value of the target AgentMachine, while handing over."""
        return naming.selection_label_value(agent_machine=self.to) if self.to else None


def handover_facts(value: object) -> HandoverFacts | None:
    """The record as written; an unreadable one counts as none (the planner decides anew)."""
    if not isinstance(value, Mapping):
        return None
    from_ = wire.text(value.get("fromAgentMachine"))
    since = parse_time(value.get("since"))
    if from_ is None or since is None:
        return None
    return HandoverFacts(
        from_=from_,
        to=wire.text(value.get("toAgentMachine")),
        to_uid=wire.text(value.get("toAgentMachineUID")),
        since=since,
    )


@dataclass(frozen=True, slots=True)
class VsphereAgentFacts:
    """One VsphereAgent and the VM record in its status."""

    name: str
    uid: str
    pool: str | None
    deleting: bool
    created_for: str | None
    agent_machine: str | None
    """The selection label value (the AgentMachine it was made for), if any."""
    vm_name: str
    bios_uuid: str | None
    mac: str | None
    """Canonical lower-case colon form."""
    phase: VMPhase | None
    reason: str | None
    agent_ref: str | None
    """The recorded Agent's name; a record naming another namespace's Agent is ignored
    (the pool's Agents live in the VsphereAgent's namespace)."""
    machine_ref: str | None
    machine_ref_namespace: str | None
    """The recorded Machine's namespace, when the record names one."""
    machine_ref_uid: str | None
    """The recorded Machine's UID, when the record names one: a Machine re-created
    under that name is another Machine."""
    last_transition: datetime | None
    created_at: datetime | None
    ready_since: datetime | None
    """When Ready last turned True (the VM exists and runs), if it is True."""
    iso_ejected: ISOEjectedReason | None
    vm_status: Mapping[str, Any] = field(default_factory=dict)
    """The raw `status.vm` (read-only), rendered back with the planner's fields."""
    pool_uid: str | None = None
    """The UID in its ownerReference to a VsphereAgentPool, if it has one: an object
    left by an earlier pool of the same name carries that pool's UID."""
    handover: HandoverFacts | None = None
    """`status.handover`: spare, or being handed to another AgentMachine."""
    resource_version: str = ""

    @property
    def target(self) -> str | None:
        """The selection label value of the AgentMachine it is for: the hand-over's
        target while one runs, else its label."""
        handover = self.handover
        if handover is not None and handover.to:
            return handover.selection
        return self.agent_machine

    @property
    def warm_spare(self) -> bool:
        """A warm spare (`spec.spares`): its target is a spare selection value, so it
        serves no AgentMachine (yet)."""
        return naming.is_spare_selection(self.target)

    @property
    def vm_exists(self) -> bool:
        """The VM was created or adopted (identity recorded, or Ready=True)."""
        return bool(self.bios_uuid) or self.ready_since is not None

    @property
    def adopted(self) -> bool:
        return self.created_for == names.CreatedFor.ADOPTED


def parse_time(value: object) -> datetime | None:
    """A metav1.Time string as an aware UTC datetime (whole seconds); None if not one."""
    if not isinstance(value, str) or not value:
        return None
    with contextlib.suppress(ValueError):
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC).replace(microsecond=0)
    return None


def _local_ref_name(value: object, *, namespace: str) -> str | None:
    """A recorded reference's name when it names an object of `namespace` (or names no
    namespace, which means that one)."""
    other = wire.text(wire.get(value, "namespace"))
    return wire.text(wire.get(value, "name")) if other in (None, namespace) else None


def _pool_owner_uid(meta: Mapping[str, Any]) -> str | None:
    """The UID of the VsphereAgentPool in the ownerReferences (the controller one first)."""
    owners = [
        ref
        for ref in meta.get("ownerReferences") or ()
        if isinstance(ref, Mapping)
        and ref.get("kind") == kinds.VSPHERE_AGENT_POOL.kind
        and str(ref.get("apiVersion", "")).partition("/")[0] == kinds.VSPHERE_AGENT_POOL.group
    ]
    owners.sort(key=lambda ref: not ref.get("controller"))
    return wire.text(owners[0].get("uid")) if owners else None


def _enum(enum: type[_E], value: object) -> _E | None:
    try:
        return enum(value)  # type: ignore[call-arg]
    except ValueError:
        return None


def vsphere_agent_facts(obj: JsonObj) -> VsphereAgentFacts:
    meta = obj.get("metadata") or _EMPTY
    labels = meta.get("labels") or _EMPTY
    annotations = meta.get("annotations") or _EMPTY
    spec = obj.get("spec") or _EMPTY
    status = obj.get("status") or _EMPTY
    vm = status.get("vm")
    vm = vm if isinstance(vm, Mapping) else _EMPTY
    ready_since: datetime | None = None
    ejected: ISOEjectedReason | None = None
    for condition in status.get("conditions") or ():
        if not isinstance(condition, Mapping):
            continue
        if condition.get("type") == VsphereAgentConditionType.READY:
            if condition.get("status") == "True":
                ready_since = parse_time(condition.get("lastTransitionTime")) or parse_time(
                    meta.get("creationTimestamp")
                )
        elif condition.get("type") == VsphereAgentConditionType.ISO_EJECTED:
            ejected = _enum(ISOEjectedReason, condition.get("reason"))
    name = str(meta.get("name", ""))
    namespace = str(meta.get("namespace", ""))
    return VsphereAgentFacts(
        name=name,
        uid=str(meta.get("uid", "")),
        pool=wire.text(labels.get(names.LABEL_POOL))
        or wire.text(wire.get(spec, "poolRef", "name")),
        deleting=meta.get("deletionTimestamp") is not None,
        created_for=wire.text(labels.get(names.LABEL_CREATED_FOR)),
        agent_machine=wire.text(labels.get(names.LABEL_AGENT_MACHINE)),
        vm_name=wire.text(vm.get("name"))
        or wire.text(annotations.get(names.ANNOTATION_VM_NAME))
        or name,
        bios_uuid=identity.normalize_uuid(wire.text(vm.get("biosUUID"))),
        mac=identity.normalize_mac(wire.text(vm.get("macAddress"))),
        phase=_enum(VMPhase, vm.get("phase")),
        reason=wire.text(vm.get("reason")),
        agent_ref=_local_ref_name(vm.get("agentRef"), namespace=namespace),
        machine_ref=wire.text(wire.get(vm, "machineRef", "name")),
        machine_ref_namespace=wire.text(wire.get(vm, "machineRef", "namespace")),
        machine_ref_uid=wire.text(wire.get(vm, "machineRef", "uid")),
        last_transition=parse_time(vm.get("lastTransitionTime")),
        created_at=parse_time(meta.get("creationTimestamp")),
        ready_since=ready_since,
        iso_ejected=ejected,
        vm_status=vm,
        pool_uid=_pool_owner_uid(meta),
        handover=handover_facts(status.get("handover")),
        resource_version=str(meta.get("resourceVersion", "")),
    )


# --- identity: which Agent is which VM ------------------------------------------------------
#
# One precedence everywhere (matching, claims, the clean-up guard, the vm controller's
# deletion guard): the BIOS UUID first. When both sides know one, it alone decides;
# a MAC decides only when a BIOS UUID is unknown on either side. MACs are not unique
# (vcsim derives them from 3 hex digits of the UUID; cloned templates repeat them),
# so a shared MAC never makes two VMs' Agents one, nor takes a VM's Agent away.


def identity_conflicts(*, bios_uuid: str | None, mac: str | None, agent: AgentFacts) -> bool:
    """A VM and an Agent that both report an identity which proves them different.

    Both BIOS UUIDs known: they conflict exactly when they differ (an equal MAC does
    not reconcile them). Otherwise both MACs known: they conflict when the Agent
    does not report the VM's MAC. Nothing to compare: no conflict. Hostname and
    previous-agentRef matches (and claims) are only trusted when this is False.
    """
    if bios_uuid and agent.bios_uuid:
        return bios_uuid != agent.bios_uuid
    if mac and agent.macs:
        return mac not in agent.macs
    return False


def identifies(*, bios_uuid: str | None, mac: str | None, agent: AgentFacts) -> bool:
    """`agent` is the VM with this identity: the same BIOS UUID, or its MAC with no
    BIOS UUID that says otherwise."""
    if bios_uuid and agent.bios_uuid:
        return bios_uuid == agent.bios_uuid
    return bool(mac) and mac in agent.macs


# --- claims by other pools ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    """What another pool's VsphereAgent holds on to: its VM identity and its Agent."""

    pool: str
    vsphere_agent: str
    vm_name: str
    bios_uuid: str | None
    mac: str | None
    agent: str | None

    def conflicts_with(self, agent: AgentFacts) -> bool:
        return identity_conflicts(bios_uuid=self.bios_uuid, mac=self.mac, agent=agent)


def _first_agreeing(claims: Iterable[Claim] | None, agent: AgentFacts) -> Claim | None:
    for claim in claims or ():
        if not claim.conflicts_with(agent):
            return claim
    return None


@dataclass(frozen=True, slots=True)
class Claims:
    """Other pools' claims, indexed so `claimant(agent)` is a few dict lookups.

    Each key may be held by several claims (MACs repeat across VMs), kept in a
    stable order (pool, then VsphereAgent name).
    """

    by_agent: Mapping[str, tuple[Claim, ...]] = field(default_factory=dict)
    by_uuid: Mapping[str, tuple[Claim, ...]] = field(default_factory=dict)
    by_mac: Mapping[str, tuple[Claim, ...]] = field(default_factory=dict)
    by_vm_name: Mapping[str, tuple[Claim, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[Claim]) -> Claims:
        by_agent: dict[str, list[Claim]] = {}
        by_uuid: dict[str, list[Claim]] = {}
        by_mac: dict[str, list[Claim]] = {}
        by_vm_name: dict[str, list[Claim]] = {}
        for claim in sorted(claims, key=lambda c: (c.pool, c.vsphere_agent)):
            if claim.agent:
                by_agent.setdefault(claim.agent, []).append(claim)
            if claim.bios_uuid:
                by_uuid.setdefault(claim.bios_uuid, []).append(claim)
            if claim.mac:
                by_mac.setdefault(claim.mac, []).append(claim)
            by_vm_name.setdefault(claim.vm_name, []).append(claim)

        def frozen(index: dict[str, list[Claim]]) -> dict[str, tuple[Claim, ...]]:
            return {k: tuple(v) for k, v in index.items()}

        return cls(
            by_agent=frozen(by_agent),
            by_uuid=frozen(by_uuid),
            by_mac=frozen(by_mac),
            by_vm_name=frozen(by_vm_name),
        )

    def __bool__(self) -> bool:
        return bool(self.by_vm_name)

    def claimant(
        self, agent: AgentFacts, *, shared_names: Container[str] = frozenset()
    ) -> Claim | None:
        """The other pool's claim on `agent`: by BIOS UUID, by name (agentRef), by MAC,
        or by hostname, each only while the claim's VM identity does not conflict with
        the Agent's (`identity_conflicts`: a differing known BIOS UUID always wins over
        an equal MAC, so two VMs sharing a MAC never claim each other's Agents).

        `shared_names` are the VM names the asking pool's VMs carry: a hostname equal to
        one of them names two VMs and identifies neither, so it claims nothing (as two
        VMs of one pool sharing a name, `matching`). Otherwise the asking pool's own
        preparation (`spec.hostname` = its VM's name) would hand the Agent it matched
        to the other pool on its next plan."""
        if agent.bios_uuid:
            found = self.by_uuid.get(agent.bios_uuid)
            if found:
                return found[0]
        claim = _first_agreeing(self.by_agent.get(agent.name), agent)
        if claim is None:
            for mac in sorted(agent.macs):
                claim = _first_agreeing(self.by_mac.get(mac), agent)
                if claim is not None:
                    break
        if claim is None and agent.hostname and agent.hostname not in shared_names:
            claim = _first_agreeing(self.by_vm_name.get(agent.hostname), agent)
        return claim


def claim_of(facts: VsphereAgentFacts) -> Claim | None:
    """The claim a VsphereAgent of another pool makes (None while it is deleted)."""
    if facts.deleting or not facts.pool:
        return None
    return Claim(
        pool=facts.pool,
        vsphere_agent=facts.name,
        vm_name=facts.vm_name,
        bios_uuid=facts.bios_uuid,
        mac=facts.mac,
        agent=facts.agent_ref,
    )
