"""The Assisted Installer image service: one generated discovery ISO per InfraEnv.

An aiohttp server on loopback answers `GET /images/<namespace>/<infraenv>/<tag>.iso`
with the InfraEnv's current image, and, as assisted-image-service does, the URL
forms that carry its key (`url(..., auth=...)`): `byapikey` puts a signed JWT in the
path (`/byapikey/<JWT>/<version>/<arch>/<tag>.iso`), `query` puts it in the query
(`/images/<image id>?api_key=<JWT>&arch=...&type=...&version=...`); a missing or
wrong key answers 401. What it promises, because the operator's ISO cache is built
on it:

- Images are deterministic, bootable ISO 9660 images (`iso9660`: El Torito boot
  record, a data file of pseudo-random bytes seeded by namespace, InfraEnv and
  version), of the size the server was made with: the same InfraEnv
  and version always hash the same, different ones never do, so the sha256 in a
  CD-ROM's content-addressed file name tells the Assisted Installer which InfraEnv
  a VM boots.
- Strong `ETag` (from the sha256), `Last-Modified` (when the version was made),
  `Content-Length`; `If-None-Match` / `If-Modified-Since` answer 304 with no body.
  A new version never looks unchanged: its ETag is new, and its Last-Modified is
  later than the previous version's even when both were made within one second
  (HTTP dates have a resolution of one second), so `If-Modified-Since` alone sees it.
- Tests can change an image (`change`), make an InfraEnv's URLs answer an error
  (`fail`/`heal`), make one URL answer a redirect (`redirect`), answer 200 with
  something that is no image (`answer_instead`: an HTML login page, a JSON error), and
  read what was served (`stats`: requests, full downloads, 304s, errors and body bytes).
- Given an `ssl_context` it serves HTTPS (`base_url` says `https://`), e.g. with a
  certificate of a private CA (`sim.controlplane.pki.new_ca`), as an image service
  behind an internal CA does.

The tag in the URL is free: any tag serves the current image (a new URL for a new
version is the InfraEnv stand-in's choice, as the real image service makes one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import ssl
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime
from types import TracebackType
from typing import Literal, Self

from aiohttp import web

from sim.actors.iso9660 import build_iso

__all__ = ["DEFAULT_ISO_SIZE", "IsoImage", "IsoServer", "IsoStats", "UrlAuth", "discovery_iso"]

UrlAuth = Literal["none", "byapikey", "query"]
"""Where an image URL carries the key: nowhere, in the path, in the query."""

DEFAULT_ISO_SIZE = 1024 * 1024


def discovery_iso(seed: str, size: int = DEFAULT_ISO_SIZE) -> bytes:
    """A deterministic, bootable ISO 9660 image (El Torito) of `size` bytes (`iso9660`)."""
    volume_id = ("RHCOS_" + hashlib.sha256(seed.encode()).hexdigest()[:20]).upper()
    banner = f"agent-forge simulated discovery image {seed}\n".encode()
    return build_iso(volume_id=volume_id, size=size, payload=banner, seed=seed)


@dataclass(frozen=True, slots=True)
class IsoImage:
    """One version of an InfraEnv's discovery image."""

    namespace: str
    infraenv: str
    version: int
    data: bytes = field(repr=False)
    sha256: str
    last_modified: datetime

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def etag(self) -> str:
        return f'"{self.sha256[:32]}"'

    @property
    def file_name(self) -> str:
        """The content-addressed name the operator gives it on the datastore."""
        return f"{self.sha256}.iso"


@dataclass(slots=True)
class IsoStats:
    """What one InfraEnv's URLs (or all of them) answered."""

    requests: int = 0
    downloads: int = 0
    """200 answers to GET, each with the whole image as body."""
    not_modified: int = 0
    errors: int = 0
    bytes_served: int = 0

    def add(self, other: IsoStats) -> None:
        self.requests += other.requests
        self.downloads += other.downloads
        self.not_modified += other.not_modified
        self.errors += other.errors
        self.bytes_served += other.bytes_served


Key = tuple[str, str]


class IsoServer:
    """The image service; `async with IsoServer() as server:` or `start()`/`stop()`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        size: int = DEFAULT_ISO_SIZE,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.size = size
        self.ssl_context = ssl_context
        self._redirects: dict[tuple[str, str, str], tuple[int, str]] = {}
        self._images: dict[Key, IsoImage] = {}
        self._history: dict[str, IsoImage] = {}
        self._failing: dict[Key, int] = {}
        self._instead: dict[Key, tuple[bytes, str]] = {}
        self._stats: dict[Key, IsoStats] = {}
        self._signing_key = secrets.token_bytes(32)
        self._by_id: dict[str, Key] = {}
        self._runner: web.AppRunner | None = None
        self._port = 0

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_get("/images/{namespace}/{infraenv}/{tag}.iso", self._serve_open)
        app.router.add_get("/byapikey/{token}/{version}/{arch}/{tag}.iso", self._serve_byapikey)
        app.router.add_get("/images/{image_id}", self._serve_query)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=self.ssl_context)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if not self._port:
            raise RuntimeError("the ISO server is not started")
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self._port}"

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("the ISO server is not started")
        return self._port

    # --- images --------------------------------------------------------------------------

    def url(
        self,
        namespace: str,
        infraenv: str,
        *,
        tag: str = "discovery",
        auth: UrlAuth = "none",
        token: str | None = None,
    ) -> str:
        """The image's URL; with `auth` it carries `token` (default: a fresh valid one)."""
        if auth == "none":
            return f"{self.base_url}/images/{namespace}/{infraenv}/{tag}.iso"
        token = token or self.token(namespace, infraenv)
        if auth == "byapikey":
            return f"{self.base_url}/byapikey/{token}/4.14/x86_64/{tag}.iso"
        image_id = self.image_id(namespace, infraenv)
        return (
            f"{self.base_url}/images/{image_id}?api_key={token}&arch=x86_64&type={tag}&version=4.14"
        )

    def image_id(self, namespace: str, infraenv: str) -> str:
        """The InfraEnv's id in URLs (stable, as assisted-service's UUID is)."""
        image_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{infraenv}"))
        self._by_id[image_id] = (namespace, infraenv)
        return image_id

    def token(self, namespace: str, infraenv: str) -> str:
        """A new signed JWT (HS256) for the InfraEnv's images; each call gives another."""
        claims = {"infra_env_id": self.image_id(namespace, infraenv), "jti": secrets.token_hex(8)}
        header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = _b64url(json.dumps(claims).encode())
        signature = hmac.new(self._signing_key, f"{header}.{payload}".encode(), "sha256")
        return f"{header}.{payload}.{_b64url(signature.digest())}"

    def _verified(self, token: str) -> Key | None:
        header, _, rest = token.partition(".")
        payload, _, signature = rest.partition(".")
        expected = hmac.new(self._signing_key, f"{header}.{payload}".encode(), "sha256")
        if not hmac.compare_digest(_b64url(expected.digest()), signature):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        return self._by_id.get(str(claims.get("infra_env_id")))

    def publish(self, namespace: str, infraenv: str) -> IsoImage:
        """The InfraEnv's image, made (version 1) if it has none yet."""
        return self._images.get((namespace, infraenv)) or self._make(namespace, infraenv, 1)

    def change(self, namespace: str, infraenv: str) -> IsoImage:
        """A new version with new content (as when the InfraEnv's spec changes)."""
        current = self._images.get((namespace, infraenv))
        return self._make(namespace, infraenv, (current.version + 1) if current else 1)

    def image(self, namespace: str, infraenv: str) -> IsoImage | None:
        return self._images.get((namespace, infraenv))

    def by_sha256(self, sha256: str) -> IsoImage | None:
        """Any version ever served with this digest (current or not)."""
        return self._history.get(sha256)

    def current(self) -> dict[str, IsoImage]:
        """sha256 -> image, for every InfraEnv's current version."""
        return {image.sha256: image for image in self._images.values()}

    def fail(self, namespace: str, infraenv: str, *, status: int = 404) -> None:
        """Every URL of the InfraEnv answers `status` until `heal`."""
        self._failing[(namespace, infraenv)] = status

    def heal(self, namespace: str, infraenv: str) -> None:
        self._failing.pop((namespace, infraenv), None)
        self._instead.pop((namespace, infraenv), None)
        for key in [k for k in self._redirects if k[:2] == (namespace, infraenv)]:
            del self._redirects[key]

    def redirect(
        self, namespace: str, infraenv: str, *, tag: str, to: str, status: int = 302
    ) -> None:
        """`url(namespace, infraenv, tag=tag)` answers `status` with `Location: to`
        until `heal` (other tags serve the image as before)."""
        self._redirects[(namespace, infraenv, tag)] = (status, to)

    def answer_instead(
        self, namespace: str, infraenv: str, body: bytes, *, content_type: str = "text/html"
    ) -> None:
        """Every URL of the InfraEnv answers 200 with `body` (an expired link's login
        page, a proxy's error page...) instead of the image, until `heal`."""
        self._instead[(namespace, infraenv)] = (body, content_type)

    def stats(self, namespace: str | None = None, infraenv: str | None = None) -> IsoStats:
        total = IsoStats()
        for (ns, name), stats in self._stats.items():
            if namespace in (None, ns) and infraenv in (None, name):
                total.add(stats)
        return total

    def _make(self, namespace: str, infraenv: str, version: int) -> IsoImage:
        data = discovery_iso(f"{namespace}/{infraenv}/v{version}", self.size)
        made = datetime.now(UTC).replace(microsecond=0)
        previous = self._images.get((namespace, infraenv))
        if previous is not None and made <= previous.last_modified:
            made = previous.last_modified + timedelta(seconds=1)
        image = IsoImage(
            namespace=namespace,
            infraenv=infraenv,
            version=version,
            data=data,
            sha256=hashlib.sha256(data).hexdigest(),
            last_modified=made,
        )
        self._images[(namespace, infraenv)] = image
        self._history[image.sha256] = image
        return image

    # --- HTTP ----------------------------------------------------------------------------

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "images": len(self._images)})

    async def _serve_open(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        redirect = self._redirects.get((info["namespace"], info["infraenv"], info["tag"]))
        if redirect is not None:
            stats = self._stats.setdefault((info["namespace"], info["infraenv"]), IsoStats())
            stats.requests += 1
            return web.Response(status=redirect[0], headers={"Location": redirect[1]})
        return await self._serve(
            request, (request.match_info["namespace"], request.match_info["infraenv"])
        )

    async def _serve_byapikey(self, request: web.Request) -> web.StreamResponse:
        key = self._verified(request.match_info["token"])
        if key is None:
            return web.Response(status=401, text="invalid or missing API key\n")
        return await self._serve(request, key)

    async def _serve_query(self, request: web.Request) -> web.StreamResponse:
        key = self._verified(request.query.get("api_key", ""))
        if key is None or key != self._by_id.get(request.match_info["image_id"]):
            return web.Response(status=401, text="invalid or missing API key\n")
        return await self._serve(request, key)

    async def _serve(self, request: web.Request, key: Key) -> web.StreamResponse:
        stats = self._stats.setdefault(key, IsoStats())
        stats.requests += 1
        image = self._images.get(key)
        failing = self._failing.get(key)
        if failing is not None or image is None:
            stats.errors += 1
            status = failing or 404
            return web.Response(status=status, text=f"no discovery image for {key[0]}/{key[1]}\n")
        instead = self._instead.get(key)
        if instead is not None:
            stats.bytes_served += len(instead[0])
            return web.Response(body=instead[0], headers={"Content-Type": instead[1]})
        headers = {
            "ETag": image.etag,
            "Last-Modified": format_datetime(image.last_modified, usegmt=True),
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "none",
        }
        if _not_modified(request, image):
            stats.not_modified += 1
            return web.Response(status=304, headers=headers)
        if request.method == "HEAD":  # aiohttp sends the headers of this body, not the body
            return web.Response(body=image.data, headers=headers)
        stats.downloads += 1
        stats.bytes_served += image.size
        return web.Response(body=image.data, headers=headers)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _not_modified(request: web.Request, image: IsoImage) -> bool:
    """RFC 9110 13.2.2: If-None-Match decides when present, else If-Modified-Since."""
    if_none_match = request.headers.get("If-None-Match")
    if if_none_match is not None:
        tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
        return "*" in tags or image.etag in tags
    if_modified_since = request.headers.get("If-Modified-Since")
    if if_modified_since:
        try:
            since = parsedate_to_datetime(if_modified_since)
        except (TypeError, ValueError):
            return False
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        return image.last_modified <= since
    return False
