"""vSphere credentials from Secrets: one tiny watch per referenced Secret, no cluster-wide cache.

Why not an informer over all Secrets: an operator that caches every Secret of the
cluster holds every password of every tenant in memory and needs `list` on all of
them anyway. Instead, the first lookup of a Secret starts an informer limited to
that Secret's namespace and name (`fieldSelector=metadata.name=<name>`), so:

* a warm lookup costs no API call (the cache answers);
* a rotated password, a fixed key or a newly created Secret arrives by watch, and
  subscribers (`subscribe`) are told which Secret changed, so the controllers that
  use it run again at once instead of polling;
* the cache keeps only the keys below (`_trim`), never the rest of the Secret.

Watches live until `close()` (the app calls it at shutdown); `credentialsSecretRef`
is immutable, so there is at most one per pool.

Keys (values base64 in `data`, as the API returns them):

| key | meaning |
|---|---|
| `server` | vCenter host, `host:port` or URL (required) |
| `username` | login user (required) |
| `password` | login password (required; used exactly as stored) |
| `insecure` | optional; `true` skips certificate verification (Go `ParseBool` values) |
| `caBundle` (or `ca.crt`) | optional PEM bundle trusted in addition to the system store |

A missing Secret or key raises `deps.CredentialsError` naming the Secret, the key and
the fix; `SecretUnreadable` (a subclass) means the Secret could not be read at all
yet (RBAC, API server down): retry later, never conclude it is absent. Values never
appear in messages, logs or `repr`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentforge import vsphere
from agentforge.api import kinds, rbac
from agentforge.kube.informer import EventHandler, Informer, ListWatcher
from agentforge.reconcilers.deps import CredentialsError

__all__ = [
    "CA_BUNDLE_KEYS",
    "KEY_INSECURE",
    "KEY_PASSWORD",
    "KEY_SERVER",
    "KEY_USERNAME",
    "SecretCredentials",
    "SecretUnreadable",
    "parse_credentials",
]

log = logging.getLogger(__name__)

KEY_SERVER: Final = "server"
KEY_USERNAME: Final = "username"
KEY_PASSWORD: Final = "password"  # noqa: S105 - a key name, not a password
KEY_INSECURE: Final = "insecure"
CA_BUNDLE_KEYS: Final = ("caBundle", "ca.crt")
_REQUIRED: Final = (KEY_SERVER, KEY_USERNAME, KEY_PASSWORD)
_KEPT: Final = frozenset((*_REQUIRED, KEY_INSECURE, *CA_BUNDLE_KEYS))
_TRUE: Final = frozenset({"1", "t", "true"})
_FALSE: Final = frozenset({"", "0", "f", "false"})

rbac.needs(
    kinds.SECRET,
    "list",
    "watch",
    why="read the vSphere credentials Secret each pool names (one Secret per watch)",
)

Listener = Callable[[str, str], None]


class SecretUnreadable(CredentialsError):
    """The Secret could not be read (yet): nothing can be concluded about it; retry."""


def parse_credentials(*, namespace: str, name: str, data: Mapping[str, str]) -> vsphere.Credentials:
    """Credentials from a Secret's `data` (base64 values); `CredentialsError` names the fix."""
    secret = f"Secret {namespace}/{name}"
    values = {key: _decode(secret, key, raw) for key, raw in data.items() if key in _KEPT}
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


def _trim(obj: dict[str, Any]) -> dict[str, Any]:
    """Keep identity metadata and only the keys we read; nothing else of the Secret."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    identity = ("name", "namespace", "uid", "resourceVersion")
    return {
        "metadata": {k: meta[k] for k in identity if k in meta},
        "data": {k: v for k, v in data.items() if k in _KEPT},
    }


@dataclass(slots=True)
class _Watched:
    informer: Informer
    parsed_version: str | None = None
    parsed: vsphere.Credentials | None = None


class SecretCredentials:
    """A `deps.CredentialsSource` backed by one field-selected informer per Secret."""

    def __init__(self, *, client: ListWatcher, sync_timeout: float = 10.0) -> None:
        self._client = client
        self._sync_timeout = sync_timeout
        self._watched: dict[tuple[str, str], _Watched] = {}
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(namespace, name)` whenever a watched Secret changes."""
        self._listeners.append(listener)

    async def get(self, *, namespace: str, name: str) -> vsphere.Credentials:
        watched = self._watch(namespace=namespace, name=name)
        if not watched.informer.has_synced:
            try:
                await asyncio.wait_for(watched.informer.synced(), timeout=self._sync_timeout)
            except TimeoutError:
                raise SecretUnreadable(
                    f"vSphere credentials Secret {namespace}/{name} could not be read within "
                    f"{self._sync_timeout:g}s; check that the operator may list and watch "
                    "secrets in that namespace and that the API server answers"
                ) from None
        obj = watched.informer.get(namespace=namespace, name=name)
        if obj is None:
            raise CredentialsError(
                f"vSphere credentials Secret {namespace}/{name} not found: create it with "
                "keys server, username and password, or fix spec.vsphere.credentialsSecretRef"
            )
        version = str(obj["metadata"].get("resourceVersion", ""))
        if watched.parsed is None or watched.parsed_version != version:
            watched.parsed = parse_credentials(
                namespace=namespace, name=name, data=obj.get("data") or {}
            )
            watched.parsed_version = version
        return watched.parsed

    async def close(self) -> None:
        """Stop every watch (at shutdown)."""
        watched, self._watched = list(self._watched.values()), {}
        for item in watched:
            await item.informer.stop()

    def _watch(self, *, namespace: str, name: str) -> _Watched:
        key = (namespace, name)
        watched = self._watched.get(key)
        if watched is None:
            informer = Informer(
                client=self._client,
                kind=kinds.SECRET,
                namespaces=[namespace],
                field_selector=f"metadata.name={name}",
                transform=_trim,
            )

            def changed(*_: dict[str, Any]) -> None:
                self._notify(namespace, name)

            informer.add_handler(EventHandler(on_add=changed, on_update=changed, on_delete=changed))
            watched = self._watched[key] = _Watched(informer=informer)
            informer.start()
        return watched

    def _notify(self, namespace: str, name: str) -> None:
        for listener in self._listeners:
            try:
                listener(namespace, name)
            except Exception:
                log.exception("listener for Secret %s/%s failed", namespace, name)
