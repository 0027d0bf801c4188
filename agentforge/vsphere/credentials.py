"""How the operator proves who it is to a vCenter, and how it checks who the vCenter is.

`Credentials` is the one value a caller hands in: a small frozen dataclass whose
`repr` never shows the password, so it can sit in logs, exceptions and debuggers
without leaking. TLS is verified by default; `insecure=True` is an explicit opt-out,
and a CA bundle (PEM text, e.g. from the credentials Secret) is trusted in addition
to the system store when given.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Credentials:
    """A vCenter address and the user that logs in to it.

    `server` is a host name, `host:port`, or a URL (`https://vc.example/sdk`); only the
    host and port are used. The password is excluded from `repr` and from equality of
    the session key (see `SessionKey`).
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
        return SessionKey(netloc=self.netloc, username=self.username)

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
class SessionKey:
    """What makes two callers share one session: the same vCenter and the same user."""

    netloc: str
    username: str

    def __str__(self) -> str:
        return f"{self.username}@{self.netloc}"


def _split(server: str) -> tuple[str, int]:
    text = server.strip()
    if "//" not in text:
        text = "https://" + text
    parts = urlsplit(text)
    if not parts.hostname:
        raise ValueError(f"vCenter server {server!r} has no host name")
    return parts.hostname, parts.port or 443
