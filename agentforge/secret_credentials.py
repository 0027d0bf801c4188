"""The rules of a vSphere credentials Secret: its keys, and which pools may use it.

`parse_credentials` turns a Secret's `data` into `vsphere.Credentials`; the operator
(`SecretCredentials`) and `python -m agentforge check` share it, so
both judge a Secret alike. Keys (values base64 in `data`, as the API returns them):

| key | meaning |
|---|---|
| `server` | vCenter host, `host:port` or URL (required) |
| `username` | login user (required) |
| `password` | login password (required; used exactly as stored) |
| `insecure` | optional; `true` skips certificate verification (Go `ParseBool` values) |
| `caBundle` (or `ca.crt`) | optional PEM bundle trusted in addition to the system store |

A missing key raises `CredentialsError` naming the Secret, the key and the fix;
`SecretUnreadable` (a subclass) means the Secret could not be read at all (RBAC, API
server down): retry later, never conclude it is absent. Values never appear in
messages, logs or `repr`.

**Credentials namespaces.** The operator reads Secrets only in the namespaces of
`--credential-namespace` (else those it watches), where its RBAC grants `get`; a pool
naming a Secret elsewhere gets `CredentialsNamespaceNotAllowed` (`namespace_not_allowed`)
without a read being tried.

**The namespace boundary** (docs/design/0004-secret-access.md). A pool may use a
Secret in its own namespace. A Secret in another namespace is used only when it
exists and lists the pool's namespace in its annotation
`agent-forge.containeroo.ch/allowed-namespaces` (comma-separated names, in the
spirit of CAPV's `allowedNamespaces`); there is no wildcard, so sharing with every
namespace, present and future, takes an explicit list. Until then the pool gets
`CredentialsNotShared` with `not_shared(...)`'s text, which is the same whether that
Secret is missing, unreadable, not annotated, or lacks keys: a pool's status must not
tell its author anything about another namespace. Only once a Secret opted in may
messages about its keys be specific.

**Reading them** (`SecretCredentials`): Secrets are read by name, `get` only, never
`list` or `watch`. Why not watches (the design before,
docs/design/0004-secret-access.md): a watch needs `list` and `watch`, and a ClusterRole
granting those lets the operator's identity read every Secret of the cluster, which on a
HyperShift management cluster means every hosted cluster's admin kubeconfig. A GET by
name needs only `get`, which is useless without knowing the name. The price is that
changes are noticed by reading again, not by being told:

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
* only the keys of `KEPT_KEYS` and the allowed namespaces are kept.

Which Secrets are "in use" is the owner's call (`set_in_use`, from the infra
controller's pools-by-Secret index): a Secret no pool names any longer is dropped
when its copy comes due instead of being read again.

`get` enforces the credentials namespaces (`namespaces`: a Secret elsewhere is refused
unread) and the namespace boundary of `credentials` (a Secret in another namespace
only when shared), so every controller that reaches vCenter obeys both.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import ssl
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from agentforge import vsphere
from agentforge.api import kinds, names, rbac
from agentforge.kube import errors

__all__ = [
    "ALLOWED_NAMESPACES",
    "CA_BUNDLE_KEYS",
    "DEFAULT_REFRESH_INTERVAL",
    "KEPT_KEYS",
    "KEY_INSECURE",
    "KEY_PASSWORD",
    "KEY_SERVER",
    "KEY_USERNAME",
    "CredentialsNamespaceNotAllowed",
    "CredentialsNotShared",
    "SecretCredentials",
    "SecretGetter",
    "SecretUnreadable",
    "SecretView",
    "allowed_namespaces",
    "namespace_not_allowed",
    "not_shared",
    "parse_credentials",
    "shared_with",
]

KEY_SERVER: Final = "server"
KEY_USERNAME: Final = "username"
KEY_PASSWORD: Final = "password"  # noqa: S105 - a key name, not a password
KEY_INSECURE: Final = "insecure"
CA_BUNDLE_KEYS: Final = ("caBundle", "ca.crt")
_REQUIRED: Final = (KEY_SERVER, KEY_USERNAME, KEY_PASSWORD)
KEPT_KEYS: Final = frozenset((*_REQUIRED, KEY_INSECURE, *CA_BUNDLE_KEYS))
"""The only keys of a Secret the operator keeps in memory."""
ALLOWED_NAMESPACES: Final = names.ANNOTATION_ALLOWED_NAMESPACES
_TRUE: Final = frozenset({"1", "t", "true"})
_FALSE: Final = frozenset({"", "0", "f", "false"})

_SEPARATORS: Final = re.compile(r"[\s,]+")

rbac.needs(
    kinds.SECRET,
    "get",
    why="read by name the vSphere credentials Secret each pool names (never list or watch)",
    scope=rbac.Scope.CREDENTIALS,
)


class CredentialsError(Exception):
    """The credentials Secret is missing, unreadable, lacks a key, or is not shared.

    The message names the Secret and the fix; it never carries a secret value.
    """


class SecretUnreadable(CredentialsError):
    """The Secret could not be read (yet): nothing can be concluded about it; retry."""


class CredentialsNamespaceNotAllowed(CredentialsError):
    """A Secret in a namespace outside the operator's credentials namespaces: never read."""


class CredentialsNotShared(CredentialsError):
    """A Secret in another namespace that has not opted in for the pool's namespace (or
    may be missing or unreadable: the pool may not learn which)."""


def allowed_namespaces(annotations: Mapping[str, str]) -> frozenset[str]:
    """The namespaces a Secret's annotation names (commas or blanks separate them).

    Entries are taken literally: `*` is not a wildcard, it names no namespace."""
    value = annotations.get(ALLOWED_NAMESPACES) or ""
    return frozenset(part for part in _SEPARATORS.split(value) if part)


def shared_with(
    *, pool_namespace: str, secret_namespace: str, annotations: Mapping[str, str]
) -> bool:
    """May a pool in `pool_namespace` use this Secret (which exists)?"""
    return pool_namespace == secret_namespace or pool_namespace in allowed_namespaces(annotations)


def not_shared(*, pool_namespace: str, secret_namespace: str, name: str) -> CredentialsNotShared:
    """The refusal of a Secret in another namespace: one text for every cause.

    It names only what the pool's author wrote (the reference) and the fix, never
    whether that Secret exists, can be read, is annotated or has the keys."""
    return CredentialsNotShared(
        f"credentials Secret {secret_namespace}/{name} (spec.vsphere.credentialsSecretRef) is in "
        f"another namespace than the pool's ({pool_namespace}); such a Secret is used only when "
        f"it exists and its annotation {ALLOWED_NAMESPACES} lists {pool_namespace}: whoever "
        f"manages namespace {secret_namespace} must add {pool_namespace} to that annotation "
        f"(comma-separated namespace names), or use a Secret in namespace {pool_namespace} "
        "(credentialsSecretRef is immutable: in a new pool)"
    )


def namespace_not_allowed(
    *, secret_namespace: str, name: str, allowed: Collection[str]
) -> CredentialsNamespaceNotAllowed:
    """The refusal of a Secret outside the credentials namespaces (decided before any read)."""
    return CredentialsNamespaceNotAllowed(
        f"credentials Secret {secret_namespace}/{name} (spec.vsphere.credentialsSecretRef) is in "
        f"namespace {secret_namespace}, where the operator reads no Secrets: it reads vSphere "
        f"credentials only in {', '.join(sorted(allowed))} (--credential-namespace). Use a "
        "Secret in one of those (credentialsSecretRef is immutable: in a new pool), or the "
        f"cluster administrator adds {secret_namespace} to --credential-namespace and binds the "
        f"ClusterRole {names.CREDENTIALS_READER_ROLE} to the operator there "
        "(docs/installation.md#credentials-namespaces)"
    )


def parse_credentials(*, namespace: str, name: str, data: Mapping[str, str]) -> vsphere.Credentials:
    """Credentials from a Secret's `data` (base64 values); `CredentialsError` names the fix."""
    secret = f"Secret {namespace}/{name}"
    values = {key: _decode(secret, key, raw) for key, raw in data.items() if key in KEPT_KEYS}
    for key in _REQUIRED:
        if not values.get(key):
            raise CredentialsError(
                f"vSphere credentials {secret} has no key {key!r} (or it is empty): add it, "
                f"e.g. kubectl -n {namespace} patch secret {name} --type merge "
                f'-p \'{{"stringData":{{"{key}":"..."}}}}\''
            )
    insecure_text = values.get(KEY_INSECURE, "").strip().lower()
    if insecure_text not in _TRUE | _FALSE:
        raise CredentialsError(
            f"vSphere credentials {secret}: key {KEY_INSECURE!r} must be true or false; "
            "fix the value or remove the key"
        )
    ca_key = next((k for k in CA_BUNDLE_KEYS if values.get(k, "").strip()), None)
    ca_bundle = values[ca_key] if ca_key else None
    if ca_key and ca_bundle:
        _check_pem(secret, ca_key, ca_bundle)
    credentials = vsphere.Credentials(
        server=values[KEY_SERVER].strip(),
        username=values[KEY_USERNAME].strip(),
        password=values[KEY_PASSWORD],
        insecure=insecure_text in _TRUE,
        ca_bundle_pem=ca_bundle,
    )
    try:
        credentials.netloc  # noqa: B018 - validates the server address
    except ValueError:
        raise CredentialsError(
            f"vSphere credentials {secret}: key {KEY_SERVER!r} is not a host name, host:port "
            "or URL; set it to the vCenter address"
        ) from None
    return credentials


def _decode(secret: str, key: str, raw: str) -> str:
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise CredentialsError(
            f"vSphere credentials {secret}: key {key!r} is not base64-encoded UTF-8 text; "
            "write it with stringData or kubectl create secret generic --from-literal"
        ) from None


def _check_pem(secret: str, key: str, pem: str) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError):
        raise CredentialsError(
            f"vSphere credentials {secret}: key {key!r} is not a PEM certificate bundle; "
            "put the vCenter CA certificate(s) there in PEM form"
        ) from None


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
            data=tuple(sorted((k, v) for k, v in data.items() if k in KEPT_KEYS)),
            allowed=allowed_namespaces(annotations),
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
            raise namespace_not_allowed(
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
                raise not_shared(
                    pool_namespace=for_namespace, secret_namespace=namespace, name=name
                )
        if view is None:
            raise SecretUnreadable(entry.error or f"Secret {namespace}/{name} not read yet")
        if not view.found:
            raise CredentialsError(
                f"vSphere credentials Secret {namespace}/{name} not found: create it with "
                "keys server, username and password, or fix spec.vsphere.credentialsSecretRef"
            )
        if entry.parsed is None:
            try:
                entry.parsed = parse_credentials(
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
