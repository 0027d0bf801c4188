"""Files on a datastore: mkdir -p, exists, delete, move, list, and streaming upload.

Metadata goes through the SOAP API (FileManager, HostDatastoreBrowser) with typed
errors; bytes go through the datastore HTTP file service
(`/folder/<path>?dcPath=<dc>&dsName=<ds>`) authenticated by the SOAP session cookie,
over the same verified TLS. `exists` is one HTTP HEAD. `upload` streams an async
iterator of chunks as a chunked PUT: nothing is buffered beyond aiohttp's own
write buffer, so memory stays constant whatever the file size. A 401 means the
session expired: the session logs in again (once) and a HEAD is retried; an upload
raises `SessionExpired` because its body cannot be replayed (the caller restarts).
An upload that broke off before the server answered raises `UploadAborted`: only an
answered PUT is over on the server's side. `delete` says "was not there" only on the
task's `FileNotFound`; any other "not found" (a forgotten task) is checked with a HEAD.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import AsyncIterable
from typing import Any
from urllib.parse import quote

import aiohttp

from agentforge.vsphere import vmomi
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.specs import DatastoreFile, Location
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.tasks import waiter as tasks
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vmomi import PC, vim

FILE_NOT_FOUND = "FileNotFound"  # the fault (vim.fault.FileNotFound) about the file itself


class UploadAborted(errors.TransientError):
    """The PUT broke off before the file service answered it (a transport error, a
    timeout, a body that raised). The server may still be working on the request: the
    file can appear, or grow, after this was raised. Only an answered PUT is over."""


async def _refs(session: Session, where: Location) -> tuple[Any, Any, Any]:
    """(datacenter, datastore, browser) morefs, cached per session."""
    return await session.cache.datastores.get_or_make(
        where, functools.partial(_lookup, session, where)
    )


async def _lookup(session: Session, where: Location) -> tuple[Any, Any, Any]:
    dc = await vms.datacenter(session, where.datacenter)
    content = session.content
    spec = PC.ObjectSpec(
        obj=dc,
        skip=True,
        selectSet=[PC.TraversalSpec(name="ds", type=vim.Datacenter, path="datastore", skip=False)],
    )
    found = await session.call(
        lambda: vmomi.retrieve(
            content, objects=[spec], props=[(vim.Datastore, ["name", "browser"])]
        ),
        subject=f"datacenter {where.datacenter}",
        action="list datastores of",
    )
    for item in found:
        if item.props.get("name") == where.datastore:
            return (dc, item.ref, item.props.get("browser"))
    raise errors.NotFound(
        f"datastore {where.datastore} not found in datacenter {where.datacenter}",
        subject=f"datastore {where.datastore}",
    )


async def mkdir(session: Session, *, where: Location, path: str) -> None:
    """`mkdir -p`: create the directory and its parents; existing is fine."""
    dc, _, _ = await _refs(session, where)
    fm = session.content.fileManager
    try:
        await session.call(
            lambda: fm.MakeDirectory(
                name=where.path(path), datacenter=dc, createParentDirectories=True
            ),
            subject=where.path(path),
            action="create directory",
        )
    except errors.AlreadyExists:
        return


async def delete(session: Session, *, where: Location, path: str) -> bool:
    """Delete a file; True if it is gone now, False if vCenter said it was not there.

    Only the task's own `FileNotFound` fault means "not there". Any other `NotFound`
    leaves the outcome unknown: vCenter forgot the delete task (tasks expire; after a
    vCenter restart), or an object of the call (the datacenter) went missing. Then one
    HEAD decides: the file absent -> True (gone, most likely by this delete); still
    there -> `TransientError` (nothing was deleted as far as can be told; retry).
    """
    dc, _, _ = await _refs(session, where)
    fm = session.content.fileManager
    try:
        await tasks.run_task(
            session,
            lambda: fm.DeleteDatastoreFile_Task(name=where.path(path), datacenter=dc),
            subject=where.path(path),
            action="delete",
        )
    except errors.NotFound as exc:
        if exc.fault == FILE_NOT_FOUND:
            return False
        if await exists(session, where=where, path=path):
            raise errors.TransientError(
                f"delete {where.path(path)} ended unknown ({exc}) and the file is still "
                "there; retried",
                subject=where.path(path),
            ) from exc
    return True


async def move(session: Session, *, where: Location, source: str, destination: str) -> None:
    """Rename a file within the datastore; `AlreadyExists` if the destination exists."""
    dc, _, _ = await _refs(session, where)
    fm = session.content.fileManager
    await tasks.run_task(
        session,
        lambda: fm.MoveDatastoreFile_Task(
            sourceName=where.path(source),
            sourceDatacenter=dc,
            destinationName=where.path(destination),
            destinationDatacenter=dc,
            force=False,
        ),
        subject=where.path(source),
        action=f"move to {where.path(destination)}",
    )


async def vms_using(session: Session, *, where: Location) -> list[facts.VmFacts]:
    """Facts of every VM vCenter lists as using the datastore (its `vm` property, which
    counts a mounted ISO), in one round trip; for "is this file still attached?"."""
    _, ds, _ = await _refs(session, where)
    content = session.content
    spec = PC.ObjectSpec(
        obj=ds,
        skip=True,
        selectSet=[PC.TraversalSpec(name="vms", type=vim.Datastore, path="vm", skip=False)],
    )
    found = await session.call(
        lambda: vmomi.retrieve(
            content, objects=[spec], props=[(vim.VirtualMachine, list(facts.VM_PATHS))]
        ),
        subject=f"datastore {where.datastore}",
        action="list VMs using",
    )
    return [facts.parse_vm(f.moid, f.props) for f in found if not vmomi.is_gone(f)]


async def list_files(
    session: Session, *, where: Location, prefix: str, pattern: str = "*.iso"
) -> list[DatastoreFile]:
    """Files matching `pattern` under `prefix` (recursively); [] when the prefix is absent."""
    _, _, browser = await _refs(session, where)
    spec = vim.host.DatastoreBrowser.SearchSpec(
        matchPattern=[pattern],
        details=vim.host.DatastoreBrowser.FileInfo.Details(
            fileType=True, fileSize=True, modification=True
        ),
    )
    root = where.path(prefix)
    try:
        results = await tasks.run_task(
            session,
            lambda: browser.SearchDatastoreSubFolders_Task(datastorePath=root, searchSpec=spec),
            subject=root,
            action="list files in",
        )
    except errors.NotFound:
        return []
    out: list[DatastoreFile] = []
    head = f"[{where.datastore}]"
    for folder in results or []:
        base = str(folder.folderPath or "")
        base = base[len(head) :].strip() if base.startswith(head) else base
        for info in folder.file or []:
            name = str(info.path)
            if not fnmatch.fnmatch(name, pattern) or isinstance(
                info, vim.host.DatastoreBrowser.FolderInfo
            ):
                continue
            rel = f"{base.rstrip('/')}/{name}" if base else name
            out.append(
                DatastoreFile(
                    path=rel.lstrip("/"),
                    size=int(info.fileSize) if info.fileSize is not None else None,
                    modified=info.modification,
                )
            )
    return sorted(out, key=lambda f: f.path)


def _url(where: Location, path: str) -> tuple[str, dict[str, str]]:
    return (
        "/folder/" + quote(path.strip("/")),
        {"dcPath": where.datacenter, "dsName": where.datastore},
    )


async def exists(session: Session, *, where: Location, path: str) -> bool:
    """One HTTP HEAD on the file service: 200 yes, 404 no, anything else an error.

    The datastore is resolved first (cached), so an unknown datastore is `NotFound`
    rather than a file that merely does not exist.
    """
    await _refs(session, where)
    url, params = _url(where, path)
    for attempt in range(2):
        generation = session.generation
        await session.throttle()
        try:
            async with session.http().head(
                url, params=params, headers={"Cookie": session.soap_cookie()}, allow_redirects=False
            ) as resp:
                status = resp.status
        except aiohttp.ClientError as exc:
            raise errors.TransientError(
                f"check {where.path(path)} failed: {type(exc).__name__}", subject=where.path(path)
            ) from None
        if status == 200:
            return True
        if status == 404 and (attempt > 0 or not await _was_expired(session, generation)):
            return False
        if status == 401 and attempt == 0:
            await session.relogin(seen=generation)
            continue
        if status == 404:
            continue  # the session had expired: ask again with the new one
        raise _status_error(status, f"check {where.path(path)}")
    raise AssertionError("unreachable")  # pragma: no cover


async def upload(
    session: Session,
    *,
    where: Location,
    path: str,
    body: AsyncIterable[bytes],
    size: int | None = None,
) -> None:
    """Stream `body` into the file (created or replaced) with a chunked HTTP PUT."""
    url, params = _url(where, path)
    generation = session.generation
    headers = {"Cookie": session.soap_cookie(), "Content-Type": "application/octet-stream"}
    if size is not None:
        headers["Content-Length"] = str(size)
    await session.throttle()
    try:
        async with session.http().put(url, params=params, data=body, headers=headers) as resp:
            status = resp.status
            await resp.read()
    except aiohttp.ClientError as exc:
        raise UploadAborted(
            f"upload to {where.path(path)} failed: {type(exc).__name__}", subject=where.path(path)
        ) from None
    finally:
        session.touch()
    if status == 401 or (status == 404 and await _was_expired(session, generation)):
        await session.relogin(seen=generation)
        raise errors.SessionExpired(
            f"upload to {where.path(path)} was refused: the session expired",
            subject=where.path(path),
        )
    if status not in (200, 201, 204):
        raise _status_error(status, f"upload to {where.path(path)}")


async def _was_expired(session: Session, generation: int) -> bool:
    """Was a 404 really an expired session? Some file services answer 404, not 401, to
    a dead cookie; a cheap SOAP call tells (and logs in again if so). A 404 is trusted
    as "not there" only when the session was valid."""
    await session.ping()
    return session.generation != generation


def _status_error(status: int, what: str) -> errors.VsphereError:
    if status in (401, 403):
        return errors.PermissionDenied(f"{what}: HTTP {status}", subject=what)
    if status == 404:
        return errors.NotFound(f"{what}: HTTP 404 (datacenter or datastore unknown)", subject=what)
    if status in (429, 500, 502, 503, 504):
        return errors.TransientError(f"{what}: HTTP {status}", subject=what)
    return errors.VsphereError(f"{what}: HTTP {status}", subject=what)


__all__ = [
    "FILE_NOT_FOUND",
    "DatastoreFile",
    "Location",
    "UploadAborted",
    "delete",
    "exists",
    "list_files",
    "mkdir",
    "move",
    "upload",
    "vms_using",
]
