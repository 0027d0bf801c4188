"""VM lookups, facts, delete and marker stamping, guarded by ownership markers.

Rules this module keeps:
- lookups go by BIOS UUID (`SearchIndex.FindByUuid` in the datacenter), with the
  moref cached per session and re-checked on every read (the read returns
  `config.uuid`, so a stale cache entry is detected, never trusted);
- facts of one VM or of many VMs cost one PropertyCollector round trip;
- (creation lives in `provision`);
- delete and stamp refuse VMs whose markers are not ours (`OwnershipMismatch`);
- power, delete and stamp tasks are started (`start_power_on`, `start_delete`,
  `start_stamp`) and never waited for: the task is followed (`Session.follow`) and its
  end is news for the caller, who reads its outcome by the recorded moref.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentforge import identity
from agentforge.vsphere import metrics, vmomi
from agentforge.vsphere.model import errors, markers
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks.slots import Slot
from agentforge.vsphere.vm import build_specs as specs
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vm import resolve_placement as placement
from agentforge.vsphere.vmomi import vim

# --- facts --------------------------------------------------------------------------


def ref_of(session: Session, moid: str) -> Any:
    return vim.VirtualMachine(moid, session.content.propertyCollector._stub)


async def fetch(session: Session, refs: Sequence[Any]) -> dict[str, facts.VmFacts]:
    """Facts of many VMs in one round trip; VMs that no longer exist are absent."""
    if not refs:
        return {}
    content = session.content
    found = await session.call(
        lambda: vmomi.retrieve(
            content,
            objects=vmomi.object_specs(refs),
            props=[(vim.VirtualMachine, list(facts.VM_PATHS))],
        ),
        subject=f"{len(refs)} VM(s)",
        action="read facts of",
    )
    got = {f.moid: facts.parse_vm(f.moid, f.props) for f in found if not vmomi.is_gone(f)}
    for fetched in found:  # remember the moref by BIOS UUID (re-checked on every read)
        vm = got.get(fetched.moid)
        if vm is not None and vm.bios_uuid:
            session.cache.vms[vm.bios_uuid] = fetched.ref
    return got


async def list_folder(session: Session, where: placement.Placement) -> list[facts.VmFacts]:
    """Facts of every VM directly in the placement's folder, in one round trip."""
    resolved = await placement.resolve(session, where)
    if resolved.folder is None:
        return []
    content = session.content
    found = await session.call(
        lambda: vmomi.retrieve(
            content,
            objects=[vmomi.children_spec(resolved.folder)],
            props=[(vim.VirtualMachine, list(facts.VM_PATHS))],
        ),
        subject=f"folder {where.folder}",
        action="list VMs in",
    )
    return [facts.parse_vm(f.moid, f.props) for f in found if isinstance(f.ref, vim.VirtualMachine)]


async def datacenter(session: Session, name: str) -> Any:
    """The datacenter's moref, looked up once per session."""

    async def find() -> Any:
        index = session.content.searchIndex
        dc = await session.call(
            lambda: index.FindByInventoryPath(inventoryPath=name),
            subject=f"datacenter {name}",
            action="look up",
        )
        if not isinstance(dc, vim.Datacenter):
            raise errors.NotFound(f"datacenter {name} not found", subject=f"datacenter {name}")
        return dc

    return await session.cache.datacenters.get_or_make(name, find)


async def find_by_uuid(session: Session, *, datacenter_name: str, bios_uuid: str) -> Any | None:
    dc = await datacenter(session, datacenter_name)
    index = session.content.searchIndex
    ref = await session.call(
        lambda: index.FindByUuid(datacenter=dc, uuid=bios_uuid, vmSearch=True, instanceUuid=False),
        subject=f"VM with BIOS UUID {bios_uuid}",
        action="find",
    )
    return ref if isinstance(ref, vim.VirtualMachine) else None


async def facts_by_uuid(
    session: Session, *, datacenter_name: str, bios_uuid: str
) -> facts.VmFacts | None:
    found = await facts_by_uuids(session, datacenter_name=datacenter_name, bios_uuids=[bios_uuid])
    return found.get(identity.require_uuid(bios_uuid))


async def facts_by_uuids(
    session: Session, *, datacenter_name: str, bios_uuids: Sequence[str]
) -> dict[str, facts.VmFacts]:
    """Facts keyed by normalized BIOS UUID; missing VMs are absent from the result.

    Cached morefs are read in one request; only UUIDs without a (valid) cached moref
    cost a `FindByUuid` each, then one more read for all of them.
    """
    wanted = [identity.require_uuid(u) for u in bios_uuids]
    result: dict[str, facts.VmFacts] = {}
    cached = {u: session.cache.vms.get(u) for u in wanted}
    hits = {u: r for u, r in cached.items() if r is not None}
    if hits:
        got = await fetch(session, list(hits.values()))
        for uuid, ref in hits.items():
            item = got.get(ref._moId)
            if item is not None and item.bios_uuid == uuid:
                result[uuid] = item
            else:
                session.cache.vms.pop(uuid, None)
    missing = [u for u in wanted if u not in result]
    if missing:
        refs = await asyncio.gather(
            *(find_by_uuid(session, datacenter_name=datacenter_name, bios_uuid=u) for u in missing)
        )
        found = {u: r for u, r in zip(missing, refs, strict=True) if r is not None}
        got = await fetch(session, list(found.values()))
        for uuid, ref in found.items():
            item = got.get(ref._moId)
            if item is not None and item.bios_uuid == uuid:
                result[uuid] = item
                session.cache.vms[uuid] = ref
    return result


async def find_by_name(
    session: Session, *, where: placement.Placement, name: str
) -> facts.VmFacts | None:
    resolved = await placement.resolve(session, where)
    if resolved.folder is None:
        return None
    index = session.content.searchIndex
    ref = await session.call(
        lambda: index.FindChild(entity=resolved.folder, name=name),
        subject=f"VM {name}",
        action="find",
    )
    if not isinstance(ref, vim.VirtualMachine):
        return None
    return (await fetch(session, [ref])).get(ref._moId)


# --- power and delete ---------------------------------------------------------------


async def start_power_on(session: Session, ref: Any, *, subject: str, slot: Slot) -> str | None:
    """Start powering the VM on; the task's moref (followed), or None when it already
    runs. Never waits for the task; `slot` is bound to it or released."""
    try:
        try:
            task = await session.call(ref.PowerOnVM_Task, subject=subject, action="power on")
        except errors.InvalidState:
            got = (await fetch(session, [ref])).get(ref._moId)
            if got is None or got.power_state is not facts.PowerState.ON:
                raise
            return None
        return session.follow(task, slot=slot)
    finally:
        if slot.task is None:
            slot.release()


@dataclass(frozen=True, slots=True)
class DeleteStep:
    """What `start_delete` did to the VM."""

    action: str
    """"power off", "destroy", or "" when the VM was already gone."""
    task: str | None = None
    """The started task's moref (followed: its end is news)."""
    vm: facts.VmFacts | None = None


async def start_delete(
    session: Session,
    *,
    datacenter_name: str,
    bios_uuid: str,
    expected: markers.OwnershipMarkers,
    slot: Slot,
) -> DeleteStep:
    """The next step of deleting our VM, started and not waited for: power off while
    it is not off, then destroy. Refuses a VM that is not ours; `slot` is bound to the
    started task or released. Call again once the task ended."""
    try:
        with metrics.failures("vm", "delete"):
            got = await facts_by_uuid(session, datacenter_name=datacenter_name, bios_uuid=bios_uuid)
            if got is None:
                return DeleteStep("")
            require_ours(got, expected, action="delete")
            ref = ref_of(session, got.moid)
            subject = f"VM {got.name}"
            if got.power_state is not facts.PowerState.OFF:
                try:
                    task = await session.call(
                        ref.PowerOffVM_Task, subject=subject, action="power off"
                    )
                    return DeleteStep("power off", session.follow(task, slot=slot), got)
                except errors.InvalidState:
                    pass  # (it is off by now: destroy it)
            try:
                task = await session.call(ref.Destroy_Task, subject=subject, action="destroy")
            except errors.NotFound:
                return DeleteStep("")
            if got.bios_uuid:
                session.cache.vms.pop(got.bios_uuid, None)
            return DeleteStep("destroy", session.follow(task, slot=slot), got)
    finally:
        if slot.task is None:
            slot.release()


async def _to_stamp(
    session: Session, *, datacenter_name: str, bios_uuid: str, wanted: markers.OwnershipMarkers
) -> tuple[facts.VmFacts, bool]:
    """The VM to stamp and whether it carries our markers already; a VM that is gone
    or carries another owner's markers is refused."""
    got = await facts_by_uuid(session, datacenter_name=datacenter_name, bios_uuid=bios_uuid)
    if got is None:
        raise errors.NotFound(
            f"VM with BIOS UUID {bios_uuid} not found in datacenter {datacenter_name}",
            subject=f"VM {bios_uuid}",
        )
    verdict = markers.verdict(found=got.markers, expected=wanted)
    if verdict is markers.Verdict.FOREIGN:
        raise errors.OwnershipMismatch(
            f"VM {got.name} carries another owner's markers; not stamping "
            f"{wanted.describe()} over them",
            subject=f"VM {got.name}",
        )
    return got, verdict is markers.Verdict.OURS


async def start_stamp(
    session: Session,
    *,
    datacenter_name: str,
    bios_uuid: str,
    wanted: markers.OwnershipMarkers,
    slot: Slot,
) -> tuple[facts.VmFacts, str | None]:
    """Write our markers on an unmarked VM (adoption), started and not waited for: the
    VM's facts and the reconfigure's moref (followed), or None when the VM is ours
    already. `slot` is bound or released."""
    try:
        with metrics.failures("vm", "stamp"):
            got, ours = await _to_stamp(
                session, datacenter_name=datacenter_name, bios_uuid=bios_uuid, wanted=wanted
            )
            if ours:
                return got, None
            ref = ref_of(session, got.moid)
            spec = specs.stamp_spec(wanted)
            task = await session.call(
                lambda: ref.ReconfigVM_Task(spec=spec),
                subject=f"VM {got.name}",
                action="stamp ownership markers on",
            )
            return got, session.follow(task, slot=slot)
    finally:
        if slot.task is None:
            slot.release()


def require_ours(got: facts.VmFacts, expected: markers.OwnershipMarkers, *, action: str) -> None:
    verdict = markers.verdict(found=got.markers, expected=expected)
    if verdict is not markers.Verdict.OURS:
        raise errors.OwnershipMismatch(
            f"refusing to {action} VM {got.name} (BIOS UUID {got.bios_uuid}): its ownership "
            f"markers are {verdict.value}, expected {expected.describe()}; nothing was touched",
            subject=f"VM {got.name}",
        )
