"""How the ISO pipeline reaches an image service: trust, proxy, redirects.

Promises (the download side of `iso`; vCenter connections never come here):

* **Trust.** TLS to the image service is verified against the system store plus an
  optional extra CA bundle (`CaBundle`, on OpenShift the cluster's trusted CAs,
  the proxy's included, injected into a ConfigMap). A bundle holding no usable
  certificate is an error naming where it came from, never a silent fallback.
  A certificate that does not verify raises `IsoSourceUntrusted`.
* **Proxy.** `Proxies` reads `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (upper case
  first, then lower case) with the semantics of Go's `golang.org/x/net/http/httpproxy`,
  which OpenShift's cluster-wide proxy settings are written for: an https URL uses
  `HTTPS_PROXY` only, an http URL `HTTP_PROXY` only; `localhost` and loopback
  addresses never use a proxy; `NO_PROXY` is a comma-separated list of `*` (no proxy
  at all), IP addresses, CIDR ranges (`10.0.0.0/8`, `fd00::/8`, matched against IP
  literals only: no name is resolved to decide), and domain names, each with an
  optional `:port`: `example.com` matches it and every subdomain, `.example.com` and
  `*.example.com` only subdomains. A proxy URL without a scheme is `http://`; user
  info in it becomes a `Proxy-Authorization` header and is never shown.
  aiohttp's own `trust_env` is not used: it reads `NO_PROXY` through `urllib`,
  which knows no CIDR ranges, so an OpenShift cluster's `noProxy` (which lists the
  machine, pod and service networks as CIDRs) would not be honoured.
* **Redirects** are followed by hand, at most `HttpLimits.max_redirects` hops, and
  only to `https` URLs: an https image service is never downgraded to http (or any
  other scheme) by a redirect, an http one may move to https. A refused redirect
  raises `IsoRedirectRefused` naming both URLs in their shown form. The proxy is
  chosen again for every hop (the host may change).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from yarl import URL

from agentforge.redaction import redact_url
from agentforge.vsphere.model import errors

__all__ = [
    "REDIRECT_STATUSES",
    "CaBundle",
    "CaBundleFile",
    "Proxies",
    "client",
    "get",
    "request",
    "ssl_context",
]


class HttpSource(Protocol):
    """What this module reads of an ISO source (`vsphere.iso.IsoSource`): a Protocol, so
    that `iso` may build on this module without this module importing `iso`."""

    @property
    def url(self) -> str: ...
    @property
    def ca_bundle(self) -> CaBundle | None: ...
    @property
    def proxies(self) -> Proxies: ...
    @property
    def insecure(self) -> bool: ...


class HttpLimits(Protocol):
    """What this module reads of the transfer limits (`model.iso.IsoLimits`)."""

    @property
    def max_redirects(self) -> int: ...
    @property
    def connect_timeout_seconds(self) -> float: ...
    @property
    def read_timeout_seconds(self) -> float: ...


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_ENV = {
    "https": ("HTTPS_PROXY", "https_proxy"),
    "http": ("HTTP_PROXY", "http_proxy"),
    "no": ("NO_PROXY", "no_proxy"),
}
_DEFAULT_PORTS = {"http": 80, "https": 443}


# --- trust -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CaBundle:
    """PEM certificates trusted for image services in addition to the system store."""

    pem: str
    origin: str
    """Where it came from, for messages (`/etc/agent-forge/trusted-ca/ca-bundle.crt`)."""


class CaBundleFile:
    """A PEM file (a mounted ConfigMap key) read again whenever it changes.

    The kubelet updates a mounted ConfigMap by swapping a symlink, so a change shows
    in the file's identity, size or modification time; an unchanged file is not read
    again. A missing or empty file means no extra CAs (the ConfigMap is optional and
    is filled by OpenShift's CA injection after it is created)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._stamp: tuple[int, int, int] | None = None
        self._bundle: CaBundle | None = None

    def current(self) -> CaBundle | None:
        """The bundle as the file holds it now; `IsoSourceError` when it cannot be read."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._bundle = None, None
            return None
        except OSError as exc:
            raise self._unreadable(exc) from None
        stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="ascii", errors="replace") as handle:
                    pem = handle.read()
            except OSError as exc:
                raise self._unreadable(exc) from None
            self._bundle = CaBundle(pem=pem, origin=self.path) if pem.strip() else None
            self._stamp = stamp
        return self._bundle

    def _unreadable(self, exc: OSError) -> errors.IsoSourceError:
        return errors.IsoSourceError(
            f"the CA bundle {self.path} cannot be read ({exc.strerror or type(exc).__name__})",
            subject=self.path,
        )


def ssl_context(ca_bundle: CaBundle | None, *, insecure: bool = False) -> ssl.SSLContext | bool:
    """The system store plus `ca_bundle`; False (no verification) only when `insecure`."""
    if insecure:
        return False
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_bundle is not None and ca_bundle.pem.strip():
        try:
            context.load_verify_locations(cadata=ca_bundle.pem)
        except (ssl.SSLError, ValueError) as exc:
            raise errors.IsoSourceError(
                f"the CA bundle {ca_bundle.origin} holds no usable PEM certificate "
                f"({exc.__class__.__name__})",
                subject=ca_bundle.origin,
            ) from None
    return context


# --- proxy -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Proxy:
    url: str
    """Without user info."""
    headers: Mapping[str, str]
    """`Proxy-Authorization` when the variable carried user info."""


@dataclass(frozen=True, slots=True)
class Proxies:
    """The proxy settings of the environment (see the module doc)."""

    https: str | None = None
    http: str | None = None
    no_proxy: str = ""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Proxies:
        """Read the variables; raises ValueError naming one that is not a proxy URL."""
        env = os.environ if environ is None else environ

        def first(names: tuple[str, ...]) -> tuple[str, str | None]:
            for name in names:
                value = env.get(name, "").strip()
                if value:
                    return name, value
            return names[0], None

        found = cls(
            https=first(_ENV["https"])[1],
            http=first(_ENV["http"])[1],
            no_proxy=first(_ENV["no"])[1] or "",
        )
        for scheme in ("https", "http"):
            name, value = first(_ENV[scheme])
            if value is not None:
                _parse_proxy(value, variable=name)
        return found

    @property
    def configured(self) -> bool:
        return bool(self.https or self.http)

    def describe(self) -> str:
        """The settings in their shown form (no proxy password), for the start-up log."""
        if not self.configured:
            return "no proxy"
        parts = [
            f"{scheme} via {redact_url(_parse_proxy(value, variable=scheme).url)}"
            for scheme, value in (("https", self.https), ("http", self.http))
            if value
        ]
        return "; ".join(parts) + f"; NO_PROXY={self.no_proxy or '(empty)'}"

    def for_url(self, url: str | URL) -> _Proxy | None:
        """The proxy for `url`, or None to connect directly."""
        target = URL(url) if isinstance(url, str) else url
        scheme = (target.scheme or "").lower()
        value = self.https if scheme == "https" else self.http if scheme == "http" else None
        if not value or not target.host:
            return None
        if not _use_proxy(target, self.no_proxy):
            return None
        return _parse_proxy(value, variable=_ENV[scheme][0])


def _parse_proxy(value: str, *, variable: str) -> _Proxy:
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = URL(text)
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"{variable} is not a proxy URL (http://host:port or https://host:port): "
            f"{redact_url(value)}"
        )
    headers: dict[str, str] = {}
    if parsed.user is not None:
        headers["Proxy-Authorization"] = aiohttp.encode_basic_auth(
            parsed.user, parsed.password or ""
        )
        parsed = parsed.with_user(None)
    return _Proxy(url=str(parsed), headers=headers)


def _use_proxy(target: URL, no_proxy: str) -> bool:
    """Go's `httpproxy.config.useProxy`: False when `target` bypasses the proxy."""
    host = (target.host or "").lower().rstrip(".")
    port = str(target.port or _DEFAULT_PORTS.get(target.scheme or "") or "")
    if host == "localhost":
        return False
    ip = _ip(host)
    if ip is not None and ip.is_loopback:
        return False
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return False
        if _matches(entry, host=host, port=port, ip=ip):
            return False
    return True


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _matches(
    entry: str,
    *,
    host: str,
    port: str,
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
) -> bool:
    """One NO_PROXY entry against the target's host, port and IP (if it is a literal)."""
    if "/" in entry:
        try:
            network = ipaddress.ip_network(entry.strip("[]"), strict=False)
        except ValueError:
            return False
        return ip is not None and ip.version == network.version and ip in network
    entry_host, entry_port = _split_host_port(entry)
    if not entry_host:
        return False
    if entry_port and entry_port != port:
        return False
    entry_ip = _ip(entry_host)
    if entry_ip is not None:
        return ip is not None and ip == entry_ip
    if entry_host.startswith("*."):
        entry_host = entry_host[1:]
    if entry_host.startswith("."):
        return host.endswith(entry_host)
    return host == entry_host or host.endswith("." + entry_host)


def _split_host_port(entry: str) -> tuple[str, str]:
    """`host:port`, `[v6]:port`, a bare IPv6 address or a bare host."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest.removeprefix(":") if rest.startswith(":") else ""
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host.rstrip("."), port if port.isdigit() else ""
    return entry.rstrip("."), ""


# --- requests --------------------------------------------------------------------------


def client(source: HttpSource, limits: HttpLimits) -> aiohttp.ClientSession:
    """An aiohttp session for one download: verified TLS, bounded waits, no env proxy."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            ssl=ssl_context(source.ca_bundle, insecure=source.insecure), limit=4
        ),
        timeout=aiohttp.ClientTimeout(
            total=None,
            sock_connect=limits.connect_timeout_seconds,
            sock_read=limits.read_timeout_seconds,
        ),
        auto_decompress=False,
        trust_env=False,
    )


def get(
    session: aiohttp.ClientSession,
    source: HttpSource,
    *,
    headers: Mapping[str, str],
    limits: HttpLimits,
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """`request` with GET."""
    return request(session, source, method="GET", headers=headers, limits=limits)


@contextlib.asynccontextmanager
async def request(
    session: aiohttp.ClientSession,
    source: HttpSource,
    *,
    method: str,
    headers: Mapping[str, str],
    limits: HttpLimits,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """`method` on `source.url` through its proxy, following at most
    `limits.max_redirects` redirects, each only to https; yields the final response
    (released on exit).

    `aiohttp.ClientConnectorCertificateError` becomes `IsoSourceUntrusted`; other
    client errors propagate for the caller to classify."""
    url = URL(source.url, encoded=True)
    for hop in range(limits.max_redirects + 1):
        proxy = source.proxies.for_url(url)
        try:
            resp = await session.request(
                method,
                url,
                headers=dict(headers),
                allow_redirects=False,
                auto_decompress=False,
                proxy=proxy.url if proxy else None,
                proxy_headers=dict(proxy.headers) if proxy and proxy.headers else None,
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            raise _untrusted(url, exc, source) from None
        if resp.status not in REDIRECT_STATUSES:
            try:
                yield resp
            finally:
                resp.release()
            return
        location = resp.headers.get("Location", "")
        resp.release()
        url = _next_hop(url, location, status=resp.status, hop=hop, limits=limits)
    raise AssertionError("unreachable: the last hop raises")  # pragma: no cover


def _next_hop(url: URL, location: str, *, status: int, hop: int, limits: HttpLimits) -> URL:
    shown = redact_url(str(url))
    if not location:
        raise errors.IsoSourceError(
            f"the ISO source {shown} answered HTTP {status} without a Location", subject=shown
        )
    try:
        target = url.join(URL(location, encoded=True))
    except ValueError:
        target = None
    if target is None or (target.scheme or "").lower() != "https" or not target.host:
        where = redact_url(location) if target is None else redact_url(str(target))
        raise errors.IsoRedirectRefused(
            f"the ISO source {shown} redirects (HTTP {status}) to {where}: only redirects to "
            "https are followed, so the image is never fetched unencrypted",
            subject=shown,
        )
    if hop >= limits.max_redirects:
        raise errors.IsoRedirectRefused(
            f"the ISO source {shown} redirects again (HTTP {status}) after "
            f"{limits.max_redirects} redirects; at most {limits.max_redirects} are followed",
            subject=shown,
        )
    return target


def _untrusted(
    url: URL, exc: aiohttp.ClientConnectorCertificateError, source: HttpSource
) -> errors.IsoSourceUntrusted:
    shown = redact_url(str(url))
    reason = getattr(exc.certificate_error, "verify_message", "") or type(exc).__name__
    extra = f" and {source.ca_bundle.origin}" if source.ca_bundle else ""
    return errors.IsoSourceUntrusted(
        f"the certificate of the ISO source {shown} is not trusted ({reason}); it was "
        f"verified against the system trust store{extra}",
        subject=shown,
    )
