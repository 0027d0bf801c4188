"""RBAC declared where the API is used, rendered into `config/rbac/`.

A module that talks to the API server says what it needs next to the code that
needs it::

    rbac.needs(kinds.AGENT, "get", "list", "watch", "patch", "delete",
               why="prepare Agents and clean up the ones we made")

`make manifests` imports the application (so every declaration has run) and renders
the registry: one ClusterRole for cluster-wide needs, one Role in the operator's
namespace for leader election, the `credentials-reader` ClusterRole for Secrets, which
nothing binds cluster-wide: a RoleBinding (`credentials_binding`) grants it in each
namespace whose Secrets pools may use, and nowhere else (the chart generates them from
its values, docs/installation.md says how for `make deploy` and OLM). Static rules
complete it: the `metrics-reader` ClusterRole that whoever scrapes /metrics must hold,
and the tenant roles `pool-editor` / `pool-viewer`, aggregated into the built-in
`edit` / `view` (and `admin`), which never grant a status subresource: the operator
alone writes status, and adoption trusts a VsphereAgent's status.

Rules are merged the way controller-gen merges kubebuilder markers: verbs of the same
apiGroup+resource are united, then resources of one apiGroup that need the same verbs
share a rule, all sorted, so the output does not depend on import order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal, get_args

from agentforge.api import kinds, names
from agentforge.api.kinds import Kind

Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
VERBS: Final = frozenset(get_args(Verb))
RBAC_API_VERSION: Final = "rbac.authorization.k8s.io/v1"


class Scope(StrEnum):
    CLUSTER = "cluster"
    """Granted by the ClusterRole: objects in any namespace."""
    LEADER_ELECTION = "leader-election"
    """Granted by a Role in the operator's own namespace only."""
    CREDENTIALS = "credentials"
    """Granted by RoleBindings to the credentials-reader ClusterRole, one in each
    credentials namespace (`--credential-namespace`); never cluster-wide."""


@dataclass(frozen=True, slots=True)
class Need:
    """One declaration: verbs on a resource (or subresource) and why."""

    group: str
    resource: str
    verbs: frozenset[str]
    scope: Scope
    why: str
    namespaced: bool = True
    """False for cluster-scoped kinds (reviews, namespaces): granted without a namespace."""


@dataclass(slots=True)
class Registry:
    """The declarations made so far. The application uses `REGISTRY`; tests make their own."""

    declared: list[Need] = field(default_factory=list)

    def needs(
        self,
        kind: Kind,
        *verbs: Verb,
        why: str,
        subresource: str | None = None,
        scope: Scope = Scope.CLUSTER,
    ) -> None:
        """Declare that the operator calls `verbs` on `kind` (or its `subresource`)."""
        unknown = set(verbs) - VERBS
        if not verbs or unknown:
            raise ValueError(f"RBAC need for {kind.plural}: unknown or no verbs {sorted(unknown)}")
        if not why.strip():
            raise ValueError(f"RBAC need for {kind.plural}: say why it is needed")
        resource = f"{kind.plural}/{subresource}" if subresource else kind.plural
        self.declared.append(
            Need(kind.group, resource, frozenset(verbs), scope, why.strip(), kind.namespaced)
        )

    def rules(self, scope: Scope) -> list[dict[str, Any]]:
        """The merged, sorted PolicyRules for `scope`."""
        verbs_of: dict[tuple[str, str], set[str]] = defaultdict(set)
        for need in self.declared:
            if need.scope is scope:
                verbs_of[(need.group, need.resource)] |= need.verbs
        resources_of: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
        for (group, resource), verbs in verbs_of.items():
            resources_of[(group, tuple(sorted(verbs)))].append(resource)
        rules = [
            {"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
            for (group, verbs), resources in resources_of.items()
        ]
        return sorted(rules, key=lambda r: (r["apiGroups"], r["resources"], r["verbs"]))

    def reasons(self, scope: Scope) -> list[str]:
        """`group/resource: verbs - why` lines, for the header of the rendered file."""
        lines = {
            f"{n.group or 'core'}/{n.resource} [{','.join(sorted(n.verbs))}]: {n.why}"
            for n in self.declared
            if n.scope is scope
        }
        return sorted(lines)


REGISTRY: Final = Registry()
needs: Final = REGISTRY.needs
"""Declare a need in the application's registry (see the module docstring)."""


def _service_account_subject(namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": names.SERVICE_ACCOUNT, "namespace": namespace}


TENANT_KINDS: Final = (kinds.VSPHERE_AGENT_POOL, kinds.VSPHERE_AGENT)
"""What the tenant roles cover: our own kinds (never their status subresource)."""
_EDIT_VERBS: Final = (
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
)
_VIEW_VERBS: Final = ("get", "list", "watch")
_AGGREGATE: Final = "rbac.authorization.k8s.io/aggregate-to-"


def _tenant_role(name: str, verbs: tuple[str, ...], *to: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {f"{_AGGREGATE}{role}": "true" for role in to}},
        "rules": [
            {
                "apiGroups": sorted({k.group for k in TENANT_KINDS}),
                "resources": sorted(k.plural for k in TENANT_KINDS),
                "verbs": list(verbs),
            }
        ],
    }


def credentials_binding(
    namespace: str, *, operator_namespace: str = names.DEPLOYMENT_NAMESPACE
) -> dict[str, Any]:
    """The RoleBinding that lets the operator `get` Secrets in `namespace` (and only there)."""
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": {"name": names.CREDENTIALS_READER_ROLE, "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": names.CREDENTIALS_READER_ROLE,
        },
        "subjects": [_service_account_subject(operator_namespace)],
    }


def render(
    registry: Registry, *, namespace: str = names.DEPLOYMENT_NAMESPACE
) -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Every file of `config/rbac/` except kustomization.yaml: name -> (comments, object)."""
    leader_binding = "agent-forge-leader-election-rolebinding"
    manager_binding = "agent-forge-manager-rolebinding"
    return {
        "service_account.yaml": (
            ["The identity the operator runs as."],
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": names.SERVICE_ACCOUNT, "namespace": namespace},
            },
        ),
        "role.yaml": (
            registry.reasons(Scope.CLUSTER),
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "ClusterRole",
                "metadata": {"name": names.MANAGER_ROLE},
                "rules": registry.rules(Scope.CLUSTER),
            },
        ),
        "role_binding.yaml": (
            [],
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "ClusterRoleBinding",
                "metadata": {"name": manager_binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": names.MANAGER_ROLE,
                },
                "subjects": [_service_account_subject(namespace)],
            },
        ),
        "leader_election_role.yaml": (
            registry.reasons(Scope.LEADER_ELECTION),
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "Role",
                "metadata": {"name": names.LEADER_ELECTION_ROLE, "namespace": namespace},
                "rules": registry.rules(Scope.LEADER_ELECTION),
            },
        ),
        "leader_election_role_binding.yaml": (
            [],
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "RoleBinding",
                "metadata": {"name": leader_binding, "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": names.LEADER_ELECTION_ROLE,
                },
                "subjects": [_service_account_subject(namespace)],
            },
        ),
        "credentials_reader_role.yaml": (
            [
                *registry.reasons(Scope.CREDENTIALS),
                "Bound by a RoleBinding in each credentials namespace (--credential-namespace),",
                "never by a ClusterRoleBinding: the operator reads no Secret elsewhere.",
                "docs/installation.md#credentials-namespaces",
            ],
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "ClusterRole",
                "metadata": {"name": names.CREDENTIALS_READER_ROLE},
                "rules": registry.rules(Scope.CREDENTIALS),
            },
        ),
        "pool_editor_role.yaml": (
            [
                "For tenants: aggregated into the built-in `edit` and `admin` roles. No status",
                "subresource: only the operator writes status (adoption trusts it).",
            ],
            _tenant_role(names.POOL_EDITOR_ROLE, _EDIT_VERBS, "admin", "edit"),
        ),
        "pool_viewer_role.yaml": (
            ["For tenants: aggregated into the built-in `view` role (and so `edit`, `admin`)."],
            _tenant_role(names.POOL_VIEWER_ROLE, _VIEW_VERBS, "view"),
        ),
        "metrics_reader_role.yaml": (
            [
                "For whoever scrapes /metrics (Prometheus' ServiceAccount); bind it there.",
                "The operator serves /metrics only to bearer tokens whose user the API server",
                "allows `get` on this non-resource URL (TokenReview + SubjectAccessReview).",
            ],
            {
                "apiVersion": RBAC_API_VERSION,
                "kind": "ClusterRole",
                "metadata": {"name": names.METRICS_READER_ROLE},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
            },
        ),
    }
