"""Datastore files: mkdir -p, exists, list under a prefix, delete (idempotent; "was not
there" only when vCenter says FileNotFound)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from agentforge.vsphere import Location, NotFound, TransientError, VsphereService
from agentforge.vsphere.iso import datastore_files as datastore
from sim.vcsim import VcsimControl

pytestmark = pytest.mark.vcsim

ISO_DS = Location(datacenter="dc1", datastore="iso-ds")


async def _put(service: VsphereService, path: str, data: bytes) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield data

    await datastore.upload(await service.session(), where=ISO_DS, path=path, body=body())


async def test_mkdir_creates_parents_and_tolerates_existing(service: VsphereService) -> None:
    base = f"af-tests/{uuid.uuid4().hex[:8]}"
    await service.make_directory(where=ISO_DS, path=f"{base}/a/b/c")
    await _put(service, f"{base}/a/b/c/one.iso", b"1")
    # Again, over the existing tree: no error, and what the directory holds stays.
    await service.make_directory(where=ISO_DS, path=f"{base}/a/b/c")
    files = await service.list_files(where=ISO_DS, prefix=base)
    assert [(f.path, f.size) for f in files] == [(f"{base}/a/b/c/one.iso", 1)]


async def test_exists_list_and_delete(service: VsphereService) -> None:
    base = f"af-tests/{uuid.uuid4().hex[:8]}"
    await service.make_directory(where=ISO_DS, path=f"{base}/x")
    await _put(service, f"{base}/one.iso", b"1")
    await _put(service, f"{base}/x/two.iso", b"22")
    await _put(service, f"{base}/notes.txt", b"333")
    assert await service.file_exists(where=ISO_DS, path=f"{base}/one.iso")
    assert not await service.file_exists(where=ISO_DS, path=f"{base}/nope.iso")
    files = await service.list_files(where=ISO_DS, prefix=base)
    assert [(f.path, f.size) for f in files] == [(f"{base}/one.iso", 1), (f"{base}/x/two.iso", 2)]
    assert await service.delete_file(where=ISO_DS, path=f"{base}/one.iso") is True
    assert await service.delete_file(where=ISO_DS, path=f"{base}/one.iso") is False
    assert await service.list_files(where=ISO_DS, prefix=f"{base}/missing") == []


async def test_an_unknown_datastore_is_not_found(service: VsphereService) -> None:
    with pytest.raises(NotFound, match="no-such-ds"):
        await service.file_exists(where=Location("dc1", "no-such-ds"), path="x.iso")


async def test_only_file_not_found_means_not_there_another_not_found_is_checked(
    service: VsphereService, vcsim_control: VcsimControl
) -> None:
    base = f"af-tests/{uuid.uuid4().hex[:8]}"
    path = f"{base}/one.iso"
    await service.make_directory(where=ISO_DS, path=base)
    await _put(service, path, b"1")
    # A delete task ending in a NotFound that is not about the file (here: an object of
    # the call; alike a task vCenter forgot) deleted nothing: not "was not there".
    await vcsim_control.fail_next_tasks("DeleteDatastoreFile_Task", 1, "ManagedObjectNotFound")
    with pytest.raises(TransientError, match="still there"):
        await service.delete_file(where=ISO_DS, path=path)
    assert await service.file_exists(where=ISO_DS, path=path)
    # vCenter's FileNotFound is believed as it is.
    await vcsim_control.fail_next_tasks("DeleteDatastoreFile_Task", 1, "FileNotFound")
    assert await service.delete_file(where=ISO_DS, path=path) is False
    assert await service.delete_file(where=ISO_DS, path=path) is True
    # The same unknown outcome with the file gone: it is gone, whoever deleted it.
    await vcsim_control.fail_next_tasks("DeleteDatastoreFile_Task", 1, "NotFound")
    assert await service.delete_file(where=ISO_DS, path=path) is True
