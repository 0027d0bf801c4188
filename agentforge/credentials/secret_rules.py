"""The rules of a vSphere credentials Secret: its keys, and which pools may use it.

`parse_credentials` turns a Secret's `data` into `vsphere.Credentials`; the operator
(`secret_source.SecretCredentials`) and `python -m agentforge check` share it, so
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
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl
from collections.abc import Collection, Mapping
from typing import Final

from agentforge import vsphere
from agentforge.api import kinds, names, rbac

__all__ = [
    "ALLOWED_NAMESPACES",
    "CA_BUNDLE_KEYS",
    "KEPT_KEYS",
    "KEY_INSECURE",
    "KEY_PASSWORD",
    "KEY_SERVER",
    "KEY_USERNAME",
    "CredentialsNamespaceNotAllowed",
    "CredentialsNotShared",
    "SecretUnreadable",
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
