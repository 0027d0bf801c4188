"""`SessionRegistry`: the process's vCenter sessions, one per whole credential.

Promises:
- **Keyed by the whole credential** (`SessionKey`: vCenter, user, password, TLS
  settings). Credentials that differ in anything, a password in particular, never
  share a session: a pool with a wrong password cannot borrow another pool's login.
  A rotated Secret is a new key: its session is made by its own login, and the old
  session stays for whoever still uses the old credential until it is idle-closed.
- **No lock across the network.** Each key has at most one login in flight (a task
  the registry owns); the registry's dicts are only read and written between awaits.
  A caller waits for a login at most `login_wait_seconds` counted from the login's
  start, then gets `errors.LoginPending` while the login goes on in the background;
  `subscribe` listeners hear of every login that ends (success or failure), so the
  caller's controller can come back then instead of holding a worker. A login is
  bounded by `login_timeout_seconds` (and each of its connections by the connect
  timeout): a vCenter that never answers costs its own callers that long, no one else.
- **No lockouts.** Every login, the first and every re-login after an expiry, asks
  `LoginGuard` first (per-credential backoff after `InvalidLogin`, a budget of
  failed logins per account and window, a per-vCenter circuit breaker): while it
  says no, callers get its `SessionUnavailable` at once and vCenter sees nothing.
  A login sends its credentials only once the guard admits it with the vCenter's
  instance UUID (read from the service content first), which joins every spelling
  of one vCenter into one budget; it waits for other logins of the joined account
  if they would use the budget up.
- **Tasks nobody waits for.** One `TaskSlots` per vCenter caps our tasks in flight
  there (`SessionOptions.max_tasks_in_flight`) and shares the slots fairly between
  groups; `claim_task_slot` returns a slot or raises `errors.TaskSlotPending` at
  once. `subscribe_tasks` listeners hear of every followed task that ended and of
  every slot reserved for a waiting token (`TaskNews`), so the caller's controller
  reconciles the right object then, instead of a worker waiting.
- `close()` is bounded: logins in flight are cancelled, sessions log out
  concurrently within `CLOSE_TIMEOUT_S`; threads still blocked on a socket are
  abandoned (they end at their socket timeout; the app does not wait for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentforge.ratelimit import TokenBucket
from agentforge.vsphere import faults
from agentforge.vsphere.model import errors
from agentforge.vsphere.session.credentials import Credentials, SessionKey
from agentforge.vsphere.session.logins import LoginGuard, LoginPolicy
from agentforge.vsphere.session.vcenter_session import Session, SessionOptions
from agentforge.vsphere.tasks.slots import Slot, TaskSlots

__all__ = [
    "CLOSE_TIMEOUT_S",
    "WAIT_FOR_LOGIN",
    "Listener",
    "SessionRegistry",
    "TaskListener",
    "TaskNews",
]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
WAIT_FOR_LOGIN = math.inf
"""`session(..., wait=WAIT_FOR_LOGIN)`: wait for the login to end (it is bounded anyway)."""

Listener = Callable[[SessionKey, errors.SessionUnavailable | None], None]
"""Told the key of every login that ended, and its failure (None: it succeeded, or the
key only waited for another login of its account to end)."""
Outcome = Session | errors.SessionUnavailable


@dataclass(frozen=True, slots=True)
class TaskNews:
    """Something a caller that does not wait may be waiting for, on one vCenter."""

    vcenter: str
    task: str | None = None
    """A followed task ended (or can no longer be watched): look at it now."""
    token: str | None = None
    """A task slot was reserved for this token: claim it now."""


TaskListener = Callable[[TaskNews], None]


@dataclass(slots=True)
class _Login:
    task: asyncio.Task[Outcome]
    session: Session
    started: float


class SessionRegistry:
    """Owns the sessions of the process: one per whole credential, one bucket per vCenter."""

    def __init__(
        self, *, options: SessionOptions | None = None, policy: LoginPolicy | None = None
    ) -> None:
        self.options = options or SessionOptions()
        self.guard = LoginGuard(policy)
        self._sessions: dict[SessionKey, Session] = {}
        self._logins: dict[SessionKey, _Login] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._blocked: set[SessionKey] = set()  # waiting for another login of their account
        self._listeners: list[Listener] = []
        self._slots: dict[str, TaskSlots] = {}
        self._task_listeners: list[TaskListener] = []
        self._closed = False

    # --- for callers ---------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(key, failure)` whenever a login for `key` ends (or one it
        waited for did); returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def subscribe_tasks(self, listener: TaskListener) -> Callable[[], None]:
        """Call `listener(news)` for every followed task that ends and every task slot
        reserved for a waiting token; returns a function that unsubscribes."""
        self._task_listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._task_listeners.remove(listener)

        return unsubscribe

    def claim_task_slot(self, vcenter: str, *, group: str, token: str, keep: bool = False) -> Slot:
        """A slot for one task on `vcenter`, or `errors.TaskSlotPending` (the token waits
        its turn in `group`; `subscribe_tasks` listeners hear when it comes). `keep`:
        the slot is handed over to the token when its task ends (`TaskSlots`)."""
        slots = self.task_slots(vcenter)
        slot = slots.claim(group=group, token=token, keep=keep)
        if slot is None:
            raise errors.TaskSlotPending(
                f"{slots.in_flight} tasks in flight on vCenter {vcenter} (at most "
                f"{slots.cap}, --vsphere-max-tasks-in-flight); {slots.waiting} waiting, "
                f"{slots.position(token) or 0} of them before this one in its group",
                vcenter=vcenter,
                token=token,
            )
        return slot

    def cancel_task_slot(self, token: str) -> None:
        """The token no longer waits for a task slot on any vCenter."""
        for slots in self._slots.values():
            slots.cancel(token)

    def give_back_task_slot(self, token: str) -> None:
        """A slot handed over to the token is not needed: the next in line gets it."""
        for slots in self._slots.values():
            slots.give_back(token)

    def task_slots(self, vcenter: str) -> TaskSlots:
        """The cap of one vCenter (made on first use)."""
        slots = self._slots.get(vcenter)
        if slots is None:

            def granted(token: str) -> None:
                self._tell_tasks(TaskNews(vcenter=vcenter, token=token))

            slots = self._slots[vcenter] = TaskSlots(
                cap=self.options.max_tasks_in_flight, name=vcenter, on_grant=granted
            )
        return slots

    async def session(self, credentials: Credentials, *, wait: float | None = None) -> Session:
        """The logged-in session for exactly these credentials.

        Logs in when there is none (or it expired), unless the guard defers it
        (`SessionUnavailable` subclasses, at once). Waits for a login in flight at
        most `wait` seconds from its start (default `login_wait_seconds`), then raises
        `errors.LoginPending`."""
        if self._closed:
            raise errors.VsphereError("the vCenter session registry is closed")
        key = credentials.key
        current = self._sessions.get(key)
        if current is not None and current.usable:
            current.used()
            return current
        login = self._logins.get(key) or self._begin(key, credentials, current)
        return await self._await(login, wait)

    def live(self, credentials: Credentials) -> Session | None:
        """The registered session of these credentials, logged in or not (no login)."""
        return self._sessions.get(credentials.key)

    async def close(self) -> None:
        """Cancel logins in flight, log every session out; bounded by `CLOSE_TIMEOUT_S`."""
        self._closed = True
        for slots in self._slots.values():
            slots.close()
        logins, self._logins = list(self._logins.values()), {}
        for login in logins:
            login.task.cancel()
        await asyncio.gather(*(login.task for login in logins), return_exceptions=True)
        sessions = {id(s): s for s in [*self._sessions.values(), *(x.session for x in logins)]}
        self._sessions.clear()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.gather(
                    *(s.close() for s in sessions.values()), return_exceptions=True
                )
        except TimeoutError:
            log.warning(
                "vCenter sessions did not log out within %ss; leaving them to expire",
                CLOSE_TIMEOUT_S,
            )
            for session in sessions.values():
                session.abandon()

    # --- logins --------------------------------------------------------------------

    def _begin(self, key: SessionKey, credentials: Credentials, session: Session | None) -> _Login:
        self.guard.check(key)  # raises while backoff, breaker or budget says no
        if self.guard.budget_busy(key):
            self._blocked.add(key)
            raise errors.LoginPending(
                f"logging in to vCenter {key.netloc} as {key.username} waits for other logins "
                "of that account to end (at most "
                f"{self.guard.policy.max_failed_logins} may fail per "
                f"{self.guard.policy.window_seconds:g}s)",
                key=key,
            )
        if session is None:
            session = Session(
                credentials=credentials,
                options=self.options,
                bucket=self._bucket(key.netloc),
                guard=self.guard,
                relogin=self._relogin,
                retire=self._retire,
                slots=self.task_slots(key.netloc),
                task_ended=self._task_ended,
            )
        self.guard.started(key)
        task = asyncio.create_task(self._login(key, session), name=f"vCenter login {key}")
        login = self._logins[key] = _Login(task=task, session=session, started=time.monotonic())
        return login

    async def _login(self, key: SessionKey, session: Session) -> Outcome:
        fresh = self._sessions.get(key) is not session
        timeout = self.options.login_timeout_seconds
        outcome: Outcome
        try:
            async with asyncio.timeout(timeout):
                await self._admit(key, await session.connect())
                await session.login()
        except asyncio.CancelledError:
            self.guard.abandoned(key)
            self._logins.pop(key, None)
            raise
        except errors.LoginDeferred as exc:  # the joined budget is used up: nothing was sent
            self.guard.abandoned(key)
            outcome = exc
        except TimeoutError:
            outcome = self.guard.failed(
                key,
                errors.NetworkError(
                    f"log in to vCenter {key} got no answer within {timeout:g}s",
                    subject=f"vCenter {key.netloc}",
                    fault="LoginTimeout",
                ),
            )
        except Exception as exc:  # noqa: BLE001 - classified: every failure is recorded
            err = faults.classify(exc, subject=f"vCenter {key}", action="log in to")
            if isinstance(err, errors.TransientError) and not isinstance(err, errors.NetworkError):
                err = errors.NetworkError(str(err), subject=err.subject, fault=err.fault)
            outcome = self.guard.failed(key, err)
        else:
            self.guard.succeeded(key)
            self._sessions[key] = session
            outcome = session
        self._logins.pop(key, None)
        if isinstance(outcome, errors.SessionUnavailable):
            # Info: every retry lands here; the pools' VsphereReady start is the warning
            # (`kube.condition_log`), logged once.
            log.info("login to vCenter %s (credentials #%s) failed: %s", key, key.tag, outcome)
            if fresh:
                await session.close()
        self._notify(key, outcome if isinstance(outcome, errors.SessionUnavailable) else None)
        return outcome

    async def _admit(self, key: SessionKey, instance_uuid: str | None) -> None:
        """Wait until the guard lets the login send its credentials (`LoginGuard.admit`:
        the vCenter's instance UUID may join this account with logins in flight)."""
        while others := self.guard.admit(key, instance_uuid):
            tasks = {login.task for other, login in self._logins.items() if other in others}
            assert tasks, "every login the guard counts in flight has its task here"
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def _await(self, login: _Login, wait: float | None) -> Session:
        limit = self.options.login_wait_seconds if wait is None else wait
        task = login.task
        if not task.done():
            remaining = login.started + limit - time.monotonic()
            if remaining > 0:
                await asyncio.wait({task}, timeout=None if math.isinf(remaining) else remaining)
            if not task.done():
                key = login.session.key
                elapsed = time.monotonic() - login.started
                raise errors.LoginPending(
                    f"logging in to vCenter {key.netloc} as {key.username} (for {elapsed:.0f}s; "
                    f"given up after {self.options.login_timeout_seconds:g}s); it goes on in "
                    "the background",
                    key=key,
                )
        if task.cancelled():
            raise errors.VsphereError("the vCenter session registry is closed")
        outcome = task.result()
        if isinstance(outcome, errors.SessionUnavailable):
            raise outcome.again()
        outcome.used()
        return outcome

    async def _relogin(self, session: Session, seen: int) -> None:
        """A session's re-login (expired, or found expired): guarded like any login."""
        if session.closed:
            raise errors.VsphereError(f"session {session.key} is closed", subject=str(session.key))
        if session.usable and session.generation != seen:
            return  # someone else logged in again meanwhile
        key = session.key
        login = self._logins.get(key) or self._begin(key, session.credentials, session)
        await self._await(login, None)

    async def _retire(self, session: Session) -> bool:
        """An idle session: forget it and close it (not while a login runs on it)."""
        key = session.key
        if key in self._logins:
            return False
        if self._sessions.get(key) is session:
            del self._sessions[key]
        await session.close()
        return True

    def _bucket(self, netloc: str) -> TokenBucket:
        bucket = self._buckets.get(netloc)
        if bucket is None:
            bucket = self._buckets[netloc] = TokenBucket(
                rate=self.options.calls_per_second, burst=self.options.burst
            )
        return bucket

    def _task_ended(self, vcenter: str, task: str) -> None:
        self._tell_tasks(TaskNews(vcenter=vcenter, task=task))

    def _tell_tasks(self, news: TaskNews) -> None:
        for listener in list(self._task_listeners):
            try:
                listener(news)
            except Exception:
                log.exception("a vCenter task listener failed")

    def _notify(self, key: SessionKey, failure: errors.SessionUnavailable | None) -> None:
        account = self.guard.account(key)
        woken = {other for other in self._blocked if self.guard.account(other) == account}
        self._blocked -= woken
        told = [(key, failure), *((other, None) for other in woken if other != key)]
        for listener in list(self._listeners):
            for each, why in told:
                try:
                    listener(each, why)
                except Exception:
                    log.exception("a vCenter login listener failed")
