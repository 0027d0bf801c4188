"""Whether an ISO ejection may start, pure: the gate (cache only) and the start plan.

The rules (the seed's "Discovery ISO lifecycle"; resuming a record is `ejection_decide`):

* **gate** (no vSphere call): an `Ejected` condition is kept (also when the pool opts
  out later), unless an opted-in VM's Agent stops reporting Installed (a reinstall:
  it is ejected again afterwards); a pool that has not opted in shows `Disabled`; a
  VM that is Released, whose Machine is deleting or whose Agent is going away gets
  no new ejection; a new one starts only for a created or adopted VM whose Agent
  reports `Installed=True` (`Bound=True` alone never triggers).
* **start** (one vSphere read): the VM found by its recorded BIOS UUID must carry
  markers naming this pool (UID included) and VsphereAgent, or no markers at all and
  the recorded name (a VM the Go operator made: our markers are stamped after the
  checkpoint, before the disconnect); the Agent's inventory serial and MAC must be
  this VM's. Only a CD-ROM holding `[<isoDatastore>] <pathPrefix>/<sha256 hex>.iso`
  is a candidate; any other medium stays attached. A question already pending on
  the VM was not raised by us: nothing starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentforge import vsphere
from agentforge.api import identity, views
from agentforge.api.conditions import ISOEjectedReason
from agentforge.reconcilers import iso_cache
from agentforge.vsphere import markers as vmarkers

__all__ = ["Hold", "Start", "StartPlan", "candidates", "gate", "is_content_addressed", "plan_start"]

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
) -> Hold | Start:
    """Whether a new ejection may start for a VsphereAgent without a record."""
    if current is R.EJECTED:
        reinstalling = (
            enabled
            and vm_ready
            and not (released or machine_deleting)
            and agent is not None
            and not agent.is_deleting
            and not agent.is_installed
        )
        if not reinstalling:
            return Hold(None)  # kept, also after the pool opts out
        assert agent is not None
        return Hold(
            R.WAITING_FOR_INSTALLATION,
            f"Agent {agent.metadata.namespace}/{agent.metadata.name} no longer reports "
            "Installed=True (installed again?): any discovery ISO of the pool attached since is "
            "ejected once it does",
        )
    if not enabled:
        return Hold(
            R.DISABLED,
            f"VsphereAgentPool {pool} has spec.iso.ejectAfterInstall off: the discovery ISO "
            "stays attached; set it to true to eject after installation",
        )
    vm = f"VM {vm_name}" if vm_name else "the VM"
    if released or machine_deleting:
        why = f"its Machine {machine_deleting} is being deleted" if machine_deleting else "Released"
        return Hold(
            R.DISABLED,
            f"no ejection for {vm}: it is {why}; scale-down is left to CAPI and the "
            "discovery ISO stays attached",
        )
    if not vm_ready or not vm_name:
        return Hold(R.WAITING_FOR_INSTALLATION, f"waiting for {vm} to be created or adopted")
    if agent is None:
        return Hold(R.WAITING_FOR_INSTALLATION, f"waiting for an Agent to register from {vm}")
    name = f"Agent {agent.metadata.namespace}/{agent.metadata.name}"
    if agent.is_deleting:
        return Hold(R.DISABLED, f"no ejection for {vm}: {name} is being deleted")
    if not agent.is_installed:
        installed = agent.status.condition(views.CONDITION_INSTALLED)
        now = f"Installed={installed.status}/{installed.reason}" if installed else "no Installed"
        return Hold(
            R.WAITING_FOR_INSTALLATION,
            f"waiting for {name} of {vm} to report Installed=True (it reports {now}; "
            "Bound alone is not enough)",
        )
    return Start()


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


def _media(cdroms: list[vsphere.Cdrom]) -> str:
    held = [f"CD-ROM {c.key} ({c.backing_file})" for c in cdroms]
    return ", ".join(held) if held else "none"


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
        return StartPlan(
            reason=failed,
            message=f"VM {vm.name} (BIOS UUID {vm.bios_uuid}) carries {verdict.value} ownership "
            f"markers, not {expected.describe()}, and is not the unmarked VM {vm_name} recorded; "
            "nothing was touched",
        )
    agent_name = f"Agent {agent.metadata.namespace}/{agent.metadata.name}"
    serial_uuid = agent.bios_uuid
    vm_mac = identity.normalize_mac(vm.primary_mac)
    if serial_uuid is None or serial_uuid != identity.normalize_uuid(vm.bios_uuid):
        return StartPlan(
            reason=failed,
            message=f"{agent_name} reports serial "
            f"{agent.status.inventory.system_vendor.serial_number or '(none)'}, which is not "
            f"VM {vm.name} (BIOS UUID {vm.bios_uuid}); nothing was touched",
        )
    if vm_mac is None or vm_mac not in agent.mac_addresses:
        macs = ", ".join(sorted(agent.mac_addresses)) or "none"
        return StartPlan(
            reason=failed,
            message=f"{agent_name} reports MACs {macs}, not VM {vm.name}'s {vm_mac}; "
            "nothing was touched",
        )
    ours = candidates(vm.cdroms, datastore=datastore, prefix=prefix)
    others = [c for c in vm.cdroms if c not in ours and c.kind is vsphere.MediumKind.ISO]
    if not ours:
        return StartPlan(
            reason=R.EJECTED,
            message=f"VM {vm.name} holds no discovery ISO of [{datastore}] {prefix}/; "
            f"other media left attached: {_media(others)}",
        )
    if vm.question is not None:
        return StartPlan(
            reason=failed,
            message=f"VM {vm.name} has a pending question {vm.question.id} "
            f"({', '.join(vm.question.message_ids) or vm.question.text}) that agent-forge did "
            "not raise; it is left for a person: answer it in vSphere, the ejection is retried",
        )
    return StartPlan(cdrom=ours[0])
