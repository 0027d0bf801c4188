"""When the VsphereReady preflight runs: on change, and after failures with backoff.

A preflight logs in and resolves every placement object of a pool: a few vCenter
calls. Run on every reconcile it would make the steady state cost vSphere traffic
proportional to pool status churn; never run again it would miss a fixed password.
So the gate remembers, per pool, what the last preflight saw: the pool's generation
and a fingerprint of the credentials (the session key's keyed digest over every
field, kept in memory only, never written anywhere). It runs again when either
changed, and after a failure once its backoff has passed: the time the session
registry names for a refused or deferred login or an unreachable vCenter (so the
pool asks again exactly when a login may be tried), else 30 s doubling to 10 min.
A success stands until an input changes, or until `forget` (a login with the same
credentials failed elsewhere). A restart forgets everything: one preflight per pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from agentforge import vsphere

__all__ = ["Decision", "Inputs", "PreflightGate", "fingerprint"]


def fingerprint(credentials: vsphere.Credentials) -> str:
    """A digest that changes when any credential field changes (keyed, not reversible)."""
    return credentials.key.digest


@dataclass(frozen=True, slots=True)
class Inputs:
    generation: int
    credentials: str


@dataclass(frozen=True, slots=True)
class Decision:
    run: bool
    wake_at: datetime | None = None
    """When a skipped preflight becomes due (a failure's backoff end), if ever."""


@dataclass(frozen=True, slots=True)
class _Seen:
    inputs: Inputs
    ok: bool
    failures: int
    retry_at: datetime | None


class PreflightGate:
    def __init__(
        self,
        *,
        initial_backoff: timedelta = timedelta(seconds=30),
        max_backoff: timedelta = timedelta(minutes=10),
    ) -> None:
        self._initial = initial_backoff
        self._max = max_backoff
        self._seen: dict[str, _Seen] = {}

    def decide(self, key: str, inputs: Inputs, *, now: datetime) -> Decision:
        seen = self._seen.get(key)
        if seen is None or seen.inputs != inputs:
            return Decision(run=True)
        if seen.ok:
            return Decision(run=False)
        if seen.retry_at is None or now >= seen.retry_at:
            return Decision(run=True)
        return Decision(run=False, wake_at=seen.retry_at)

    def record(
        self,
        key: str,
        inputs: Inputs,
        *,
        ok: bool,
        now: datetime,
        retry_at: datetime | None = None,
    ) -> datetime | None:
        """Remember an outcome; returns when a failed preflight may run again (`retry_at`
        when given and in the future, else the gate's own backoff)."""
        if ok:
            self._seen[key] = _Seen(inputs=inputs, ok=True, failures=0, retry_at=None)
            return None
        previous = self._seen.get(key)
        failures = previous.failures + 1 if previous and previous.inputs == inputs else 1
        if retry_at is None or retry_at <= now:
            retry_at = now + min(self._initial * (1 << min(failures - 1, 20)), self._max)
        self._seen[key] = _Seen(inputs=inputs, ok=False, failures=failures, retry_at=retry_at)
        return retry_at

    def retry_due(self, key: str, *, now: datetime) -> bool:
        """The last preflight of `key` failed and its backoff has passed."""
        seen = self._seen.get(key)
        return seen is not None and not seen.ok and (seen.retry_at is None or now >= seen.retry_at)

    def healthy(self, key: str) -> bool:
        """The last preflight of `key` succeeded (False when none ran)."""
        seen = self._seen.get(key)
        return seen is not None and seen.ok

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)
