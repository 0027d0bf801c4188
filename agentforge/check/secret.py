"""The credentials Secret item of `python -m agentforge check`, by the operator's rules.

The Secret is read with the caller's own kubeconfig and judged by
`reconcilers.infra.credentials`: `parse_credentials` for its keys and, for a Secret in
another namespace than the pool's, the namespace boundary (it must list the pool's
namespace in its `agent-forge.containeroo.ch/allowed-namespaces` annotation, no
wildcard). The caller sees what their own permissions let them see: a Secret they
may read is judged in detail (missing, not shared, which key is wrong); one they
may not read is reported as unverifiable, with the rule and who can fix it. Entries
of the annotation that cannot be namespace names (such as `*`) are flagged to
whoever can read them. Secret values never reach an item.
"""

from __future__ import annotations

import re
from typing import Final

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.api.pool import VsphereAgentPool
from agentforge.check.probes import unreadable
from agentforge.check.render import Item, Status
from agentforge.credentials import secret_rules as rules
from agentforge.credentials.secret_rules import CredentialsError
from agentforge.kube import errors
from agentforge.kube.client import KubeClient

__all__ = ["secret"]

_KEYS: Final = (
    rules.KEY_SERVER,
    rules.KEY_USERNAME,
    rules.KEY_PASSWORD,
    rules.KEY_INSECURE,
    *rules.CA_BUNDLE_KEYS,
)
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


async def secret(
    client: KubeClient, pool: VsphereAgentPool
) -> tuple[list[Item], vsphere.Credentials | None]:
    """Items about the pool's credentials Secret, and its credentials when usable."""
    ns, name = pool.credentials_secret_namespace(), pool.spec.vsphere.credentials_secret_ref.name
    own = pool.metadata.namespace
    subject = f"Secret {ns}/{name}"
    try:
        raw = await client.get(kinds.SECRET, namespace=ns, name=name)
    except errors.NotFound:
        create = (
            f"kubectl -n {ns} create secret generic {name} --from-literal=server=... "
            "--from-literal=username=... --from-literal=password=..."
        )
        if ns == own:
            fix = f"{create}, or fix spec.vsphere.credentialsSecretRef"
            return [Item("secret", Status.FAIL, subject, "not found", fix)], None
        message = (
            f"not found (and a Secret in another namespace than the pool's is used only when "
            f"its annotation {rules.ALLOWED_NAMESPACES} lists {own})"
        )
        fix = (
            f"whoever manages namespace {ns}: {create}, then annotate it with "
            f"{rules.ALLOWED_NAMESPACES}={own}; or use a Secret in namespace {own}"
        )
        return [Item("secret", Status.FAIL, subject, message, fix)], None
    except errors.Forbidden as exc:
        if ns == own:
            return [unreadable("secret", subject, exc, "secrets")], None
        return [_unverifiable(subject, own=own, ns=ns)], None
    except errors.KubeError as exc:
        return [unreadable("secret", subject, exc, "secrets")], None
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    items = _odd_entries(subject, annotations)
    if not rules.shared_with(pool_namespace=own, secret_namespace=ns, annotations=annotations):
        return [*items, _not_shared(subject, own=own, ns=ns, name=name)], None
    data: dict[str, str] = raw.get("data") or {}
    try:
        credentials = rules.parse_credentials(namespace=ns, name=name, data=data)
    except CredentialsError as exc:
        message, fix = _problem_and_fix(str(exc), prefix=f"vSphere credentials {subject}")
        return [*items, Item("secret", Status.FAIL, subject, message, fix)], None
    found = f"keys {', '.join(k for k in _KEYS if data.get(k))}; vCenter {credentials.netloc}"
    if ns != own:
        found = f"shared with namespace {own} ({rules.ALLOWED_NAMESPACES}); {found}"
    if credentials.insecure:
        warning = "insecure: true, the vCenter certificate is not verified"
        fix = "put the vCenter CA in key caBundle and remove insecure"
        items += [
            Item("secret", Status.PASS, subject, found),
            Item("secret", Status.WARN, subject, warning, fix),
        ]
        return items, credentials
    # Whether vCenter's certificate verifies is known only after the login (vsphere item).
    trust = (
        "its CA bundle and the system store" if credentials.ca_bundle_pem else "the system store"
    )
    return [
        *items,
        Item(
            "secret", Status.PASS, subject, f"{found}; the certificate is checked against {trust}"
        ),
    ], credentials


def _share_fix(*, own: str, ns: str, name: str) -> str:
    return (
        f"whoever manages namespace {ns} adds {own} to the annotation (comma-separated), e.g. "
        f"kubectl -n {ns} annotate --overwrite secret {name} "
        f"{rules.ALLOWED_NAMESPACES}=<names already listed>,{own}; or use a Secret in "
        f"namespace {own}"
    )


def _not_shared(subject: str, *, own: str, ns: str, name: str) -> Item:
    return Item(
        "secret",
        Status.FAIL,
        subject,
        f"in another namespace than the pool ({own}) and its annotation "
        f"{rules.ALLOWED_NAMESPACES} does not list {own}: the operator refuses it "
        "(VsphereReady=False, CredentialsNotShared)",
        _share_fix(own=own, ns=ns, name=name),
    )


def _unverifiable(subject: str, *, own: str, ns: str) -> Item:
    return Item(
        "secret",
        Status.FAIL,
        subject,
        f"you may not read it, so whether it exists and lists {own} in its annotation "
        f"{rules.ALLOWED_NAMESPACES} cannot be checked; the operator uses a Secret in another "
        "namespace only then (else VsphereReady=False, CredentialsNotShared)",
        f"ask whoever manages namespace {ns} to check the Secret and its annotation (or run "
        f"this check with their kubeconfig), or use a Secret in namespace {own}",
    )


def _odd_entries(subject: str, annotations: dict[str, str]) -> list[Item]:
    odd = sorted(n for n in rules.allowed_namespaces(annotations) if not _DNS1123_LABEL.match(n))
    if not odd:
        return []
    return [
        Item(
            "secret",
            Status.WARN,
            subject,
            f"annotation {rules.ALLOWED_NAMESPACES} has entries that are no namespace names: "
            f"{', '.join(repr(n) for n in odd)} (there is no wildcard)",
            "list each namespace that may use the Secret by name, separated by commas",
        )
    ]


def _problem_and_fix(text: str, *, prefix: str) -> tuple[str, str]:
    """`parse_credentials` says "<secret> <problem>: <fix>" (or "; <fix>"): split it."""
    text = text.removeprefix(prefix).lstrip(": ")
    cuts = [i for i in (text.find(": "), text.find("; ")) if i > 0]
    if not cuts:
        return text, "fix the Secret's keys: server, username, password (insecure, caBundle)"
    return text[: min(cuts)], text[min(cuts) + 2 :]
