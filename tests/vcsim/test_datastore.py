"""Datastore files: mkdir -p, exists, list under a prefix, delete (idempotent)."""

from __future__ import annotations

import uuid

import pytest

from agentforge.vsphere import Location, NotFound, VsphereService, datastore

pytestmark = pytest.mark.vcsim

ISO_DS = Location(datacenter="dc1", datastore="iso-ds")


async def _put(service: VsphereService, path: str, data: bytes) -> None:
    async def body():  # type: ignore[no-untyped-def]
        yield data

    await datastore.upload(await service.session(), where=ISO_DS, path=path, body=body())


async def test_mkdir_creates_parents_and_tolerates_existing(service: VsphereService) -> None:
    base = f"af-tests/{uuid.uuid4().hex[:8]}"
    await service.make_directory(where=ISO_DS, path=f"{base}/a/b/c")
    await service.make_directory(where=ISO_DS, path=f"{base}/a/b/c")


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
