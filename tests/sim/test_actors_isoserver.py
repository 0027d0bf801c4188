"""The simulated image service: deterministic ISOs, validators, conditional GET, faults."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from email.utils import format_datetime

import aiohttp
import pytest
from multidict import CIMultiDict

from sim.actors.isoserver import IsoServer, discovery_iso
from sim.actors.vcenter import iso_sha256

SIZE = 64 * 1024


@pytest.fixture
async def server() -> AsyncIterator[IsoServer]:
    async with IsoServer(size=SIZE) as iso_server:
        yield iso_server


async def fetch(url: str, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


def test_discovery_iso_is_deterministic_and_looks_like_iso9660() -> None:
    first = discovery_iso("ns/env/v1", SIZE)
    assert first == discovery_iso("ns/env/v1", SIZE)
    assert first != discovery_iso("ns/env/v2", SIZE)
    assert len(first) == SIZE
    assert first[0x8001:0x8006] == b"CD001"  # primary volume descriptor
    assert first[0x8801:0x8806] == b"CD001"  # set terminator


async def test_get_serves_the_image_with_strong_validators(server: IsoServer) -> None:
    image = server.publish("ns", "env")
    status, headers, body = await fetch(server.url("ns", "env"))
    assert status == 200
    assert hashlib.sha256(body).hexdigest() == image.sha256
    assert headers["ETag"] == image.etag
    assert not headers["ETag"].startswith("W/")
    assert headers["Content-Length"] == str(SIZE)
    assert headers["Last-Modified"] == format_datetime(image.last_modified, usegmt=True)
    assert server.stats("ns", "env").bytes_served == SIZE


async def test_conditional_get_answers_304_without_a_body(server: IsoServer) -> None:
    image = server.publish("ns", "env")
    by_etag = await fetch(server.url("ns", "env"), **{"If-None-Match": image.etag})
    by_date = await fetch(
        server.url("ns", "env"),
        **{"If-Modified-Since": format_datetime(image.last_modified, usegmt=True)},
    )
    assert (by_etag[0], by_etag[2]) == (304, b"")
    assert (by_date[0], by_date[2]) == (304, b"")
    stats = server.stats("ns", "env")
    assert (stats.not_modified, stats.downloads, stats.bytes_served) == (2, 0, 0)


async def test_changed_content_gets_a_new_etag_and_is_downloaded_again(server: IsoServer) -> None:
    old = server.publish("ns", "env")
    new = server.change("ns", "env")
    assert (new.version, new.sha256 != old.sha256, new.etag != old.etag) == (2, True, True)
    status, _, body = await fetch(server.url("ns", "env"), **{"If-None-Match": old.etag})
    assert status == 200
    assert hashlib.sha256(body).hexdigest() == new.sha256
    assert server.by_sha256(old.sha256) == old  # history keeps old versions
    assert set(server.current()) == {new.sha256}


async def test_a_change_within_the_same_second_is_seen_by_any_validator(
    server: IsoServer,
) -> None:
    # HTTP dates have one-second resolution: v2 made within v1's second must still carry
    # a later Last-Modified, or a client revalidating by date alone keeps v1.
    images = [server.publish("ns", "env"), server.change("ns", "env"), server.change("ns", "env")]
    stamps = [image.last_modified for image in images]
    assert stamps == sorted(set(stamps))
    assert len({image.etag for image in images}) == 3
    old, new = images[0], images[-1]
    for headers in (
        {"If-None-Match": old.etag},
        {"If-Modified-Since": format_datetime(old.last_modified, usegmt=True)},
    ):
        status, got, body = await fetch(server.url("ns", "env"), **headers)
        assert status == 200, headers
        assert hashlib.sha256(body).hexdigest() == new.sha256
        assert got["ETag"] == new.etag


async def test_any_tag_serves_the_current_image(server: IsoServer) -> None:
    image = server.publish("ns", "env")
    _, _, body = await fetch(server.url("ns", "env", tag="discovery-v7"))
    assert hashlib.sha256(body).hexdigest() == image.sha256


async def test_a_failing_infraenv_answers_its_status_until_healed(server: IsoServer) -> None:
    server.publish("ns", "env")
    server.fail("ns", "env", status=404)
    assert (await fetch(server.url("ns", "env")))[0] == 404
    server.heal("ns", "env")
    assert (await fetch(server.url("ns", "env")))[0] == 200
    assert server.stats("ns", "env").errors == 1


async def test_unknown_infraenv_is_404(server: IsoServer) -> None:
    assert (await fetch(server.url("ns", "missing")))[0] == 404


async def test_urls_carrying_a_key_in_path_or_query_serve_the_image(server: IsoServer) -> None:
    image = server.publish("ns", "env")
    by_path = server.url("ns", "env", auth="byapikey")
    by_query = server.url("ns", "env", auth="query")
    token = by_path.split("/byapikey/")[1].split("/")[0]
    assert token.startswith("eyJ"), "a JWT, as the real service's"
    assert token.count(".") == 2
    assert by_path.endswith("/4.14/x86_64/discovery.iso")
    assert "?api_key=eyJ" in by_query
    assert "&arch=x86_64" in by_query
    for url in (by_path, by_query):
        status, _, body = await fetch(url)
        assert status == 200
        assert hashlib.sha256(body).hexdigest() == image.sha256
    assert server.stats("ns", "env").downloads == 2


async def test_a_wrong_or_missing_key_is_refused(server: IsoServer) -> None:
    server.publish("ns", "env")
    server.publish("ns", "other")
    token = server.token("ns", "env")
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    other = server.url("ns", "other", auth="query", token=token)  # env's key, other's id
    for url in (
        server.url("ns", "env", auth="byapikey", token=forged),
        server.url("ns", "env", auth="query", token=forged),
        other,
        other.split("?")[0],
    ):
        assert (await fetch(url))[0] == 401, url
    server.fail("ns", "env", status=404)
    assert (await fetch(server.url("ns", "env", auth="byapikey")))[0] == 404


def test_content_addressed_names_yield_their_digest() -> None:
    digest = "ab" * 32
    assert iso_sha256(f"[iso-ds] agent-forge/ns/pool/{digest}.iso") == digest
    assert iso_sha256(f"[iso-ds] {digest}.iso") == digest
    assert iso_sha256("[iso-ds] agent-forge/ns/pool/discovery.iso") is None
    assert iso_sha256(f"[iso-ds] x/{digest}.iso.tmp") is None
