"""One logged-in vCenter connection for one whole credential, shared by its callers.

Promises:
- a session belongs to exactly one `SessionKey` (vCenter, user, password, TLS
  settings); its credentials never change, and it logs in only when its
  `SessionRegistry` tells it to (`login`), which guards every login against lockouts
  and black holes (`logins.LoginGuard`);
- every blocking pyVmomi call runs in a bounded `ThreadPoolExecutor`, after taking a
  token from the vCenter's `TokenBucket`; every connection has a connect and a read
  timeout (`open_stub`, below), so no thread waits on vCenter without bound;
- transient faults are retried with tenacity (jittered exponential backoff);
  permanent ones surface as typed `errors.VsphereError`s; a connection that failed
  or timed out opens the vCenter's circuit breaker, and calls to that vCenter fail
  fast (`VcenterUnreachable`) until its cooldown ends;
- on `NotAuthenticated` the session asks its registry to log in again *once per
  expiry* (concurrent callers that saw the same expired generation share it);
- while no call has been made for `keepalive_seconds`, a cheap `CurrentTime` keeps
  the session from idling out; once nobody has used it for `idle_close_seconds` (the
  keep-alive does not count), it is handed back to the registry, which logs it out
  and closes it;
- credentials never appear in messages or logs.

The untyped pyVmomi surface stays here and in the modules that build specs; the rest
of the package sees `Any` only where a managed object reference is passed through.

**Following a task** (`Session.follow`) nobody waits for: its end is news for whoever
started it.
A controller starts a vCenter task, records its reference and returns; `follow`
registers the task with the session's one `TaskWaiter` (the PropertyCollector long
poll) and, when the task ends, frees its slot in the vCenter's `TaskSlots` and tells
the session's `task_ended` listener (the registry's, which tells the controllers,
which reconcile the object that waits for it). No coroutine waits meanwhile.

Promises:
- registration only: `follow` returns at once (or raises `VsphereError` for a closed
  session, freeing the slot);
- the news comes once per follow, also when the task can no longer be watched (vCenter
  forgot it, the session was closed or its re-login failed): the listener then looks
  at the task by its recorded reference and decides from what vCenter says;
- a task followed without a slot (found running after a restart) is counted in the
  cap too, so new starts make room for it;
- with `vm`, a question the VM raises while the task runs is news too (a CD-ROM
  disconnect blocked by the guest's lock waits for an answer, not for the task).

What a session remembers between calls, one typed field per kind of thing.

Managed object references are valid for one vCenter session's lifetime at most, and
a stale one is detected by the next call that uses it (`ManagedObjectNotFound`, or a
read whose `config.uuid` no longer matches), never trusted: callers drop the entry
and resolve afresh. Each field says what it maps; `Memo` computes a value once even
when many callers ask for it at the same time (concurrent reconciles of one pool
resolve its placement, and create its folder, once).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any, Generic, TypeVar

import aiohttp
import tenacity

from agentforge.ratelimit import TokenBucket
from agentforge.vsphere import faults
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.specs import Location, Placement, ResolvedPlacement
from agentforge.vsphere.session.credentials import Credentials, SessionKey
from agentforge.vsphere.session.logins import LoginGuard
from agentforge.vsphere.tasks.slots import DEFAULT_CAP, Slot, TaskSlots
from agentforge.vsphere.tasks.waiter import TaskWaiter
from agentforge.vsphere.vmomi import soap_stub_adapter, vim, vim25_versions

log = logging.getLogger(__name__)

T = TypeVar("T")
SOAP_COOKIE = "vmware_soap_session"
LOGOUT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Tunables of a session; defaults suit a production vCenter."""

    max_workers: int = 8
    calls_per_second: float = 50.0
    burst: int = 100
    keepalive_seconds: float = 600.0
    idle_close_seconds: float = 1800.0
    """Log out and close a session nobody used for this long (the keep-alive aside)."""
    connect_timeout_seconds: float = 10.0
    """TCP connect plus TLS handshake, for every connection to vCenter."""
    login_timeout_seconds: float = 30.0
    """A whole login: version discovery, service content, `Login`."""
    login_wait_seconds: float = 2.0
    """How long a caller waits for a login in flight before `errors.LoginPending`."""
    http_timeout_seconds: float = 120.0
    """The call timeout: the longest one request may go unanswered (reads)."""
    retry_attempts: int = 5
    retry_initial_seconds: float = 0.2
    retry_max_seconds: float = 5.0
    wait_max_seconds: int = 60
    task_batch_seconds: float = 0.2
    """The task waiter gathers registrations and updates this long, so many tasks cost
    one view change, one interrupted poll and one answer (at most this much later)."""
    max_tasks_in_flight: int = DEFAULT_CAP
    """Tasks of ours one vCenter runs at once (`task_slots.TaskSlots`)."""


TaskEnded = Callable[[str, str], None]
"""Told `(vCenter, task moref)` when a followed task ended (or could no longer be
watched): whoever waits for it should look at it now."""


def _nobody(vcenter: str, task: str) -> None:
    """The default `TaskEnded` listener: nobody to tell."""


Relogin = Callable[["Session", int], Awaitable[None]]
Retire = Callable[["Session"], Awaitable[bool]]


class Session:
    """A shared pyVmomi connection; obtain one from `SessionRegistry.session()`."""

    def __init__(
        self,
        *,
        credentials: Credentials,
        options: SessionOptions,
        bucket: TokenBucket,
        guard: LoginGuard,
        relogin: Relogin,
        retire: Retire,
        slots: TaskSlots | None = None,
        task_ended: TaskEnded = _nobody,
    ) -> None:
        self.credentials = credentials
        self.key: SessionKey = credentials.key
        self.options = options
        self._bucket = bucket
        self._guard = guard
        self._relogin = relogin
        self._retire = retire
        self.slots = slots or TaskSlots(cap=options.max_tasks_in_flight, name=credentials.netloc)
        self.task_ended = task_ended
        """Told when a task followed through `follow` ends."""
        self._executor = ThreadPoolExecutor(
            max_workers=options.max_workers, thread_name_prefix=f"vsphere-{credentials.host}"
        )
        self._si: Any = None
        self._content: Any = None
        self._fresh_stub = False
        self._generation = 0
        self._expired_generation = -1
        self._logged_in = False
        self._last_call = self._last_use = time.monotonic()
        self._calls_in_flight = 0
        self._keepalive: asyncio.Task[None] | None = None
        self._closed = False
        self.logins = 0
        self.cache = SessionCache()
        self._http: aiohttp.ClientSession | None = None
        self.waiter = TaskWaiter(session=self)

    # --- identity ---------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Bumped on every successful login; objects tied to a login compare it."""
        return self._generation

    @property
    def usable(self) -> bool:
        """Logged in, not known to have expired, not closed."""
        return self._logged_in and not self._closed and self._expired_generation != self._generation

    @property
    def closed(self) -> bool:
        return self._closed

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
                    sock_connect=self.options.connect_timeout_seconds,
                    sock_read=self.options.http_timeout_seconds,
                ),
            )
        return self._http

    # --- lifecycle (driven by the registry) ------------------------------------------

    async def connect(self) -> str | None:
        """Open the connection and read the service content (no credentials sent; once
        per session): the vCenter's instance UUID, for the login guard's budget."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._connect_blocking)
        except Exception as exc:  # noqa: BLE001 - classified and re-raised
            raise faults.classify(exc, subject=f"vCenter {self.key}", action="log in to") from None
        return getattr(getattr(self._content, "about", None), "instanceUuid", None) or None

    async def login(self) -> None:
        """Log in (again): a fresh vCenter session on this connection (`connect` first).
        Raises the classified error; the registry bounds it and decides whether it may run."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._login_blocking)
        except Exception as exc:  # noqa: BLE001 - classified and re-raised
            raise faults.classify(exc, subject=f"vCenter {self.key}", action="log in to") from None
        self._generation += 1
        self._logged_in = True
        self.logins += 1
        self._last_call = time.monotonic()
        log.info(
            "logged in to vCenter %s (credentials #%s, login %d)",
            self.key,
            self.key.tag,
            self.logins,
        )
        if self._keepalive is None and not self._closed:
            self._keepalive = asyncio.create_task(
                self._keepalive_loop(), name=f"keepalive {self.key}"
            )
            self.waiter.start()

    def used(self) -> None:
        """Someone is about to use the session (it is not idle)."""
        self._last_use = time.monotonic()

    async def close(self) -> None:
        """Log out (bounded) and release the connection, its threads and tasks."""
        if self._closed:
            return
        self._closed = True
        keepalive = self._keepalive
        if keepalive is not None and keepalive is not asyncio.current_task():
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive
        await self.waiter.close()
        if self._http is not None:
            await self._http.close()
        if self._logged_in and self._content is not None:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self._content.sessionManager.Logout),
                    timeout=LOGOUT_TIMEOUT_S,
                )
        self._executor.shutdown(wait=False, cancel_futures=True)

    def abandon(self) -> None:
        """Close without logging out or waiting (a bounded shutdown ran out of time)."""
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- calls ------------------------------------------------------------------

    def retrying(self) -> tenacity.AsyncRetrying:
        """The retry policy for transient faults (shared with task and upload retries)."""
        opts = self.options
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(faults.is_transient),
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

    async def call_once(
        self, fn: Callable[[], T], *, subject: str, action: str, idle: bool = False
    ) -> T:
        """One attempt: rate-limited, in the pool; re-logs in (once) on expiry.

        `idle=True` (the keep-alive) does not count as using the session."""
        if self._closed:
            raise errors.VsphereError(f"session {self.key} is closed", subject=str(self.key))
        self._guard.check_reachable(self.key.netloc)  # fail fast while the breaker is open
        if not self.usable:
            await self._relogin(self, self._generation)
        seen = self._generation
        await self._bucket.acquire()
        loop = asyncio.get_running_loop()
        self._last_call = time.monotonic()
        if not idle:
            self._last_use = self._last_call
        self._calls_in_flight += 1
        try:
            result = await loop.run_in_executor(self._executor, fn)
        except Exception as exc:
            err = faults.classify(exc, subject=subject, action=action)
            if isinstance(err, errors.NetworkError):
                self._guard.unreachable(self.key.netloc, err)
            elif isinstance(err, errors.SessionExpired):
                await self.relogin(seen=seen)
            raise err from exc
        finally:
            self._calls_in_flight -= 1
        self._guard.reachable(self.key.netloc)
        return result

    async def run_blocking(self, fn: Callable[[], T]) -> T:
        """Run a blocking helper (no vCenter call) in the pool, without rate limiting."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    def follow(self, task: Any, *, slot: Slot | None = None, vm: Any = None) -> str:
        """Report the end of `task` to `task_ended` (see the module doc, "Following a
        task"); returns its moref."""
        moid = str(task._moId)
        token = f"follow:{moid}"
        slots = self.slots
        if slot is not None:
            slot.bind(moid)
        elif not slots.holds(moid):
            slots.adopt(moid)
        where = self.key.netloc

        def ended(values: dict[str, Any] | None, exc: BaseException | None) -> None:
            slots.finished(moid)
            if vm is not None:
                self.waiter.unfollow(str(vm._moId), token=token)
            if exc is not None:
                log.info("vCenter %s: task %s can no longer be watched: %s", where, moid, exc)
            self.task_ended(where, moid)

        def asked(values: dict[str, Any] | None, exc: BaseException | None) -> None:
            if exc is None:  # (the task's own watch reports what went wrong)
                self.task_ended(where, moid)

        try:
            self.waiter.follow(task, token=token, ended=ended)
            if vm is not None:
                self.waiter.follow(vm, token=token, ended=asked, question=True)
        except errors.VsphereError:
            slots.finished(moid)
            raise
        return moid

    async def ping(self) -> None:
        """A cheap call (CurrentTime); logs in again if the session had expired."""
        await self.call(self._si.CurrentTime, subject=f"vCenter {self.key}", action="ping")

    async def throttle(self) -> None:
        """Take a token for a non-SOAP request (HTTP file access, vAPI)."""
        self._guard.check_reachable(self.key.netloc)
        await self._bucket.acquire()
        self._last_call = self._last_use = time.monotonic()

    def touch(self) -> None:
        """Record activity that did not go through `call` (long polls, HTTP transfers)."""
        self._last_call = self._last_use = time.monotonic()

    async def relogin(self, *, seen: int) -> None:
        """Log in again unless another caller already did since generation `seen`.

        The registry runs the login (guarded: backoff, lockout budget, breaker); it
        raises `SessionUnavailable` or `LoginPending` when it cannot be had now."""
        if self._generation == seen:
            self._expired_generation = seen
        await self._relogin(self, seen)

    # --- internals --------------------------------------------------------------

    def _connect_blocking(self) -> None:
        creds = self.credentials
        if self._si is None:
            stub = open_stub(
                host=creds.host,
                port=creds.port,
                context=creds.ssl_context(),
                connect_timeout=self.options.connect_timeout_seconds,
                read_timeout=self.options.http_timeout_seconds,
                pool_size=self.options.max_workers + 2,
            )
            si = vim.ServiceInstance("ServiceInstance", stub)
            content = si.RetrieveContent()
            self._si, self._content, self._fresh_stub = si, content, True

    def _login_blocking(self) -> None:
        creds = self.credentials
        if not self._fresh_stub:
            self._si._stub.cookie = ""  # start a fresh session, never resurrect the old one
        self._fresh_stub = False
        self._content.sessionManager.Login(userName=creds.username, password=creds.password)

    def _busy(self) -> bool:
        return self._calls_in_flight > 0 or self.waiter.busy

    async def _keepalive_loop(self) -> None:
        opts = self.options
        while not self._closed:
            now = time.monotonic()
            unused = now - self._last_use
            if unused >= opts.idle_close_seconds and not self._busy():
                log.info(
                    "closing vCenter session %s (credentials #%s): unused for %.0fs",
                    self.key,
                    self.key.tag,
                    unused,
                )
                if await self._retire(self):
                    return
                self._last_use = time.monotonic()  # a login runs on it: look again later
                continue
            quiet = now - self._last_call
            if quiet >= opts.keepalive_seconds and self.usable:
                try:
                    await self.call_once(
                        self._si.CurrentTime,
                        subject=f"vCenter {self.key}",
                        action="keep alive",
                        idle=True,
                    )
                except (errors.VsphereError, errors.LoginPending) as exc:
                    log.warning("keep-alive of vCenter session %s failed: %s", self.key, exc)
                    self._last_call = time.monotonic()
                continue
            wake = min(
                opts.keepalive_seconds - quiet if self.usable else opts.keepalive_seconds,
                max(opts.idle_close_seconds - unused, 0.0),
            )
            await asyncio.sleep(max(wake, 0.05))


K = TypeVar("K", bound=Hashable)

V = TypeVar("V")


class Memo(Generic[K, V]):
    """Values by key, each made at most once at a time."""

    def __init__(self) -> None:
        self._values: dict[K, V] = {}
        self._locks: dict[K, asyncio.Lock] = {}

    def get(self, key: K) -> V | None:
        return self._values.get(key)

    def put(self, key: K, value: V) -> None:
        self._values[key] = value

    def forget(self, key: K) -> None:
        self._values.pop(key, None)

    async def get_or_make(self, key: K, make: Callable[[], Awaitable[V]]) -> V:
        """The value for `key`, made by `make()` once for concurrent callers."""
        if key in self._values:
            return self._values[key]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self._values:
                return self._values[key]
            value = await make()
            self._values[key] = value
            return value


@dataclass(slots=True)
class SessionCache:
    """Per-session lookups. Morefs are pyVmomi objects, hence `Any` values."""

    datacenters: Memo[str, Any] = field(default_factory=Memo)
    """Datacenter inventory path -> `vim.Datacenter`."""
    datastores: Memo[Location, tuple[Any, Any, Any]] = field(default_factory=Memo)
    """Datastore -> (datacenter, datastore, its browser) morefs."""
    placements: Memo[Placement, ResolvedPlacement] = field(default_factory=Memo)
    """A pool's placement -> its resolved morefs (replaced once its folder exists)."""
    folders: Memo[Placement, Any] = field(default_factory=Memo)
    """A placement -> its VM folder, created on first use."""
    directories: Memo[tuple[Location, str], bool] = field(default_factory=Memo)
    """(datastore, folder) -> True once `mkdir -p` of the folder succeeded."""
    vms: dict[str, Any] = field(default_factory=dict)
    """Canonical BIOS UUID -> `vim.VirtualMachine`, re-checked on every read."""
    vapi_token: str | None = None
    """The vAPI (REST) session token for tagging, made on first use."""


# Opening a SOAP connection to vCenter whose every wait is bounded.
#
# pyVmomi's `SmartStubAdapter` asks the server which API versions it speaks over an
# `HTTPSConnection` without any timeout: against a vCenter that accepts TCP and never
# answers (a black hole: a dead load balancer, a firewall that drops), that thread
# waits forever, and no asyncio timeout can end a thread. So the version discovery
# is done here, and every connection the stub opens uses `_TimedHTTPS`:
#
# - the TCP connect and the TLS handshake are bounded by `connect_timeout`;
# - every read after that by `read_timeout` (the call timeout: the longest a single
#   request may go unanswered, above the task waiter's long poll).
#
# A stuck thread therefore ends by itself within those bounds; the session layer also
# bounds the whole login (`login_timeout`) in asyncio.

VERSIONS_PATH = "/sdk/vimServiceVersions.xml"
_MAX_VERSIONS_DOC = 256 * 1024
_NAMESPACE = re.compile(rb"<namespace>(.*?)</namespace>", re.DOTALL)
_NAME = re.compile(rb"<name>\s*urn:vim25\s*</name>")
_VERSION = re.compile(rb"<version>\s*([^<\s]+)\s*</version>")


class _TimedHTTPS(http.client.HTTPSConnection):
    """`HTTPSConnection` with one timeout for connect + handshake, another for reads."""

    def __init__(self, *args: Any, read_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()  # TCP connect and TLS handshake under `timeout` (connect)
        if self.sock is not None:
            self.sock.settimeout(self._read_timeout)


def open_stub(
    *,
    host: str,
    port: int,
    context: ssl.SSLContext,
    connect_timeout: float,
    read_timeout: float,
    pool_size: int,
) -> Any:
    """A `SoapStubAdapter` for the newest vim25 version the server speaks (blocking)."""
    version = _supported_version(
        host=host,
        port=port,
        context=context,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    stub = soap_stub_adapter(
        host=host,
        port=port,
        version=version,
        sslContext=context,
        httpConnectionTimeout=connect_timeout,
        poolSize=pool_size,
    )
    stub.scheme = functools.partial(_TimedHTTPS, read_timeout=read_timeout)
    return stub


def _supported_version(
    *,
    host: str,
    port: int,
    context: ssl.SSLContext,
    connect_timeout: float,
    read_timeout: float,
) -> str:
    conn = _TimedHTTPS(
        host, port, context=context, timeout=connect_timeout, read_timeout=read_timeout
    )
    try:
        conn.request("GET", VERSIONS_PATH)
        response = conn.getresponse()
        body = response.read(_MAX_VERSIONS_DOC) if response.status == 200 else b""
    finally:
        conn.close()
    offered: set[str] = set()
    for block in _NAMESPACE.findall(body):
        if _NAME.search(block):
            offered.update(v.decode("ascii", "replace") for v in _VERSION.findall(block))
    for name, version_id in vim25_versions():
        if version_id in offered:
            return name
    where = f"{host}:{port}"
    raise errors.ConnectionFailed(
        f"{where} does not answer as a vCenter ({VERSIONS_PATH} lists no vim25 API version "
        "this client speaks); check the server address in the credentials Secret",
        subject=f"vCenter {where}",
        fault="NotAVcenter",
    )
