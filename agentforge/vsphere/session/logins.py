"""When a login to vCenter may be attempted: lockout protection and a circuit breaker.

vCenter SSO locks a `vsphere.local` account after 5 failed logins within 180 s (its
default policy), for every client of that account. An operator that retries a
refused login on its reconcile backoff (milliseconds) locks the service account
every pool shares within a second. `LoginGuard` keeps the bookkeeping that stops
that; it does no I/O and reads time only through the clocks it is given.

* **Per credential** (`SessionKey`: vCenter, user, password, TLS settings): a login
  refused with `InvalidLogin` is not tried again before `backoff` (default 5 min),
  doubling per further refusal up to `backoff_max` (30 min). Every pool using those
  credentials shares the state: whoever asks meanwhile gets the same `LoginFailed`
  (same message, naming the time of the next attempt). Changed credentials (a
  rotated Secret) are another key with a fresh state, tried at once.
* **Per account** (vCenter + user, any password, any spelling): at most
  `max_failed_logins` (default 2) failed logins per `window` (180 s). The account
  is the one SSO resolves (`credentials.AccountKey`: the user case-folded without
  its domain, the host canonical), and once a vCenter has answered, its instance
  UUID (`ServiceContent.about.instanceUuid`) stands for every host spelling that
  reached it: a name, its address and a CNAME are one vCenter. The UUID is read
  from the service content, which every login fetches before it sends credentials;
  `admit` learns it there and only then lets the login send them, so even the first
  login through a new spelling counts against the one budget. Logins in flight count
  as possible failures, so concurrent first logins with several passwords cannot
  overshoot. Past the budget, logins of that account are `LoginDeferred` until the
  oldest failure leaves the window. Two failures in 180 s stay below SSO's five even
  when a new leader (which starts with empty bookkeeping) adds its own two.
* **Per vCenter** (`netloc`): a connection that failed or timed out (`NetworkError`,
  a login that outlived its timeout) opens a circuit breaker for `unreachable`
  (10 s) doubling to `unreachable_max` (5 min): logins and calls to that vCenter
  fail fast with `VcenterUnreachable` instead of each tying up a worker until its
  own timeout. The first success closes it. Not lockout-relevant: no budget used.
* Other login failures (an untrusted certificate, an unexpected fault) are retried
  per credential after `error_backoff` (30 s) doubling to `error_backoff_max` (10 min).

A success clears the credential's state and closes the breaker; failed logins stay
counted in the account's window (vCenter counts them too).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from agentforge.vsphere.model import errors
from agentforge.vsphere.session.credentials import AccountKey, SessionKey

__all__ = ["LoginGuard", "LoginPolicy"]

Clock = Callable[[], float]
Wall = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class LoginPolicy:
    """The limits; defaults are the production values (see the module doc)."""

    backoff_seconds: float = 300.0
    backoff_max_seconds: float = 1800.0
    max_failed_logins: int = 2
    window_seconds: float = 180.0
    unreachable_seconds: float = 10.0
    unreachable_max_seconds: float = 300.0
    error_backoff_seconds: float = 30.0
    error_backoff_max_seconds: float = 600.0


@dataclass(slots=True)
class _Refused:
    """The last failed login of one credential and when the next may start."""

    error: errors.SessionUnavailable
    failures: int
    retry_at: float  # monotonic


@dataclass(slots=True)
class _Account:
    failures: collections.deque[tuple[float, datetime]] = field(default_factory=collections.deque)


@dataclass(slots=True)
class _Breaker:
    failures: int
    open_until: float  # monotonic
    error: errors.VcenterUnreachable


def backoff(initial: float, maximum: float, failures: int) -> float:
    """`initial` doubled per failure after the first, capped at `maximum`."""
    return min(initial * (1 << min(max(failures - 1, 0), 30)), maximum)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LoginGuard:
    def __init__(
        self,
        policy: LoginPolicy | None = None,
        *,
        clock: Clock = time.monotonic,
        wall: Wall = lambda: datetime.now(UTC),
    ) -> None:
        self.policy = policy or LoginPolicy()
        self._clock = clock
        self._wall = wall
        self._refused: dict[SessionKey, _Refused] = {}
        self._accounts: dict[AccountKey, _Account] = {}
        self._in_flight: dict[SessionKey, bool] = {}  # key -> admitted (sends credentials)
        self._instances: dict[str, str] = {}  # canonical host:port -> "instance:<uuid>"
        self._breakers: dict[str, _Breaker] = {}

    def account(self, key: SessionKey) -> AccountKey:
        """The account `key` logs in as, its vCenter by instance UUID once known."""
        spelled = key.account
        instance = self._instances.get(spelled.vcenter)
        return spelled if instance is None else AccountKey(vcenter=instance, user=spelled.user)

    # --- before a login ------------------------------------------------------------

    def check(self, key: SessionKey) -> None:
        """Raise `SessionUnavailable` (a subclass) if a login with `key` may not start now.

        Order: the credential's own refusal, the vCenter's breaker, then the account's
        budget. A budget taken up only by logins in flight is not raised here:
        `budget_busy` tells the caller to wait for them instead."""
        refused = self._refused.get(key)
        if refused is not None and self._clock() < refused.retry_at:
            raise refused.error.again()
        self.check_reachable(key.netloc)
        account = self._account(self.account(key))
        if len(account.failures) >= self.policy.max_failed_logins:
            raise self._deferred(key, account)

    def budget_busy(self, key: SessionKey) -> bool:
        """True while failures plus logins in flight use the account's whole budget."""
        failures = len(self._account(self.account(key)).failures)
        return failures + len(self._flying(key)) >= self.policy.max_failed_logins

    def check_reachable(self, netloc: str) -> None:
        breaker = self._breakers.get(netloc)
        if breaker is not None and self._clock() < breaker.open_until:
            raise breaker.error.again()

    def started(self, key: SessionKey) -> None:
        self._in_flight[key] = False

    def admit(self, key: SessionKey, instance_uuid: str | None) -> set[SessionKey]:
        """The vCenter answered `key`'s login with its service content: may the login
        send its credentials now? Learns `instance_uuid` as the vCenter behind the key's
        host (joining its budget with every other spelling of that vCenter); raises
        `LoginDeferred` when the joined budget is used up, returns the other admitted
        logins of the account to wait for when they would use it up (empty: admitted)."""
        if instance_uuid:
            self._learn(key.account.vcenter, f"instance:{instance_uuid.strip().casefold()}")
        account = self._account(self.account(key))
        if len(account.failures) >= self.policy.max_failed_logins:
            raise self._deferred(key, account)
        others = {k for k in self._flying(key) if k != key and self._in_flight[k]}
        if len(account.failures) + len(others) >= self.policy.max_failed_logins:
            return others
        self._in_flight[key] = True
        return set()

    # --- after a login -------------------------------------------------------------

    def succeeded(self, key: SessionKey) -> None:
        self._release(key)
        self._refused.pop(key, None)
        self._breakers.pop(key.netloc, None)

    def failed(self, key: SessionKey, err: errors.VsphereError) -> errors.SessionUnavailable:
        """Record a failed login; returns the error every caller of `key` gets meanwhile."""
        self._release(key)
        if isinstance(err, errors.NetworkError | errors.VcenterUnreachable):
            self._refused.pop(key, None)
            return self.unreachable(key.netloc, err)
        now, wall = self._clock(), self._wall()
        previous = self._refused.get(key)
        failures = previous.failures + 1 if previous is not None else 1
        if isinstance(err, errors.PermissionDenied) and err.fault == "InvalidLogin":
            self._account(self.account(key)).failures.append((now, wall))
            delay = backoff(self.policy.backoff_seconds, self.policy.backoff_max_seconds, failures)
            retry_wall = wall + timedelta(seconds=delay)
            made: errors.SessionUnavailable = errors.LoginFailed(
                f"{err}; {failures} refused login(s) with these credentials; the next attempt "
                f"is not before {_utc(retry_wall)} (a backoff that keeps vCenter SSO from "
                "locking the account); a changed credentials Secret is tried at once",
                subject=err.subject,
                fault=err.fault,
                retry_at=retry_wall,
            )
        else:
            delay = backoff(
                self.policy.error_backoff_seconds, self.policy.error_backoff_max_seconds, failures
            )
            retry_wall = wall + timedelta(seconds=delay)
            made = errors.SessionUnavailable(
                f"{err}; tried again not before {_utc(retry_wall)}",
                subject=err.subject,
                fault=err.fault,
                retry_at=retry_wall,
            )
        self._refused[key] = _Refused(error=made, failures=failures, retry_at=now + delay)
        return made

    def abandoned(self, key: SessionKey) -> None:
        """A login that neither succeeded nor failed (cancelled at shutdown)."""
        self._release(key)

    # --- calls ---------------------------------------------------------------------

    def unreachable(self, netloc: str, err: errors.VsphereError) -> errors.VcenterUnreachable:
        """Open (or re-open, with a doubled cooldown) the breaker of `netloc`."""
        now, wall = self._clock(), self._wall()
        previous = self._breakers.get(netloc)
        failures = previous.failures + 1 if previous is not None else 1
        delay = backoff(
            self.policy.unreachable_seconds, self.policy.unreachable_max_seconds, failures
        )
        until = wall + timedelta(seconds=delay)
        made = errors.VcenterUnreachable(
            f"vCenter {netloc} is unreachable: {err}; calls to it fail fast until "
            f"{_utc(until)}, then it is tried again",
            subject=f"vCenter {netloc}",
            fault=err.fault,
            retry_at=until,
        )
        self._breakers[netloc] = _Breaker(failures=failures, open_until=now + delay, error=made)
        return made

    def reachable(self, netloc: str) -> None:
        """A call to `netloc` was answered: close its breaker."""
        if self._breakers:
            self._breakers.pop(netloc, None)

    # --- internals -----------------------------------------------------------------

    def _account(self, account: AccountKey) -> _Account:
        state = self._accounts.get(account)
        if state is None:
            state = self._accounts[account] = _Account()
        horizon = self._clock() - self.policy.window_seconds
        while state.failures and state.failures[0][0] <= horizon:
            state.failures.popleft()
        return state

    def _release(self, key: SessionKey) -> None:
        self._in_flight.pop(key, None)

    def _flying(self, key: SessionKey) -> list[SessionKey]:
        """The logins in flight of `key`'s account (any spelling, any password)."""
        account = self.account(key)
        return [k for k in self._in_flight if self.account(k) == account]

    def _learn(self, vcenter: str, instance: str) -> None:
        """`vcenter` (a canonical host:port) is the vCenter `instance`: its accounts'
        failures count for that instance from now on, with every other spelling's."""
        if self._instances.get(vcenter) == instance:
            return
        self._instances[vcenter] = instance
        for spelled in [a for a in self._accounts if a.vcenter == vcenter]:
            moved = self._accounts.pop(spelled).failures
            joined = self._accounts.setdefault(AccountKey(instance, spelled.user), _Account())
            joined.failures = collections.deque(sorted([*joined.failures, *moved]))

    def _deferred(self, key: SessionKey, account: _Account) -> errors.LoginDeferred:
        _, first_wall = account.failures[0]
        window = self.policy.window_seconds
        retry_wall = first_wall + timedelta(seconds=window)
        return errors.LoginDeferred(
            f"not logging in to vCenter {key.netloc} as {key.username} now: "
            f"{len(account.failures)} failed login(s) for this account (however spelled) "
            f"within the last {window:g}s, the most this operator allows (vCenter SSO "
            "locks an account "
            f"after 5 by default); the next attempt is not before {_utc(retry_wall)}",
            subject=f"vCenter {key.netloc}",
            fault="LoginDeferred",
            retry_at=retry_wall,
        )
