"""Creating a VM: placed by Storage DRS, marked as ours, idempotent, never waited for.

`start` resolves the placement, asks Storage DRS and starts `CreateVM_Task`, then
returns its moref at once; the task is followed (`Session.follow`) and its end is news
for the caller, who reads the outcome by the recorded moref and then `converge`s the
VM (tags, power on: started, not waited for).

Promises:
- create is idempotent by name + markers: a same-named VM with our exact markers is
  returned for converging, any other is reported as `AlreadyExists` and never
  touched; `DuplicateName` with nothing holding the name yet (a creation of that
  name still running: vCenter reserves the name when the task starts) is
  `CreationInFlight`, neither absent nor a conflict;
- the datastore comes from `StorageResourceManager.RecommendDatastores` for the
  pool's datastore cluster; the recommendation is applied by pinning the VM's files
  and disk to the recommended datastore (as `govc vm.create -datastore-cluster` does);
  a failure domain's single datastore is used as it is (no recommendation asked), and
  a chosen host (`placement.host`) is passed to `CreateVM_Task` and to Storage DRS;
- a VM left unfinished (tags, power on refused or interrupted) is never removed
  here: the next attempt finds it by name and markers and converges it.

Attaching vSphere tags (by ID) to a VM over the vAPI REST endpoint.

Tags are not part of the SOAP API. The vAPI session is created once per SOAP session
(basic auth over the verified TLS connection), kept in the session cache, and
created again on 401. All tags go in one `attach-multiple-tags-to-object` call;
vCenter's per-tag errors are reported together, naming the tag IDs.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentforge.vsphere import metrics
from agentforge.vsphere.model import errors, markers
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks.slots import Slot
from agentforge.vsphere.vm import build_specs as specs
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vm import resolve_placement as placement
from agentforge.vsphere.vmomi import vim


@dataclass(frozen=True, slots=True)
class VmRequest:
    """Everything needed to create one VM."""

    name: str
    placement: placement.Placement
    hardware: specs.Hardware
    iso_file: str
    markers: markers.OwnershipMarkers
    tag_ids: tuple[str, ...] = ()
    power_on: bool = True
    bios_uuid: str | None = None  # becomes config.uuid when set (chosen and recorded first)


@dataclass(frozen=True, slots=True)
class Started:
    """What `start` did: started the create task, or found the VM already ours."""

    task: str | None = None
    """The `CreateVM_Task` moref (followed: its end is news)."""
    existing: facts.VmFacts | None = None
    """The name was taken by our own VM (same markers): converge it, create nothing."""


async def start(session: Session, request: VmRequest, *, slot: Slot) -> Started:
    """Start creating the VM; never waits for the task (see the module doc).

    `slot` is bound to the started task, or released when nothing was started."""
    try:
        with metrics.failures("vm", "create"):
            try:
                return await _start(session, request, slot)
            except errors.NotFound:
                placement.invalidate(session, request.placement)  # a stale cached moref
                return await _start(session, request, slot)
    finally:
        if slot.task is None:
            slot.release()


async def _start(session: Session, request: VmRequest, slot: Slot) -> Started:
    resolved = await placement.resolve(session, request.placement)
    folder = await placement.ensure_folder(session, resolved)
    subject = f"VM {request.name}"
    spec = await _spec_unless_taken(session, resolved, folder, request)
    if spec is None:
        return Started(existing=await _existing(session, request))
    try:
        task = await session.call(
            lambda: folder.CreateVM_Task(
                config=spec, pool=resolved.resource_pool, host=resolved.host
            ),
            subject=subject,
            action="create",
        )
    except errors.AlreadyExists:  # DuplicateName on the call: the folder holds the name
        return Started(existing=await _existing(session, request))
    return Started(task=session.follow(task, slot=slot))


async def converge(session: Session, request: VmRequest, *, vm_moid: str, slot: Slot) -> str | None:
    """Tag the VM and start powering it on; the power-on task's moref (followed), or
    None when the VM already runs. `slot` is bound to the task or released."""
    try:
        await attach(session, vm_moid=vm_moid, tag_ids=request.tag_ids)
        if not request.power_on:
            return None
        return await vms.start_power_on(
            session, vms.ref_of(session, vm_moid), subject=f"VM {request.name}", slot=slot
        )
    finally:
        if slot.task is None:
            slot.release()


async def _spec_unless_taken(
    session: Session, resolved: placement.ResolvedPlacement, folder: Any, request: VmRequest
) -> Any | None:
    """The create spec (datastore recommended), or None when the folder already holds
    a VM of that name (the callers decide whether it is ours)."""
    index = session.content.searchIndex
    taken = await session.call(
        lambda: index.FindChild(entity=folder, name=request.name),
        subject=f"VM {request.name}",
        action="find",
    )
    if taken is not None:
        return None
    if resolved.placement.datastore:  # a failure domain's single datastore: no Storage DRS
        ds_ref, ds_name = resolved.storage_pod, resolved.placement.datastore
    else:
        ds_ref, ds_name = await _recommend(session, resolved, folder, request)
    return specs.create_spec(
        name=request.name,
        hardware=request.hardware,
        network=resolved.network,
        datastore_name=ds_name,
        datastore_ref=ds_ref,
        iso_file=request.iso_file,
        markers=request.markers,
        bios_uuid=request.bios_uuid,
    )


async def _recommend(
    session: Session, resolved: placement.ResolvedPlacement, folder: Any, request: VmRequest
) -> tuple[Any, str]:
    """Ask Storage DRS where the VM goes; pin its files and disk there (as govc does)."""
    draft = specs.create_spec(
        name=request.name,
        hardware=request.hardware,
        network=resolved.network,
        datastore_name=None,
        datastore_ref=None,
        iso_file=request.iso_file,
        markers=request.markers,
        bios_uuid=request.bios_uuid,
    )
    disk = next(
        c.device for c in draft.deviceChange if isinstance(c.device, vim.vm.device.VirtualDisk)
    )
    pod = resolved.storage_pod
    placement_spec = vim.storageDrs.StoragePlacementSpec(
        type="create",
        resourcePool=resolved.resource_pool,
        host=resolved.host,
        folder=folder,
        configSpec=draft,
        podSelectionSpec=vim.storageDrs.PodSelectionSpec(
            storagePod=pod,
            initialVmConfig=[
                vim.storageDrs.PodSelectionSpec.VmPodConfig(
                    storagePod=pod,
                    disk=[
                        vim.storageDrs.PodSelectionSpec.DiskLocator(
                            diskId=disk.key, diskBackingInfo=disk.backing
                        )
                    ],
                )
            ],
        ),
    )
    srm = session.content.storageResourceManager
    pod_name = resolved.placement.datastore_cluster
    result = await session.call(
        lambda: srm.RecommendDatastores(storageSpec=placement_spec),
        subject=f"datastore cluster {pod_name}",
        action="ask Storage DRS for a datastore in",
    )
    for rec in getattr(result, "recommendations", None) or []:
        for action in rec.action or []:
            dest = getattr(action, "destination", None)
            if dest is not None:
                return dest, resolved.pod_datastores.get(dest._moId, dest._moId)
    raise errors.InvalidSpec(
        f"Storage DRS recommended no datastore in datastore cluster {pod_name} for VM "
        f"{request.name} (check free space and that Storage DRS is enabled)",
        subject=f"datastore cluster {pod_name}",
    )


async def _existing(session: Session, request: VmRequest) -> facts.VmFacts:
    """The VM holding the name, when it is ours; else `CreationInFlight` (a creation of
    that name still runs) or `AlreadyExists` (someone else's)."""
    existing = await vms.find_by_name(session, where=request.placement, name=request.name)
    if existing is None:
        if await _holder_of(session, request) is None:
            raise errors.CreationInFlight(
                f"VM {request.name}: vCenter reserves the name in folder "
                f"{request.placement.folder} for a creation still running; wait for it",
                subject=f"VM {request.name}",
            )
        raise errors.AlreadyExists(
            f"VM {request.name}: the name is taken in folder {request.placement.folder} "
            "by an object that is not a VM; pick another name",
            subject=f"VM {request.name}",
        )
    verdict = markers.verdict(found=existing.markers, expected=request.markers)
    if verdict is not markers.Verdict.OURS:
        raise errors.AlreadyExists(
            f"VM {request.name} already exists in folder {request.placement.folder} and is not "
            f"ours ({verdict.value} ownership markers); it is left alone: rename or remove it",
            subject=f"VM {request.name}",
        )
    return existing


async def _holder_of(session: Session, request: VmRequest) -> Any | None:
    """Whatever holds the name in the folder (a VM, a folder, a vApp), or None."""
    resolved = await placement.resolve(session, request.placement)
    if resolved.folder is None:
        return None
    index, folder = session.content.searchIndex, resolved.folder
    return await session.call(
        lambda: index.FindChild(entity=folder, name=request.name),
        subject=f"VM {request.name}",
        action="find",
    )


SESSION_PATH = "/rest/com/vmware/cis/session"

ATTACH_PATH = "/rest/com/vmware/cis/tagging/tag-association"

HEADER = "vmware-api-session-id"


async def attach(session: Session, *, vm_moid: str, tag_ids: Sequence[str]) -> None:
    """Attach every tag to the VM; raise naming the tags vCenter refused."""
    if not tag_ids:
        return
    body = {"object_id": {"id": vm_moid, "type": "VirtualMachine"}, "tag_ids": list(tag_ids)}
    for attempt in range(2):
        token = await _token(session, fresh=attempt > 0)
        http = session.http()
        await session.throttle()
        try:
            async with http.post(
                ATTACH_PATH,
                params={"~action": "attach-multiple-tags-to-object"},
                json=body,
                headers={HEADER: token},
            ) as resp:
                if resp.status == 401 and attempt == 0:
                    continue
                if resp.status >= 400:
                    raise _http_error(resp.status, f"attach tags to VM {vm_moid}")
                payload: Any = await resp.json()
        except aiohttp.ClientError as exc:
            raise errors.TransientError(
                f"attach tags to VM {vm_moid} failed: {type(exc).__name__}", subject=vm_moid
            ) from None
        result = payload.get("value", payload) if isinstance(payload, dict) else {}
        if isinstance(result, dict) and result.get("success") is False:
            messages = [str(m.get("message", m)) for m in result.get("error_messages") or []]
            raise errors.InvalidSpec(
                f"attach tags {', '.join(tag_ids)} to VM {vm_moid} failed: {'; '.join(messages)} "
                "(check spec.vsphere.vmTags holds existing tag IDs)",
                subject=f"VM {vm_moid}",
            )
        return
    raise errors.PermissionDenied(f"vAPI refused the session for VM {vm_moid}", subject=vm_moid)


async def _token(session: Session, *, fresh: bool) -> str:
    cached = session.cache.vapi_token
    if cached is not None and not fresh:
        return cached
    creds = session.credentials
    http = session.http()
    try:
        basic = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        async with http.post(SESSION_PATH, headers={"Authorization": f"Basic {basic}"}) as resp:
            if resp.status >= 400:
                raise _http_error(resp.status, f"create vAPI session for {creds.key}")
            payload: Any = await resp.json()
    except aiohttp.ClientError as exc:
        raise errors.TransientError(
            f"create vAPI session for {creds.key} failed: {type(exc).__name__}",
            subject=str(creds.key),
        ) from None
    token = payload.get("value") if isinstance(payload, dict) else payload
    if not isinstance(token, str) or not token:
        raise errors.VsphereError(f"vAPI session for {creds.key} returned no token")
    session.cache.vapi_token = token
    return token


def _http_error(status: int, what: str) -> errors.VsphereError:
    if status in (401, 403):
        return errors.PermissionDenied(f"{what}: HTTP {status}", subject=what)
    if status == 404:  # an unknown tag or object: the request is wrong, not a stale cache
        return errors.InvalidSpec(f"{what}: HTTP 404", subject=what)
    if status in (429, 502, 503, 504):
        return errors.TransientError(f"{what}: HTTP {status}", subject=what)
    return errors.VsphereError(f"{what}: HTTP {status}", subject=what)
