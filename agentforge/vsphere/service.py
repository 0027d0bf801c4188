"""`VsphereService`: the narrow async interface the reconcilers use (CAPV's services).

Every method takes keyword arguments and returns frozen dataclasses (facts) or
raises a typed `errors.VsphereError` (`errors.SessionUnavailable` when no session can
be had for the credentials now, `errors.LoginPending` while a login runs on). The
service holds credentials and borrows the shared session for exactly those
credentials from a `SessionRegistry` (one login per whole credential for the whole
process), so constructing services per pool is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentforge.vsphere import cdrom, datastore, errors, facts, iso, provision, task_facts, vms
from agentforge.vsphere import placement as placements
from agentforge.vsphere.credentials import Credentials
from agentforge.vsphere.markers import OwnershipMarkers
from agentforge.vsphere.placement import Placement, Problem
from agentforge.vsphere.registry import SessionRegistry
from agentforge.vsphere.session import Session


class VsphereService:
    def __init__(self, *, registry: SessionRegistry, credentials: Credentials) -> None:
        self._registry = registry
        self.credentials = credentials

    async def session(self) -> Session:
        return await self._registry.session(self.credentials)

    # --- checks -------------------------------------------------------------------

    async def preflight(self, *, placement: Placement) -> list[Problem]:
        """Every problem with credentials, connectivity and placement, in one go.

        `errors.LoginPending` (a login still running) is raised, not reported."""
        try:
            session = await self.session()
        except errors.VsphereError as exc:
            return [login_problem(self.credentials.netloc, exc)]
        _, problems = await placements.inspect(session, placement)
        return problems

    # --- VMs ----------------------------------------------------------------------

    async def create_vm(
        self, *, request: provision.VmRequest, on_task: provision.TaskStarted | None = None
    ) -> facts.VmFacts:
        return await provision.create(await self.session(), request, on_task=on_task)

    async def vm_by_moid(self, *, moid: str) -> facts.VmFacts | None:
        session = await self.session()
        return (await vms.fetch(session, [vms.ref_of(session, moid)])).get(moid)

    async def vm_by_uuid(self, *, datacenter: str, bios_uuid: str) -> facts.VmFacts | None:
        return await vms.facts_by_uuid(
            await self.session(), datacenter_name=datacenter, bios_uuid=bios_uuid
        )

    async def vms_by_uuid(
        self, *, datacenter: str, bios_uuids: Sequence[str]
    ) -> dict[str, facts.VmFacts]:
        return await vms.facts_by_uuids(
            await self.session(), datacenter_name=datacenter, bios_uuids=bios_uuids
        )

    async def vm_by_name(self, *, placement: Placement, name: str) -> facts.VmFacts | None:
        return await vms.find_by_name(await self.session(), where=placement, name=name)

    async def vms_in_folder(self, *, placement: Placement) -> list[facts.VmFacts]:
        return await vms.list_folder(await self.session(), placement)

    async def delete_vm(
        self, *, datacenter: str, bios_uuid: str, markers: OwnershipMarkers
    ) -> bool:
        return await vms.delete(
            await self.session(), datacenter_name=datacenter, bios_uuid=bios_uuid, expected=markers
        )

    async def stamp_markers(
        self, *, datacenter: str, bios_uuid: str, markers: OwnershipMarkers
    ) -> facts.VmFacts:
        return await vms.stamp(
            await self.session(), datacenter_name=datacenter, bios_uuid=bios_uuid, wanted=markers
        )

    # --- tasks --------------------------------------------------------------------

    async def task(self, *, task_ref: str) -> task_facts.TaskFacts:
        """Raises `NotFound` when vCenter no longer knows the task."""
        return await task_facts.read(await self.session(), task_ref)

    async def wait_for_task(self, *, task_ref: str) -> task_facts.TaskFacts:
        return await task_facts.wait(await self.session(), task_ref)

    async def creates_in_flight(self, *, placement: Placement) -> list[task_facts.TaskFacts]:
        return await task_facts.creates_in_flight(await self.session(), placement)

    # --- CD-ROM -------------------------------------------------------------------

    async def eject_cdrom(
        self,
        *,
        datacenter: str,
        vm_uuid: str,
        device_key: int,
        expected_backing: str,
        markers: OwnershipMarkers,
    ) -> cdrom.EjectOutcome:
        return await cdrom.eject(
            await self.session(),
            datacenter_name=datacenter,
            bios_uuid=vm_uuid,
            device_key=device_key,
            expected_backing=expected_backing,
            expected_markers=markers,
        )

    async def answer_cdrom_lock_question(
        self, *, datacenter: str, vm_uuid: str, question_id: str, markers: OwnershipMarkers
    ) -> None:
        await cdrom.answer_lock_question(
            await self.session(),
            datacenter_name=datacenter,
            bios_uuid=vm_uuid,
            question_id=question_id,
            expected_markers=markers,
        )

    async def resume_eject(
        self, *, datacenter: str, vm_uuid: str, device_key: int
    ) -> cdrom.EjectOutcome:
        return await cdrom.resume(
            await self.session(),
            datacenter_name=datacenter,
            bios_uuid=vm_uuid,
            device_key=device_key,
        )

    # --- datastore and ISO --------------------------------------------------------

    async def ensure_iso(
        self,
        *,
        source: iso.IsoSource,
        where: datastore.Location,
        prefix: str,
        previous: iso.IsoRecord | None = None,
        limits: iso.IsoLimits | None = None,
    ) -> iso.IsoResult:
        return await iso.ensure_iso(
            await self.session(),
            source=source,
            where=where,
            prefix=prefix,
            previous=previous,
            limits=limits,
        )

    async def vms_using_datastore(self, *, where: datastore.Location) -> list[facts.VmFacts]:
        return await datastore.vms_using(await self.session(), where=where)

    async def make_directory(self, *, where: datastore.Location, path: str) -> None:
        await datastore.mkdir(await self.session(), where=where, path=path)

    async def file_exists(self, *, where: datastore.Location, path: str) -> bool:
        return await datastore.exists(await self.session(), where=where, path=path)

    async def delete_file(self, *, where: datastore.Location, path: str) -> bool:
        return await datastore.delete(await self.session(), where=where, path=path)

    async def list_files(
        self, *, where: datastore.Location, prefix: str, pattern: str = "*.iso"
    ) -> list[datastore.DatastoreFile]:
        return await datastore.list_files(
            await self.session(), where=where, prefix=prefix, pattern=pattern
        )


def placement_problem(subject: str, exc: errors.VsphereError, fix: str) -> Problem:
    return Problem(subject=subject, message=str(exc), fix=fix)


def login_problem(netloc: str, exc: errors.VsphereError) -> Problem:
    """Why no session could be had, with the fix that applies."""
    where = f"vCenter {netloc}"
    if isinstance(exc, errors.LoginDeferred):
        fix = "wait until then; check every credentials Secret that names this user"
    elif isinstance(exc, errors.PermissionDenied):
        fix = "check username and password in the credentials Secret"
    elif isinstance(exc, errors.VcenterUnreachable):
        fix = "check the server address and network access to it"
    elif isinstance(exc, errors.ConnectionFailed) or exc.fault == "SSLCertVerificationError":
        fix = "add the vCenter CA bundle to the credentials Secret"
    else:
        fix = "check the server address and network access to it"
    return placement_problem(where, exc, fix)
