"""How the operator proves who it is to a vCenter, and how it checks who the vCenter is.

`Credentials` is the one value a caller hands in: a small frozen dataclass whose
`repr` never shows the password, so it can sit in logs, exceptions and debuggers
without leaking. TLS is verified by default; `insecure=True` is an explicit opt-out,
and a CA bundle (PEM text, e.g. from the credentials Secret) is trusted in addition
to the system store when given.

`SessionKey` says which callers may share one logged-in session: only those holding
the *whole* same credential (vCenter, user, password and TLS settings). The password
and the TLS settings enter the key as an HMAC-SHA256 digest under a random key made
once per process, so the key can be compared, hashed and kept in memory without
holding anything a reader could reverse or try passwords against; `str()` and
`repr()` show the user, the vCenter and an 8-hex-digit prefix of the digest at most.
`AccountKey` (vCenter and user, whatever the password) is what vCenter's SSO lockout
counts failed logins by, spelled as SSO resolves it: the user's account name
case-folded with its domain dropped (`Administrator@vsphere.local`,
`administrator@VSPHERE.LOCAL` and `VSPHERE.LOCAL\\administrator` are one account), and
the vCenter's host case-folded, without a trailing dot, an IP address in its
compressed form, the port always given (`vc.example`, `VC.example.:443` and
`https://vc.example/sdk` are one vCenter). A name and its address are joined by the
login guard once the vCenter has answered (`logins.LoginGuard.admit`: its instance
UUID). Dropping the domain joins same-named users of two identity sources of one
vCenter into one key too: their budgets are shared, which only ever allows fewer
failed logins, never more.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import secrets
import ssl
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

_DIGEST_KEY: Final = secrets.token_bytes(32)
"""The HMAC key of `SessionKey.digest`: random per process, never stored or shown."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A vCenter address and the user that logs in to it.

    `server` is a host name, `host:port`, or a URL (`https://vc.example/sdk`); only the
    host and port are used. The password is excluded from `repr`; it enters the
    session key only as a keyed digest (see `SessionKey`).
    """

    server: str
    username: str
    password: str = field(repr=False)
    insecure: bool = False
    ca_bundle_pem: str | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        return _split(self.server)[0]

    @property
    def port(self) -> int:
        return _split(self.server)[1]

    @property
    def netloc(self) -> str:
        """`host:port` as used in URLs (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def key(self) -> SessionKey:
        """Who may share a session with these credentials: the same whole credential."""
        mac = hmac.new(_DIGEST_KEY, digestmod=hashlib.sha256)
        for part in (
            self.netloc,
            self.username,
            self.password,
            "insecure" if self.insecure else "verify",
            self.ca_bundle_pem or "",
        ):
            data = part.encode()
            mac.update(len(data).to_bytes(8, "big"))
            mac.update(data)
        return SessionKey(netloc=self.netloc, username=self.username, digest=mac.hexdigest())

    @property
    def account(self) -> AccountKey:
        return AccountKey.of(self.netloc, self.username)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: verified against the system store plus `ca_bundle_pem`."""
        if self.insecure:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.ca_bundle_pem:
            try:
                ctx.load_verify_locations(cadata=self.ca_bundle_pem)
            except ssl.SSLError as exc:
                raise ValueError(
                    f"the CA bundle for vCenter {self.netloc} is not valid PEM: {exc.reason}"
                ) from None
        return ctx


@dataclass(frozen=True, slots=True)
class AccountKey:
    """A user at a vCenter, whatever the password and however spelled: what SSO counts
    failed logins by (the module doc says what is folded). `vcenter` is the canonical
    `host:port`, or `instance:<uuid>` once the guard knows the vCenter behind it."""

    vcenter: str
    user: str

    @classmethod
    def of(cls, netloc: str, username: str) -> AccountKey:
        return cls(vcenter=canonical_vcenter(netloc), user=account_name(username))

    def __str__(self) -> str:
        return f"{self.user} at vCenter {self.vcenter}"


def account_name(username: str) -> str:
    """The account SSO resolves `username` to, without its domain, case-folded:
    `DOMAIN\\user`, `user@domain` and `user` are all `user`."""
    name = username.strip().rpartition("\\")[2]
    local, at, _domain = name.rpartition("@")
    return (local if at else name).strip().casefold()


def canonical_vcenter(netloc: str) -> str:
    """`host:port` as one vCenter is written however it was spelled: host case-folded,
    no trailing dot, an IP address compressed (IPv6 bracketed), the port always given."""
    host, _, port = netloc.strip().rpartition(":")
    if not host or not port.isdigit():
        host, port = netloc.strip(), "443"
    host = host.strip("[]").rstrip(".").casefold()
    with contextlib.suppress(ValueError):  # a name, not an address
        host = ipaddress.ip_address(host).compressed
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


@dataclass(frozen=True, slots=True)
class SessionKey:
    """What makes two callers share one session: the same whole credential.

    `digest` is an HMAC-SHA256 (per-process random key) over vCenter, user, password
    and TLS settings; only its first 8 hex digits (`tag`) are ever shown.
    """

    netloc: str
    username: str
    digest: str = field(repr=False)

    @property
    def account(self) -> AccountKey:
        return AccountKey.of(self.netloc, self.username)

    @property
    def tag(self) -> str:
        """A short, non-reversible name that tells credentials of one user apart."""
        return self.digest[:8]

    def __str__(self) -> str:
        return f"{self.username}@{self.netloc}"

    def __repr__(self) -> str:
        return f"SessionKey({self.username}@{self.netloc} #{self.tag})"


def _split(server: str) -> tuple[str, int]:
    text = server.strip()
    if "//" not in text:
        text = "https://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise ValueError(f"vCenter server {server!r} has no host name")
    return parts.hostname, parts.port or 443
