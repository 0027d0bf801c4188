"""One logged-in vCenter connection per vCenter+user, shared by every caller.

Promises:
- every blocking pyVmomi call runs in a bounded `ThreadPoolExecutor`, after taking a
  token from the vCenter's `TokenBucket`;
- transient faults are retried with tenacity (jittered exponential backoff);
  permanent ones surface as typed `errors.VsphereError`s;
- on `NotAuthenticated` the session logs in again *once per expiry*: concurrent
  callers that saw the same expired generation share one re-login;
- while no call has been made for `keepalive_seconds`, a cheap `CurrentTime` keeps
  the session from idling out;
- credentials never appear in messages or logs.

The untyped pyVmomi surface stays here and in the modules that build specs; the rest
of the package sees `Any` only where a managed object reference is passed through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any, TypeVar, cast

import aiohttp
import tenacity

from agentforge.vsphere import errors
from agentforge.vsphere.credentials import Credentials, SessionKey
from agentforge.vsphere.ratelimit import TokenBucket
from agentforge.vsphere.tasks import TaskWaiter
from agentforge.vsphere.vmomi import smart_stub_adapter, vim

log = logging.getLogger(__name__)

T = TypeVar("T")
SOAP_COOKIE = "vmware_soap_session"


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Tunables of a session; defaults suit a production vCenter."""

    max_workers: int = 8
    calls_per_second: float = 50.0
    burst: int = 100
    keepalive_seconds: float = 600.0
    http_timeout_seconds: float = 120.0
    retry_attempts: int = 5
    retry_initial_seconds: float = 0.2
    retry_max_seconds: float = 5.0
    wait_max_seconds: int = 60


class Session:
    """A shared pyVmomi connection; obtain one from `SessionRegistry.session()`."""

    def __init__(
        self, *, credentials: Credentials, options: SessionOptions, bucket: TokenBucket
    ) -> None:
        self.credentials = credentials
        self.options = options
        self._bucket = bucket
        self._executor = ThreadPoolExecutor(
            max_workers=options.max_workers, thread_name_prefix=f"vsphere-{credentials.host}"
        )
        self._si: Any = None
        self._content: Any = None
        self._generation = 0
        self._login_lock = asyncio.Lock()
        self._last_call = time.monotonic()
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False
        self.logins = 0
        self.cache: dict[Any, Any] = {}
        self._memo_locks: dict[Any, asyncio.Lock] = {}
        self._http: aiohttp.ClientSession | None = None
        self.waiter = TaskWaiter(session=self)

    # --- identity ---------------------------------------------------------------

    @property
    def key(self) -> SessionKey:
        return self.credentials.key

    @property
    def generation(self) -> int:
        """Bumped on every successful login; objects tied to a login compare it."""
        return self._generation

    @property
    def content(self) -> Any:
        if self._content is None:
            raise errors.VsphereError(f"session {self.key} is not logged in", subject=str(self.key))
        return self._content

    def soap_cookie(self) -> str:
        """The `Cookie` header value that authenticates HTTP file access (`/folder`)."""
        stub = self._si._stub if self._si is not None else None
        raw = getattr(stub, "cookie", "") or ""
        jar: SimpleCookie = SimpleCookie()
        jar.load(raw)
        morsel = jar.get(SOAP_COOKIE)
        if morsel is None:
            raise errors.SessionExpired(
                f"session {self.key} has no {SOAP_COOKIE} cookie", subject=str(self.key)
            )
        return f'{SOAP_COOKIE}="{morsel.value}"'

    def http(self) -> aiohttp.ClientSession:
        """An aiohttp session to this vCenter (file access, vAPI), TLS as for SOAP."""
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context(), limit=16)
            self._http = aiohttp.ClientSession(
                base_url=f"https://{self.credentials.netloc}",
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.options.http_timeout_seconds,
                    sock_read=self.options.http_timeout_seconds,
                ),
            )
        return self._http

    def update_credentials(self, credentials: Credentials) -> None:
        """Rotated password: the next login uses the new one."""
        if credentials.key != self.key:
            raise ValueError("credentials of another vCenter or user")
        self.credentials = credentials

    # --- lifecycle --------------------------------------------------------------

    async def start(self) -> None:
        await self._login(seen=self._generation)
        self._keepalive = asyncio.create_task(self._keepalive_loop(), name=f"keepalive {self.key}")
        self.waiter.start()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        await self.waiter.close()
        if self._http is not None:
            await self._http.close()
        if self._content is not None:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self._content.sessionManager.Logout),
                    timeout=10,
                )
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- calls ------------------------------------------------------------------

    def retrying(self) -> tenacity.AsyncRetrying:
        """The retry policy for transient faults (shared with task and upload retries)."""
        opts = self.options
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(errors.is_transient),
            stop=tenacity.stop_after_attempt(max(1, opts.retry_attempts)),
            wait=tenacity.wait_exponential_jitter(
                multiplier=opts.retry_initial_seconds, max=opts.retry_max_seconds
            ),
            reraise=True,
        )

    async def call(self, fn: Callable[[], T], *, subject: str, action: str) -> T:
        """Run one blocking pyVmomi call; retried while transient, typed when not."""
        async for attempt in self.retrying():
            with attempt:
                return await self.call_once(fn, subject=subject, action=action)
        raise AssertionError("unreachable")  # pragma: no cover

    async def call_once(self, fn: Callable[[], T], *, subject: str, action: str) -> T:
        """One attempt: rate-limited, in the pool; re-logs in (once) on expiry."""
        if self._closed:
            raise errors.VsphereError(f"session {self.key} is closed", subject=str(self.key))
        seen = self._generation
        await self._bucket.acquire()
        loop = asyncio.get_running_loop()
        self._last_call = time.monotonic()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except Exception as exc:
            err = errors.classify(exc, subject=subject, action=action)
            if isinstance(err, errors.SessionExpired):
                await self._login(seen=seen)
            raise err from exc

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        """Run a blocking helper (no vCenter call) in the pool, without rate limiting."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def memo(self, key: Any, make: Callable[[], Awaitable[T]]) -> T:
        """A cached value, computed once even when many callers ask at the same time.

        Concurrent reconciles of one pool resolve its placement (and create its folder)
        once, not once each. `forget(key)` drops it (e.g. on ManagedObjectNotFound).
        """
        if key in self.cache:
            return cast(T, self.cache[key])
        lock = self._memo_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self.cache:
                return cast(T, self.cache[key])
            value = await make()
            self.cache[key] = value
            return value

    def forget(self, key: Any) -> None:
        self.cache.pop(key, None)

    async def ping(self) -> None:
        """A cheap call (CurrentTime); logs in again if the session had expired."""
        await self.call(self._si.CurrentTime, subject=f"vCenter {self.key}", action="ping")

    async def throttle(self) -> None:
        """Take a token for a non-SOAP request (HTTP file access, vAPI)."""
        await self._bucket.acquire()
        self._last_call = time.monotonic()

    def touch(self) -> None:
        """Record activity that did not go through `call` (long polls, HTTP transfers)."""
        self._last_call = time.monotonic()

    async def relogin(self, *, seen: int) -> None:
        """Log in again unless another caller already did since generation `seen`."""
        await self._login(seen=seen)

    # --- internals --------------------------------------------------------------

    async def _login(self, *, seen: int) -> None:
        async with self._login_lock:
            if self._generation != seen:
                return
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, self._login_blocking)
            except Exception as exc:  # noqa: BLE001 - classified and re-raised
                err = errors.classify(exc, subject=f"vCenter {self.key}", action="log in to")
                raise err from None
            self._generation += 1
            self.logins += 1
            self._last_call = time.monotonic()
            log.info("logged in to vCenter %s (login %d)", self.key, self.logins)

    def _login_blocking(self) -> None:
        creds = self.credentials
        if self._si is None:
            stub = smart_stub_adapter(
                host=creds.host,
                port=creds.port,
                sslContext=creds.ssl_context(),
                poolSize=self.options.max_workers + 2,
                httpConnectionTimeout=self.options.http_timeout_seconds,
            )
            si = vim.ServiceInstance("ServiceInstance", stub)
            content = si.RetrieveContent()
            self._si, self._content = si, content
        else:
            self._si._stub.cookie = ""  # start a fresh session, never resurrect the old one
        self._content.sessionManager.Login(userName=creds.username, password=creds.password)

    async def _keepalive_loop(self) -> None:
        interval = self.options.keepalive_seconds
        while True:
            idle = time.monotonic() - self._last_call
            if idle < interval:
                await asyncio.sleep(interval - idle)
                continue
            try:
                await self.ping()
            except errors.VsphereError as exc:
                log.warning("keep-alive of vCenter session %s failed: %s", self.key, exc)
                self._last_call = time.monotonic()


class SessionRegistry:
    """Owns the sessions of the process: one per vCenter+user, one bucket per vCenter."""

    def __init__(self, *, options: SessionOptions | None = None) -> None:
        self.options = options or SessionOptions()
        self._sessions: dict[SessionKey, Session] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = asyncio.Lock()

    async def session(self, credentials: Credentials) -> Session:
        """The shared session for these credentials, logging in on first use."""
        async with self._lock:
            existing = self._sessions.get(credentials.key)
            if existing is not None:
                old = existing.credentials
                if (old.insecure, old.ca_bundle_pem) == (
                    credentials.insecure,
                    credentials.ca_bundle_pem,
                ):
                    if old != credentials:
                        existing.update_credentials(credentials)  # a rotated password
                    return existing
                del self._sessions[credentials.key]  # TLS trust changed: a new connection
                await existing.close()
            bucket = self._buckets.get(credentials.netloc)
            if bucket is None:
                bucket = TokenBucket(rate=self.options.calls_per_second, burst=self.options.burst)
                self._buckets[credentials.netloc] = bucket
            session = Session(credentials=credentials, options=self.options, bucket=bucket)
            try:
                await session.start()
            except BaseException:
                await session.close()
                raise
            self._sessions[credentials.key] = session
            return session

    async def close(self) -> None:
        async with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            await session.close()
