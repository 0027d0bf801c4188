"""HTTPS and bearer-token authorisation for /metrics, as controller-runtime serves them.

* `MetricsTls`: the server's TLS context. With a certificate directory
  (`--metrics-cert-path`, e.g. a mounted `kubernetes.io/tls` Secret from cert-manager
  or OpenShift's service CA) the pair is loaded from there and `watch()` re-reads it
  when either file changes (checked every 10 s, like controller-runtime's
  certwatcher), so a rotated certificate is served without a restart; a new pair that
  does not load is logged and the previous one kept. Without a directory a
  self-signed ECDSA P-256 certificate is generated at start (valid one year, names
  `localhost`, the host name and the loopback addresses), as controller-runtime does
  when no certificate is given. TLS 1.2 is the minimum.
* `authorization_middleware(reviewer)`: every request needs `Authorization: Bearer
  <token>`; the API server authenticates the token (TokenReview) and authorises its
  user for `<method> <path>` as a non-resource URL (SubjectAccessReview), both
  through `agentforge.kube.access_review` with its caches and its budget for unknown
  tokens. No token or a token the API server rejects: 401. An unknown token while
  that budget is spent: 429 with Retry-After, without a review. A known user without
  the permission: 403. A review that could not be made: 500, so a broken API
  connection is not mistaken for a denial.

Why `cryptography` (a runtime dependency): the standard `ssl` module can serve a
certificate but not make one, and pyca's package is the maintained X.509 library for
Python, with binary wheels for every platform the image is built for. It costs the
process that imports it about 8 MB of RSS for good, so the operator never imports it:
a mounted pair needs no X.509 code, and the generated pair is made by a short-lived
child, `python -m agentforge.self_signed`, that hands it back over a pipe (made in
the operator, with a warning, only when the child cannot run). `ssl` loads a
certificate only from files, so the generated pair is written to a private
temporary directory (mode 0700, in the pod's memory-backed /tmp), loaded and deleted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from agentforge.kube.access_review import (
    AccessReviewer,
    ReviewThrottled,
    ReviewUnavailable,
    Verdict,
)
from agentforge.kube.client import KubeClient
from agentforge.settings import Settings

__all__ = [
    "CERT_CHECK_INTERVAL",
    "MetricsTls",
    "authorization_middleware",
    "bearer_token",
    "for_settings",
    "self_signed_pair",
]

log = logging.getLogger(__name__)

CERT_CHECK_INTERVAL = 10.0
SELF_SIGNED_CHILD_TIMEOUT = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
_FileState = tuple[tuple[int, int, int], ...]


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def self_signed_pair(*, hostname: str | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) of a fresh self-signed serving certificate,
    made in this process (`agentforge.self_signed.pair`: imports `cryptography`)."""
    from agentforge import self_signed  # noqa: PLC0415 - cryptography only when asked

    return self_signed.pair(hostname=hostname)


_KEY_MARKER = b"-----BEGIN PRIVATE KEY-----"


def _generate_pair() -> tuple[bytes, bytes]:
    """A self-signed pair from a child process (`python -m agentforge.self_signed`), so
    this process never loads `cryptography`; made here, with a warning, when the child
    cannot run or answers with something else than a certificate and a key."""
    problem: object
    try:
        done = subprocess.run(
            [sys.executable, "-m", "agentforge.self_signed"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SELF_SIGNED_CHILD_TIMEOUT,
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        problem = f"{exc}: {exc.stderr.decode(errors='replace').strip()[-500:]}"
    except (OSError, subprocess.SubprocessError) as exc:
        problem = exc
    else:
        cert, marker, key = done.stdout.partition(_KEY_MARKER)
        if marker and b"-----BEGIN CERTIFICATE-----" in cert:
            return cert, marker + key
        problem = "its output is not a certificate and a key"
    log.warning(
        "cannot make the self-signed metrics certificate in a child process; making it "
        "in the operator (about 8 MB more memory): %s",
        problem,
    )
    return self_signed_pair()


def _load_pem_pair(context: ssl.SSLContext, *, cert: bytes, key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="agentforge-metrics-tls-") as directory:
        paths = (Path(directory) / "tls.crt", Path(directory) / "tls.key")
        for path, content in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
        context.load_cert_chain(*paths)


class MetricsTls:
    """The metrics server's TLS context, from a mounted pair (watched) or self-signed."""

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        interval: float = CERT_CHECK_INTERVAL,
    ) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self._interval = interval
        self._state = self._file_state()

    @classmethod
    def from_files(
        cls, cert_file: Path, key_file: Path, *, interval: float = CERT_CHECK_INTERVAL
    ) -> MetricsTls:
        """Serve `cert_file` (PEM, chain included) with `key_file`; ssl.SSLError if they do
        not load or do not match."""
        context = _server_context()
        context.load_cert_chain(cert_file, key_file)
        return cls(context, cert_file=cert_file, key_file=key_file, interval=interval)

    @classmethod
    def self_signed(cls) -> MetricsTls:
        context = _server_context()
        cert, key = _generate_pair()
        _load_pem_pair(context, cert=cert, key=key)
        return cls(context)

    @property
    def generated(self) -> bool:
        return self.cert_file is None

    def _file_state(self) -> _FileState:
        state = []
        for path in (self.cert_file, self.key_file):
            if path is None:
                continue
            try:
                st = os.stat(path)  # follows the ..data symlink a Secret volume swaps
            except OSError:
                state.append((0, 0, 0))
            else:
                state.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(state)

    def reload_if_changed(self) -> bool:
        """Load the pair again if either file changed; True when the new pair is served."""
        if self.cert_file is None or self.key_file is None:
            return False
        state = self._file_state()
        if state == self._state:
            return False
        self._state = state
        try:
            # A scratch context first: a half-loaded pair must never reach the live one.
            _server_context().load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "the metrics certificate changed but does not load; still serving the "
                "previous one: %s",
                exc,
                extra={"cert": str(self.cert_file), "key": str(self.key_file)},
            )
            return False
        log.info("metrics certificate reloaded", extra={"cert": str(self.cert_file)})
        return True

    async def watch(self) -> None:
        """Re-read a mounted pair when it changes, forever (returns at once if generated)."""
        if self.generated:
            return
        while True:
            await asyncio.sleep(self._interval)
            self.reload_if_changed()


def bearer_token(request: web.Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authorization_middleware(reviewer: AccessReviewer) -> Middleware:
    """An aiohttp middleware admitting only callers the API server authorises."""

    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        verb, path = request.method.lower(), request.path
        try:
            decision = await reviewer.review(bearer_token(request), verb=verb, path=path)
        except ReviewThrottled as exc:
            log.debug("metrics request not reviewed: %s", exc, extra={"path": path})
            retry = str(max(1, math.ceil(exc.retry_after)))
            return web.Response(
                status=429, text="Too many requests\n", headers={"Retry-After": retry}
            )
        except ReviewUnavailable as exc:
            log.warning("cannot check a metrics request: %s", exc, extra={"path": path})
            return web.Response(status=500, text="Authentication or authorization failed\n")
        if decision.verdict is Verdict.UNAUTHENTICATED:
            log.debug("metrics request refused: %s", decision.reason, extra={"path": path})
            return web.Response(
                status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Bearer"}
            )
        name = decision.user.name if decision.user else ""
        if decision.verdict is Verdict.FORBIDDEN:
            log.debug(
                "metrics request forbidden",
                extra={"user": name, "verb": verb, "path": path, "reason": decision.reason},
            )
            return web.Response(status=403, text=f"Authorization denied for user {name}\n")
        return await handler(request)

    return authorize


def for_settings(
    settings: Settings, client: KubeClient
) -> tuple[MetricsTls | None, list[Middleware]]:
    """TLS and middlewares of the metrics server for the operator's settings.

    Plain HTTP for anyone with `--metrics-secure=false` (logged as a warning) or no
    server at all; else HTTPS with the mounted pair when given (ssl.SSLError when it
    does not load), else a generated one, and the API server's review of each caller.
    """
    if settings.metrics_bind_address is None:
        return None, []
    if not settings.metrics_secure:
        log.warning(
            "/metrics is served over plain HTTP without authentication (--metrics-secure=false)"
        )
        return None, []
    directory = settings.metrics_cert_path
    if directory is not None:
        tls = MetricsTls.from_files(
            directory / settings.metrics_cert_name, directory / settings.metrics_cert_key
        )
    else:
        tls = MetricsTls.self_signed()
    return tls, [authorization_middleware(AccessReviewer(client))]
