"""Keys waiting for a vCenter login, reconciled again the moment it ends.

The session registry lets a caller wait for a login only briefly
(`SessionOptions.login_wait_seconds`), then raises `vsphere.LoginPending` while the
login goes on in the background. Holding the worker until the login ends would let
one black-holed vCenter occupy every worker of a controller for a whole login
timeout; returning `requeue` would spin on the rate limiter. Instead a reconcile
that meets `LoginPending` records here which credentials it waits for (`wait`) and
returns; the registry reports every login that ends (`SessionRegistry.subscribe`)
and the waiting keys are enqueued again at once, as a changed Secret enqueues the
pools naming it. A requeue after the login timeout is the fallback should a report
come before the key was recorded.

`track` (the infra controller) also remembers which credentials each key used last,
so a failed login (a password changed in vCenter, found at a re-login after the
session expired) brings every pool using those credentials back, not only those
that happened to wait.
"""

from __future__ import annotations

from collections.abc import Callable

from agentforge import vsphere
from agentforge.kube.controller import Result
from agentforge.kube.store import ObjectKey

__all__ = ["LoginWaits"]

Enqueue = Callable[[ObjectKey], None]
Failed = Callable[[ObjectKey], None]


class LoginWaits:
    def __init__(
        self, registry: vsphere.SessionRegistry, *, on_failure: Failed | None = None
    ) -> None:
        self._registry = registry
        self._waiting: dict[vsphere.SessionKey, set[ObjectKey]] = {}
        self._users: dict[vsphere.SessionKey, set[ObjectKey]] = {}
        self._used: dict[ObjectKey, vsphere.SessionKey] = {}
        self._on_failure = on_failure
        self._enqueue: Enqueue | None = None
        registry.subscribe(self._ended)

    def bind(self, enqueue: Enqueue) -> None:
        """Where woken keys go (the controller's `enqueue`)."""
        self._enqueue = enqueue

    def wait(self, pending: vsphere.LoginPending, key: ObjectKey) -> Result:
        """Record that `key` waits for the login of `pending`; the result to return."""
        session_key = pending.key
        if isinstance(session_key, vsphere.SessionKey):
            self._waiting.setdefault(session_key, set()).add(key)
        return Result(requeue_after=self._registry.options.login_timeout_seconds)

    def track(self, key: ObjectKey, session_key: vsphere.SessionKey | None) -> None:
        """`key` now uses the credentials `session_key` (None: none, or it is gone)."""
        previous = self._used.pop(key, None)
        if previous is not None:
            users = self._users.get(previous)
            if users is not None:
                users.discard(key)
                if not users:
                    del self._users[previous]
        if session_key is not None:
            self._used[key] = session_key
            self._users.setdefault(session_key, set()).add(key)

    def _ended(
        self, session_key: vsphere.SessionKey, failure: vsphere.SessionUnavailable | None
    ) -> None:
        woken = self._waiting.pop(session_key, set())
        if failure is not None:
            users = self._users.get(session_key, set())
            if self._on_failure is not None:
                for key in users:
                    self._on_failure(key)
            woken |= users
        if self._enqueue is not None:
            for key in woken:
                self._enqueue(key)
