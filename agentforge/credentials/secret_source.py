"""vSphere credentials from Secrets read by name: `get` only, never `list` or `watch`.

Why not watches (the design before, docs/design/0004-secret-access.md): a watch needs
`list` and `watch`, and a ClusterRole granting those lets the operator's identity
read every Secret of the cluster, which on a HyperShift management cluster means
every hosted cluster's admin kubeconfig. A GET by name needs only `get`, which is
useless without knowing the name. The price is that changes are noticed by reading
again, not by being told:

* the first use of a Secret reads it; later uses answer from memory (no API call)
  while the copy is younger than `refresh_interval` (default 1 minute,
  `--credentials-refresh-interval`), and re-read it when it is older;
* a background sweep re-reads each Secret in use when its copy reaches that age, so
  a rotated (or broken) password, a created Secret, a fixed key or a new
  allowed-namespaces annotation is noticed at rest too: one GET per Secret in use per
  interval is all the API traffic this costs;
* a caller that has a reason to distrust the copy (a failed vCenter login, a
  changed pool) asks for `max_age=0` and gets a read that started after it asked;
* subscribers (`subscribe`) are told when what we keep of a Secret changed (its
  existence, its keys, its allowed namespaces), so the controllers using it run at
  once; a read that changes nothing tells nobody;
* a read that fails keeps the last good copy (the API server being down must not
  take credentials away) and is retried after 1 s, doubling up to the interval;
* only the keys of `credentials.KEPT_KEYS` and the allowed namespaces are kept.

Which Secrets are "in use" is the owner's call (`set_in_use`, from the infra
controller's pools-by-Secret index): a Secret no pool names any longer is dropped
when its copy comes due instead of being read again.

`get` enforces the credentials namespaces (`namespaces`: a Secret elsewhere is refused
unread) and the namespace boundary of `credentials` (a Secret in another namespace
only when shared), so every controller that reaches vCenter obeys both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.credentials import secret_rules as rules
from agentforge.credentials.secret_rules import CredentialsError
from agentforge.kube import errors

__all__ = ["DEFAULT_REFRESH_INTERVAL", "SecretCredentials", "SecretGetter", "SecretView"]

log = logging.getLogger(__name__)

DEFAULT_REFRESH_INTERVAL: Final = 60.0
"""Seconds a copy of a Secret is used before it is read again."""
FIRST_RETRY: Final = 1.0
"""Seconds before a failed read is retried; doubles up to the refresh interval."""

Listener = Callable[[str, str], None]
InUse = Callable[[str, str], bool]
Key = tuple[str, str]


class SecretGetter(Protocol):
    """What the source needs of `kube.client.KubeClient`: `get`, nothing else."""

    async def get(
        self, kind: kinds.Kind, *, namespace: str | None = None, name: str
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class SecretView:
    """What is kept of one Secret: that it exists, the keys we read, whom it is shared with."""

    found: bool
    data: tuple[tuple[str, str], ...] = ()
    allowed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, obj: dict[str, Any]) -> SecretView:
        data = obj.get("data") or {}
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return cls(
            found=True,
            data=tuple(sorted((k, v) for k, v in data.items() if k in rules.KEPT_KEYS)),
            allowed=rules.allowed_namespaces(annotations),
        )

    def __repr__(self) -> str:  # never the values
        return f"SecretView(found={self.found}, keys={[k for k, _ in self.data]})"


@dataclass(slots=True)
class _Entry:
    view: SecretView | None = None
    """The last successful read; None until one succeeded."""
    error: str | None = None
    """Why the last read failed (None after a success)."""
    read_at: float = float("-inf")
    """When the last read (successful or not) started."""
    due: float = float("-inf")
    """When the copy must be read again."""
    failures: int = 0
    parsed: vsphere.Credentials | str | None = field(default=None, repr=False)
    """The view's credentials, or why they are unusable (a message), once parsed."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)


class SecretCredentials:
    """A `deps.CredentialsSource`: Secrets read by name, kept briefly, re-read on a clock."""

    def __init__(
        self,
        *,
        client: SecretGetter,
        namespaces: Collection[str] | None = None,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`namespaces`: the only ones whose Secrets are read (`--credential-namespace`);
        None reads any the RBAC allows (tests of the reading alone)."""
        if refresh_interval <= 0:
            raise ValueError("refresh_interval must be positive")
        self._client = client
        self._namespaces = None if namespaces is None else frozenset(namespaces)
        self.refresh_interval = refresh_interval
        self._clock = clock
        self._entries: dict[Key, _Entry] = {}
        self._listeners: list[Listener] = []
        self._in_use: InUse | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(namespace, name)` whenever what is kept of a Secret changed."""
        self._listeners.append(listener)

    def set_in_use(self, in_use: InUse) -> None:
        """`in_use(namespace, name)`: does a pool still name this Secret? Others are dropped."""
        self._in_use = in_use

    async def get(
        self, *, namespace: str, name: str, for_namespace: str, max_age: float | None = None
    ) -> vsphere.Credentials:
        """The credentials in Secret `namespace/name` for a pool in `for_namespace`.

        Raises `credentials.CredentialsNotShared` for a Secret in another namespace that
        is missing, unreadable, not shared with `for_namespace` or incomplete (one text
        for all), `SecretUnreadable` when the pool's own Secret could not be read,
        `CredentialsError` when it is missing or a key is wrong;
        `credentials.CredentialsNamespaceNotAllowed`, without a read, for a Secret outside
        the credentials namespaces."""
        if self._namespaces is not None and namespace not in self._namespaces:
            raise rules.namespace_not_allowed(
                secret_namespace=namespace, name=name, allowed=self._namespaces
            )
        key = (namespace, name)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
            self._start_sweeper()
        asked = self._clock()
        if asked >= entry.due or (max_age is not None and asked - entry.read_at > max_age):
            await self._refresh(key, entry, since=asked)
        view = entry.view
        if for_namespace != namespace:
            shared = view is not None and view.found and for_namespace in view.allowed
            if not shared:
                raise rules.not_shared(
                    pool_namespace=for_namespace, secret_namespace=namespace, name=name
                )
        if view is None:
            raise rules.SecretUnreadable(entry.error or f"Secret {namespace}/{name} not read yet")
        if not view.found:
            raise CredentialsError(
                f"vSphere credentials Secret {namespace}/{name} not found: create it with "
                "keys server, username and password, or fix spec.vsphere.credentialsSecretRef"
            )
        if entry.parsed is None:
            try:
                entry.parsed = rules.parse_credentials(
                    namespace=namespace, name=name, data=dict(view.data)
                )
            except CredentialsError as exc:
                entry.parsed = str(exc)
        if isinstance(entry.parsed, str):
            raise CredentialsError(entry.parsed)  # a new one each time: no growing traceback
        return entry.parsed

    async def close(self) -> None:
        """Stop the sweep (at shutdown) and forget every copy."""
        task, self._sweeper = self._sweeper, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._entries.clear()

    # --- reading ---------------------------------------------------------------------

    async def _refresh(self, key: Key, entry: _Entry, *, since: float) -> None:
        """Read the Secret unless a read that started at or after `since` already did."""
        async with entry.lock:
            if entry.read_at >= since:
                return
            await self._read(key, entry)

    async def _read(self, key: Key, entry: _Entry) -> None:
        namespace, name = key
        started = self._clock()
        entry.read_at = started
        try:
            view = SecretView.of(
                await self._client.get(kinds.SECRET, namespace=namespace, name=name)
            )
        except errors.NotFound:
            view = SecretView(found=False)
        except errors.KubeError as exc:
            entry.failures += 1
            retry = min(FIRST_RETRY * 2 ** min(entry.failures - 1, 30), self.refresh_interval)
            entry.due = started + retry
            if entry.error is None:
                log.warning(
                    "cannot read Secret %s/%s (keeping the last copy, if any): %s; "
                    "check that the operator may get secrets (config/rbac) and that the API "
                    "server answers",
                    namespace,
                    name,
                    exc,
                )
            entry.error = (
                f"vSphere credentials Secret {namespace}/{name} could not be read: {exc}; check "
                "that the operator may get secrets in that namespace and that the API server "
                "answers"
            )
            return
        entry.failures, entry.due = 0, started + self.refresh_interval
        recovered, entry.error = entry.error is not None, None
        before, entry.view = entry.view, view
        if before != view:
            entry.parsed = None
        if (before is not None and before != view) or (before is None and recovered):
            self._notify(namespace, name)

    def _notify(self, namespace: str, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(namespace, name)
            except Exception:
                log.exception("listener for Secret %s/%s failed", namespace, name)

    # --- the sweep -------------------------------------------------------------------

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="credentials-refresh")
        self._wake.set()

    async def _sweep(self) -> None:
        """Re-read each Secret in use when its copy comes due; drop those no pool names."""
        while True:
            now = self._clock()
            for key, entry in list(self._entries.items()):
                if entry.due > now:
                    continue
                if self._in_use is not None and not self._in_use(*key):
                    del self._entries[key]
                    continue
                try:
                    # skipped when a get read it since it came due
                    await self._refresh(key, entry, since=entry.due)
                except Exception:  # a bug here must not end the sweep for all Secrets
                    log.exception("re-reading Secret %s/%s failed", *key)
                    entry.due = self._clock() + self.refresh_interval
            self._wake.clear()
            dues = [entry.due for entry in self._entries.values()]
            timeout = max(min(dues) - self._clock(), 0.0) if dues else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # no extra task, unlike wait_for
                    await self._wake.wait()
