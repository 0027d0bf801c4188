"""Minting the identities tests use: ServiceAccount tokens, user tokens, file names.

ServiceAccount tokens come from the real TokenRequest API (the apiserver has an
issuer and signing key), so they are bound to the account and expire like the
operator's in-cluster token would. User tokens are random; the proxy's token webhook
vouches for them. Set-up requests go straight to the apiserver as admin.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence

from sim.controlplane.rest import RestClient

ADMIN_IDENTITY = "admin"
TOKEN_TTL_SECONDS = 30 * 24 * 3600


def serviceaccount_username(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def create_namespace(direct: RestClient, name: str) -> str:
    """Create a namespace if it does not exist yet; return its name."""
    direct.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        expect=(201, 409),
    )
    return name


def serviceaccount_token(
    direct: RestClient, *, namespace: str, name: str, ttl_seconds: int = TOKEN_TTL_SECONDS
) -> str:
    """Create the namespace and ServiceAccount when missing, then request a token."""
    create_namespace(direct, namespace)
    direct.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        expect=(201, 409),
    )
    review = direct.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": ttl_seconds},
        },
    ).body
    return str(review["status"]["token"])


def user_token() -> str:
    return secrets.token_urlsafe(32)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def serviceaccount_filename(namespace: str, name: str, *, via_proxy: bool) -> str:
    route = "" if via_proxy else "direct-"
    return f"{route}serviceaccount-{_safe(namespace)}-{_safe(name)}.kubeconfig"


def user_filename(name: str, groups: Sequence[str], *, via_proxy: bool) -> str:
    route = "" if via_proxy else "direct-"
    suffix = hashlib.sha256("\n".join(groups).encode()).hexdigest()[:8]
    return f"{route}user-{_safe(name)}-{suffix}.kubeconfig"
