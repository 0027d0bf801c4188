"""Whether an ISO ejection may start, pure: the gate (cache only) and the start plan.

The rules (the seed's "Discovery ISO lifecycle"; resuming a record is `ejection_decide`):

* **gate** (no vSphere call): an `Ejected` condition is kept (also when the pool opts
  out later), unless an opted-in VM's Agent stops reporting Installed (a reinstall:
  it is ejected again afterwards); `NoOwnedMedia` is kept the same way while the
  pool stays opted in; a pool that has not opted in shows `Disabled`; a
  VM that is Released, whose Machine is deleting or whose Agent is going away gets
  no new ejection; a new one starts only for a created or adopted VM whose Agent
  reports `Installed=True` (`Bound=True` alone never triggers). A VM no Agent is
  matched to waits; the message tells a VM still waiting for its first Agent from
  one whose Agent no longer identifies it (and names the Agents that still claim
  it: its selection label or its MAC).
* **start** (one vSphere read): the VM found by its recorded BIOS UUID must carry
  markers naming this pool (UID included) and VsphereAgent, or no markers at all and
  the recorded name (a VM the Go operator made: our markers are stamped after the
  checkpoint, before the disconnect); the Agent's inventory serial and MAC must be
  this VM's. Only a CD-ROM holding `[<isoDatastore>] <pathPrefix>/<sha256 hex>.iso`
  is a candidate; any other medium stays attached. With no candidate but a medium
  attached, nothing is ejected and the VM reports `NoOwnedMedia`, naming each medium
  and why it is not the pool's (another datastore, another folder or a sub-folder of
  the prefix, a name that is no sha256, a device), never `Ejected`; with every
  CD-ROM disconnected and empty (as an eject leaves it: ours before a reinstall, or
  someone's) the VM is `Ejected`, in words that say it was found so. A question
  already pending on the VM was not raised by us: nothing starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentforge import identity, vsphere
from agentforge.api import views
from agentforge.api.conditions import ISOEjectedReason
from agentforge.reconcilers.infra import iso_cache
from agentforge.vsphere.model import markers as vmarkers

__all__ = [
    "Hold",
    "Start",
    "StartPlan",
    "Unmatched",
    "candidates",
    "gate",
    "is_content_addressed",
    "plan_start",
    "why_not_ours",
]

R = ISOEjectedReason


# --- the gate (cache only) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """No ejection now. `reason` None: keep the condition exactly as it is."""

    reason: ISOEjectedReason | None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """Read the VM and plan an ejection."""


@dataclass(frozen=True, slots=True)
class Unmatched:
    """What is known of a VM no Agent is matched to (`status.vm`, and the Agents that
    still claim it by its selection label or its MAC)."""

    once_matched: bool
    """An Agent was matched to the VM before (its phase or `agentRef` says so)."""
    phase: str = ""
    """The VM's recorded phase and reason, as `Orphaned/AgentMissing`."""
    bios_uuid: str | None = None
    mac: str | None = None
    claimants: tuple[views.Agent, ...] = ()


def gate(
    *,
    enabled: bool,
    pool: str,
    current: ISOEjectedReason | None,
    vm_name: str | None,
    vm_ready: bool,
    released: bool,
    machine_deleting: str | None,
    agent: views.Agent | None,
    unmatched: Unmatched | None = None,
) -> Hold | Start:
    """Whether a new ejection may start for a VsphereAgent without a record."""
    reinstalling = (
        enabled
        and vm_ready
        and not (released or machine_deleting)
        and agent is not None
        and not agent.is_deleting
        and not agent.is_installed
    )
    if current in (R.EJECTED, R.NO_OWNED_MEDIA) and reinstalling:
        assert agent is not None
        return Hold(
            R.WAITING_FOR_INSTALLATION,
            f"Agent {agent.metadata.namespace}/{agent.metadata.name} no longer reports "
            "Installed=True (installed again?): any discovery ISO of the pool attached since is "
            "ejected once it does",
        )
    if current is R.EJECTED:
        return Hold(None)  # kept, also after the pool opts out
    if current is R.NO_OWNED_MEDIA and enabled and not (released or machine_deleting):
        return Hold(None)  # looked at again after a reinstall, not on every reconcile
    if not enabled:
        return Hold(
            R.DISABLED,
            f"VsphereAgentPool {pool} has spec.iso.ejectAfterInstall off: the discovery ISO "
            "stays attached; set it to true to eject it after installation",
        )
    vm = f"VM {vm_name}" if vm_name else "the VM"
    if released or machine_deleting:
        if machine_deleting and machine_deleting.endswith(" (gone)"):
            why = f"its Machine {machine_deleting.removesuffix(' (gone)')} is gone"
        elif machine_deleting:
            why = f"its Machine {machine_deleting} is being deleted"
        else:
            why = "it is Released"
        return Hold(
            R.DISABLED,
            f"no ejection for {vm}: {why}; scale-down is left to CAPI and the "
            "discovery ISO stays attached",
        )
    if not vm_ready or not vm_name:
        return Hold(R.WAITING_FOR_INSTALLATION, f"waiting for {vm} to be created or adopted")
    if agent is None:
        return Hold(R.WAITING_FOR_INSTALLATION, _no_agent(vm, unmatched))
    name = f"Agent {agent.metadata.namespace}/{agent.metadata.name}"
    if agent.is_deleting:
        return Hold(R.DISABLED, f"no ejection for {vm}: {name} is being deleted")
    if not agent.is_installed:
        installed = agent.status.condition(views.CONDITION_INSTALLED)
        now = (
            f"Installed={installed.status}/{installed.reason}"
            if installed
            else "no Installed condition"
        )
        return Hold(
            R.WAITING_FOR_INSTALLATION,
            f"waiting for {name} of {vm} to report Installed=True (it reports {now}; "
            "Bound alone is not enough)",
        )
    return Start()


def _no_agent(vm: str, unmatched: Unmatched | None) -> str:
    """Why no Agent is there to go by: none registered yet, or none identifies the VM."""
    if unmatched is None or not unmatched.once_matched:
        return f"waiting for an Agent to register from {vm}"
    identity_ = ", ".join(
        part
        for part in (
            f"BIOS UUID {unmatched.bios_uuid}" if unmatched.bios_uuid else "",
            f"MAC {unmatched.mac}" if unmatched.mac else "",
        )
        if part
    )
    phase = f"; phase {unmatched.phase}" if unmatched.phase else ""
    head = f"no Agent is matched to {vm} any more ({identity_ or 'identity unknown'}{phase})"
    tail = "nothing is ejected until an Agent that identifies the VM reports Installed=True"
    if not unmatched.claimants:
        return f"{head}: the Agent it had is gone or no longer reports its BIOS UUID or MAC; {tail}"
    claims = "; ".join(_claim(a) for a in unmatched.claimants)
    return f"{head}: {claims}, which does not identify the VM; {tail}"


def _claim(agent: views.Agent) -> str:
    bound = f", bound to AgentMachine {agent.agent_machine_ref}" if agent.agent_machine_ref else ""
    installed = ", Installed=True" if agent.is_installed else ""
    serial = agent.status.inventory.system_vendor.serial_number or "(none)"
    macs = ", ".join(sorted(agent.mac_addresses)) or "none"
    return (
        f"Agent {agent.metadata.namespace}/{agent.metadata.name}{bound}{installed} reports "
        f"serial {serial} and MACs {macs}"
    )


# --- the start (one vSphere read) ----------------------------------------------------------


def is_content_addressed(backing: str | None, *, datastore: str, prefix: str) -> bool:
    """`[datastore] <prefix>/<sha256 hex>.iso` exactly: a file the pool's ISO cache made
    (the same rule the ISO pruner applies, so "ours" means the same thing to both)."""
    path = iso_cache.relative_path(backing, datastore=datastore) if backing else None
    return path is not None and iso_cache.is_content_addressed(path, prefix=prefix)


def candidates(
    cdroms: tuple[vsphere.Cdrom, ...], *, datastore: str, prefix: str
) -> list[vsphere.Cdrom]:
    """The CD-ROMs holding one of the pool's cached ISOs, by device key."""
    found = [
        c
        for c in cdroms
        if c.kind is vsphere.MediumKind.ISO
        and is_content_addressed(c.backing_file, datastore=datastore, prefix=prefix)
    ]
    return sorted(found, key=lambda c: c.key)


@dataclass(frozen=True, slots=True)
class StartPlan:
    """`record` set: record this CD-ROM and eject it. Else `reason` + `message` say why not."""

    cdrom: vsphere.Cdrom | None = None
    reason: ISOEjectedReason | None = None
    message: str = ""


def why_not_ours(cdrom: vsphere.Cdrom, *, datastore: str, prefix: str) -> str:
    """What `cdrom` holds and why it is not one of the pool's cached ISOs."""
    device = f"CD-ROM {cdrom.key}"
    backing = cdrom.backing_file
    if cdrom.is_empty():
        return f"{device} is disconnected and empty"
    if cdrom.kind is vsphere.MediumKind.CLIENT:
        return f"{device} is backed by a client device, not an ISO file"
    if cdrom.kind is vsphere.MediumKind.HOST:
        return f"{device} is backed by the host device {backing or '(unnamed)'}, not an ISO file"
    if cdrom.kind is not vsphere.MediumKind.ISO or not backing:
        return f"{device} holds no medium"
    split = iso_cache.split_backing(backing)
    if split is None:
        return f"{device} holds {backing}: not a datastore path ([datastore] folder/name.iso)"
    ds, path = split
    folder, _, name = path.rpartition("/")
    want = prefix.strip("/")
    if ds != datastore:
        return (
            f"{device} holds {backing}: on datastore {ds}, not the pool's isoDatastore {datastore}"
        )
    if folder != want:
        where = f"folder {folder}/" if folder else "the datastore's root folder"
        if folder.startswith(f"{want}/"):
            where = f"sub-folder {folder}/"
        return (
            f"{device} holds {backing}: in {where}, not directly in the pool's pathPrefix {want}/"
        )
    return f"{device} holds {backing}: {name} is not a cached ISO's name (<sha256>.iso)"


def plan_start(
    *,
    vm: vsphere.VmFacts | None,
    vm_name: str,
    bios_uuid: str,
    datacenter: str,
    expected: vsphere.OwnershipMarkers,
    agent: views.Agent,
    datastore: str,
    prefix: str,
) -> StartPlan:
    """What to do with an installed worker's VM, from one read of its facts."""
    failed = R.EJECTION_FAILED
    if vm is None:
        return StartPlan(
            reason=failed,
            message=f"VM with BIOS UUID {bios_uuid} not found in datacenter {datacenter}; "
            "nothing was touched",
        )
    verdict = vmarkers.verdict(found=vm.markers, expected=expected)
    unmarked_match = verdict is vsphere.Verdict.UNMARKED and vm.name == vm_name
    if verdict is not vsphere.Verdict.OURS and not unmarked_match:
        carries = (
            f"carries no ownership markers and is not named {vm_name} as recorded"
            if verdict is vsphere.Verdict.UNMARKED
            else f"carries another owner's ownership markers, not those of {expected.describe()}"
        )
        return StartPlan(
            reason=failed,
            message=f"VM {vm.name} (BIOS UUID {vm.bios_uuid}) {carries}; nothing was touched",
        )
    agent_name = f"Agent {agent.metadata.namespace}/{agent.metadata.name}"
    serial_uuid = agent.bios_uuid
    vm_mac = identity.normalize_mac(vm.primary_mac)
    if serial_uuid is None or serial_uuid != identity.normalize_uuid(vm.bios_uuid):
        return StartPlan(
            reason=failed,
            message=f"{agent_name} reports serial "
            f"{agent.status.inventory.system_vendor.serial_number or '(none)'}, which does not "
            f"encode the BIOS UUID {vm.bios_uuid} of VM {vm.name}; nothing was touched",
        )
    if vm_mac is None or vm_mac not in agent.mac_addresses:
        macs = ", ".join(sorted(agent.mac_addresses)) or "none"
        vm_has = (
            f"VM {vm.name}'s MAC {vm_mac}" if vm_mac else f"a MAC of VM {vm.name} (it has none)"
        )
        return StartPlan(
            reason=failed,
            message=f"{agent_name} reports MACs {macs}, not {vm_has}; nothing was touched",
        )
    ours = candidates(vm.cdroms, datastore=datastore, prefix=prefix)
    if not ours and all(c.is_empty() for c in vm.cdroms):
        # What an eject leaves (ours before a reinstall, or someone's): already done.
        empty = ", ".join(f"CD-ROM {c.key}" for c in vm.cdroms)
        return StartPlan(
            reason=R.EJECTED,
            message=f"no discovery ISO is attached to VM {vm.name}: "
            + (
                f"{empty} {'is' if len(vm.cdroms) == 1 else 'are'} disconnected and empty "
                "(ejected before, by agent-forge or by hand); nothing was done"
                if vm.cdroms
                else "it has no CD-ROM; nothing was done"
            ),
        )
    if not ours:
        seen = "; ".join(why_not_ours(c, datastore=datastore, prefix=prefix) for c in vm.cdroms)
        return StartPlan(
            reason=R.NO_OWNED_MEDIA,
            message=f"VM {vm.name} holds none of the pool's cached ISOs "
            f"([{datastore}] {prefix.strip('/')}/<sha256>.iso), so nothing was ejected: "
            f"{seen}. What is attached stays attached",
        )
    if vm.question is not None:
        return StartPlan(
            reason=failed,
            message=f"VM {vm.name} has a pending question {vm.question.id} "
            f"({', '.join(vm.question.message_ids) or vm.question.text}) that agent-forge did "
            "not raise; it is left for a person to answer in vSphere, and the ejection goes on "
            "once it is answered",
        )
    return StartPlan(cdrom=ours[0])
