"""One attempt and its retries: the HTTP plumbing under `agentforge.kube.client`.

`Transport` owns the single aiohttp session (TLS verified against the configured
CA, client certificates, the bearer token from a `config.TokenSource`), counts every
attempt in `agent_forge_kube_requests_total{verb,resource,code}` (resource named
`plural[.group][/subresource]` as the apiserver's metrics do), maps error
answers to `errors.ApiError` subclasses and failures to get an answer to
`errors.TransportError`, and retries transient failures with tenacity:

* 429 always (API priority and fairness rejects before acting), waiting the
  server's `Retry-After` when given, else exponential backoff with jitter;
* 5xx and torn connections only for `repeatable` requests: a request that may have
  reached the server is repeated only when repeating it is harmless;
* a connection that could not be opened, always (the server never saw it);
* 401 once, after invalidating the cached credential (a rotated projected token).

Headers are never logged: they carry the credential.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import tenacity
from prometheus_client import Counter, Histogram

from agentforge.kube import errors
from agentforge.kube.config import ClusterConfig

__all__ = ["REQUESTS", "REQUEST_DURATION", "Decode", "RetryPolicy", "Transport"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
Decode = Callable[[bytes], Any]
"""Reads an answer's JSON (`json.loads`, or the informer's page decoder: `kube.pages`)."""

REQUESTS = Counter(
    "agent_forge_kube_requests_total",
    "Requests sent to the Kubernetes API, by verb, resource and HTTP status code.",
    ["verb", "resource", "code"],
)
REQUEST_DURATION = Histogram(
    "agent_forge_kube_request_duration_seconds",
    "Latency of Kubernetes API requests (time to response headers for watches).",
    ["verb", "resource"],
)

_RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds of the transient-failure retry of one non-watch call."""

    attempts: int = 6
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    max_retry_after: float = 30.0


class _NotSent(errors.TransportError):
    """The connection could not be opened, so the server never saw the request."""


class _Untrusted(errors.TransportError):
    """TLS verification failed: retrying cannot help, the configuration must change."""


def _retry_after_wait(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    # "full jitter": uniform in [0, min(max, initial * 2**n)]
    backoff = tenacity.wait_random_exponential(
        multiplier=policy.initial_backoff, max=policy.max_backoff
    )

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, errors.ApiError) and exc.retry_after is not None:
            return min(exc.retry_after, policy.max_retry_after)
        return float(backoff(state))

    return wait


def _should_retry(*, repeatable: bool) -> Callable[[BaseException], bool]:
    def predicate(exc: BaseException) -> bool:
        if isinstance(exc, _Untrusted):
            return False
        if isinstance(exc, _NotSent | errors.TooManyRequests):
            return True  # the server did not act on it
        if isinstance(exc, errors.ApiError):
            return exc.status in _RETRIABLE_STATUS and repeatable
        return isinstance(exc, errors.TransportError) and repeatable

    return predicate


class Transport:
    """The session and retry loop shared by every call of one `KubeClient`."""

    def __init__(
        self,
        *,
        config: ClusterConfig,
        retry: RetryPolicy | None = None,
        request_timeout: float = 30.0,
        user_agent: str = "agent-forge",
    ) -> None:
        self.config = config
        self.request_timeout = request_timeout
        self._retry = retry or RetryPolicy()
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        repeatable: bool = True,
        decode: Decode = json.loads,
    ) -> JsonObj:
        """Any JSON call (for APIs without a `Kind`, e.g. TokenRequest, /version);
        `decode` reads the answer's JSON (the informer's pages: `kube.pages`)."""
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self._retry.attempts),
            wait=_retry_after_wait(self._retry),
            retry=tenacity.retry_if_exception(_should_retry(repeatable=repeatable)),
            reraise=True,
        )
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async for attempt in retrying:
            with attempt:
                response = await self.send(
                    method,
                    path,
                    verb=verb,
                    resource=resource,
                    params=params,
                    data=data,
                    content_type=content_type,
                )
                try:
                    raw = await response.read()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    raise errors.TransportError(
                        f"{method} {path}: reading the answer failed: {type(exc).__name__}"
                    ) from exc
                finally:
                    response.release()
                try:
                    decoded = decode(raw) if raw else {}
                except ValueError as exc:
                    raise errors.TransportError(
                        f"{method} {path}: the answer is not JSON ({len(raw)} bytes)"
                    ) from exc
                return decoded if isinstance(decoded, dict) else {"items": decoded}
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def send(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """One attempt; returns a successful response (caller releases it) or raises."""
        session = self._ensure_session()
        token = self.config.token
        for auth_attempt in (1, 2):
            headers = {"Accept": "application/json", "User-Agent": self._user_agent}
            if data is not None:
                headers["Content-Type"] = content_type
            if token is not None:
                authorization = await token.authorization()
                if authorization:
                    headers["Authorization"] = authorization
            started = time.monotonic()
            try:
                response = await session.request(
                    method,
                    self.config.server + path,
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=client_timeout or aiohttp.ClientTimeout(total=self.request_timeout),
                    server_hostname=self.config.tls_server_name,
                )
            except aiohttp.ClientConnectorCertificateError as exc:
                REQUESTS.labels(verb, resource, "error").inc()
                raise _Untrusted(
                    f"{method} {path}: the server's certificate is not trusted "
                    f"(check the CA in {self.config.source or 'the configuration'}): {exc}"
                ) from exc
            except aiohttp.ClientConnectorError as exc:
                REQUESTS.labels(verb, resource, "error").inc()
                raise _NotSent(f"{method} {path}: cannot connect: {exc}") from exc
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                REQUESTS.labels(verb, resource, "error").inc()
                raise errors.TransportError(
                    f"{method} {path}: no answer: {type(exc).__name__}: {exc}"
                ) from exc
            REQUESTS.labels(verb, resource, str(response.status)).inc()
            REQUEST_DURATION.labels(verb, resource).observe(time.monotonic() - started)
            if response.status < 400:
                return response
            try:
                body = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError):
                body = b""
            finally:
                response.release()
            if response.status == 401 and token is not None and auth_attempt == 1:
                token.invalidate()
                continue
            log.debug("%s %s -> %d", method, path, response.status)
            raise errors.from_response(
                status=response.status, body=body, retry_after=response.headers.get("Retry-After")
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=200)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if not self.config.server.startswith("https"):
            return False
        if not self.config.verify_tls:
            log.warning("TLS verification of %s is disabled by configuration", self.config.server)
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=self.config.ca_file, cadata=self.config.ca_pem)
        if self.config.cert_file:
            ctx.load_cert_chain(self.config.cert_file, self.config.key_file)
        elif self.config.cert_pem and self.config.key_pem:
            _load_cert_chain_from_pem(ctx, cert=self.config.cert_pem, key=self.config.key_pem)
        return ctx


def _load_cert_chain_from_pem(ctx: ssl.SSLContext, *, cert: str, key: str) -> None:
    """`ssl` loads client certificates only from files: use private ones, briefly."""
    with tempfile.TemporaryDirectory(prefix="agentforge-tls-") as directory:
        cert_path = Path(directory) / "client.crt"
        key_path = Path(directory) / "client.key"
        for path, content in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(content)
        ctx.load_cert_chain(cert_path, key_path)
