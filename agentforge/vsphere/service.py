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

from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.iso import pipeline as iso
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.facts import EjectOutcome, TaskFacts
from agentforge.vsphere.model.markers import OwnershipMarkers
from agentforge.vsphere.session.credentials import Credentials
from agentforge.vsphere.session.registry import SessionRegistry
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks.slots import Slot
from agentforge.vsphere.vm import cdrom, compute_cluster, provision
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vm import resolve_placement as placements
from agentforge.vsphere.vm.resolve_placement import Placement, Problem


class VsphereService:
    def __init__(self, *, registry: SessionRegistry, credentials: Credentials) -> None:
        self._registry = registry
        self.credentials = credentials

    async def session(self) -> Session:
        return await self._registry.session(self.credentials)

    @property
    def vcenter(self) -> str:
        """The vCenter (`host:port`) these credentials reach: where the task cap applies."""
        return self.credentials.netloc

    # --- checks -------------------------------------------------------------------

    async def preflight(self, *, placement: Placement) -> list[Problem]:
        """Every problem with credentials, connectivity and placement, in one go.

        `errors.LoginPending` (a login still running) is raised, not reported."""
        problems, _ = await self.inspect_storage(placement=placement)
        return problems

    async def inspect_storage(self, *, placement: Placement) -> tuple[list[Problem], int]:
        """`preflight`, and the placement's free storage in bytes read in the same
        inventory retrieval (its datastore's, or summed over its datastore cluster's
        accessible datastores; 0 when it has problems)."""
        try:
            session = await self.session()
        except errors.VsphereError as exc:
            return [login_problem(self.credentials.netloc, exc)], 0
        resolved, problems = await placements.inspect(session, placement)
        return problems, resolved.free_storage if resolved is not None else 0

    async def cluster_hosts(
        self, *, datacenter: str, cluster: str, host_group: str | None = None
    ) -> list[compute_cluster.HostState]:
        """Every host of a compute cluster (or of a host group in it), with its state."""
        return await compute_cluster.cluster_hosts(
            await self.session(),
            datacenter=datacenter,
            cluster=cluster,
            host_group=host_group,
        )

    async def start_anti_affinity(
        self, *, datacenter: str, cluster: str, pool_uid: str, name: str, vm_moids: list[str]
    ) -> tuple[str, str | None]:
        """Start bringing the pool's DRS anti-affinity rule in `cluster` to hold exactly
        `vm_moids` (removed with fewer than two): the action (`none`, `add`, `edit`,
        `remove`) and the moref of the followed reconfigure task (None: nothing to do)."""
        change, task = await compute_cluster.start_anti_affinity(
            await self.session(),
            datacenter=datacenter,
            cluster=cluster,
            pool_uid=pool_uid,
            name=name,
            vm_moids=vm_moids,
        )
        return change.action, task

    # --- VMs ----------------------------------------------------------------------

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

    # --- tasks: started, never waited for ----------------------------------------------
    # Every mutation is a vCenter task: the caller claims a slot, starts the task,
    # records the returned moref and returns; the registry's `subscribe_tasks`
    # listeners hear when the task ended, and the caller reads its outcome (`task`).

    def claim_task_slot(self, *, group: str, token: str, keep: bool = False) -> Slot:
        """A slot for one task, or `errors.TaskSlotPending` (see `task_slots`)."""
        return self._registry.claim_task_slot(self.vcenter, group=group, token=token, keep=keep)

    async def _session_for(self, slot: Slot) -> Session:
        """The session for a task about to start; `slot` goes back when there is none."""
        try:
            return await self.session()
        except BaseException:
            slot.release()
            raise

    async def start_create(self, *, request: provision.VmRequest, slot: Slot) -> provision.Started:
        return await provision.start(await self._session_for(slot), request, slot=slot)

    async def converge_vm(
        self, *, request: provision.VmRequest, vm_moid: str, slot: Slot
    ) -> str | None:
        """Tags, then power on started: the task's moref, None when the VM runs."""
        return await provision.converge(
            await self._session_for(slot), request, vm_moid=vm_moid, slot=slot
        )

    async def start_delete(
        self, *, datacenter: str, bios_uuid: str, markers: OwnershipMarkers, slot: Slot
    ) -> vms.DeleteStep:
        return await vms.start_delete(
            await self._session_for(slot),
            datacenter_name=datacenter,
            bios_uuid=bios_uuid,
            expected=markers,
            slot=slot,
        )

    async def start_stamp(
        self, *, datacenter: str, bios_uuid: str, markers: OwnershipMarkers, slot: Slot
    ) -> tuple[facts.VmFacts, str | None]:
        """Our markers on an unmarked VM, started: its facts and the task (None: ours)."""
        return await vms.start_stamp(
            await self._session_for(slot),
            datacenter_name=datacenter,
            bios_uuid=bios_uuid,
            wanted=markers,
            slot=slot,
        )

    async def follow_task(self, *, task_ref: str) -> None:
        """Report the end of a task found running (one an earlier process started)."""
        session = await self.session()
        session.follow(facts.task_ref(session, task_ref))

    # --- tasks --------------------------------------------------------------------

    async def task(self, *, task_ref: str) -> TaskFacts:
        """Raises `NotFound` when vCenter no longer knows the task."""
        return await facts.read_task(await self.session(), task_ref)

    async def creates_in_flight(self, *, placement: Placement) -> list[TaskFacts]:
        return await facts.creates_in_flight(await self.session(), placement)

    # --- CD-ROM -------------------------------------------------------------------

    async def eject_cdrom(
        self,
        *,
        datacenter: str,
        vm_uuid: str,
        device_key: int,
        expected_backing: str,
        markers: OwnershipMarkers,
        slot: Slot,
    ) -> EjectOutcome:
        """Start the reconfigure and follow it, never wait for it (`EjectState.IN_PROGRESS`)."""
        return await cdrom.eject(
            await self._session_for(slot),
            datacenter_name=datacenter,
            bios_uuid=vm_uuid,
            device_key=device_key,
            expected_backing=expected_backing,
            expected_markers=markers,
            slot=slot,
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

    async def resume_eject(self, *, datacenter: str, vm_uuid: str, device_key: int) -> EjectOutcome:
        """The device's state; a reconfigure still running is followed, not waited for."""
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
