"""RBAC items of `python -m agentforge check`: may the operator do what its code needs?

The rules are the ones the code declares (`agentforge.api.rbac.REGISTRY`, filled by
importing `agentforge.app`, exactly what `make manifests` renders into the
ClusterRole), so the check cannot drift from the operator. Each (verb, resource,
namespace) is one access review:

* `SubjectAccessReview` for a ServiceAccount: `--as-serviceaccount`, else the
  operator's own (`agent-forge-system/agent-forge-controller-manager`) when the
  caller may create SubjectAccessReviews;
* otherwise `SelfSubjectAccessReview`: the caller's own permissions, with a warning
  saying so.

Namespaces: ClusterRole rules are reviewed in the pool's namespace and its control
plane namespace (the operator's caches list and watch every kind in the namespaces
it serves); Secrets (the credentials-reader ClusterRole, bound per namespace) in the
credentials Secret's namespace only; and
cluster-scoped kinds (the TokenReviews and SubjectAccessReviews behind /metrics),
reviewed once without a namespace; leader-election rules in the ServiceAccount's
namespace. Results are cached, so
pools sharing namespaces cost no extra reviews.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

import agentforge.app  # noqa: F401 - imported for its modules' rbac.needs(...) declarations
from agentforge.api import names, rbac
from agentforge.api.pool import VsphereAgentPool
from agentforge.check.render import Item, Status
from agentforge.kube import errors
from agentforge.kube.client import KubeClient

__all__ = ["DEFAULT_SERVICE_ACCOUNT", "Reviewer", "Subject"]

DEFAULT_SERVICE_ACCOUNT: Final = f"{names.DEPLOYMENT_NAMESPACE}/{names.SERVICE_ACCOUNT}"
_API: Final = "/apis/authorization.k8s.io/v1"
_CONCURRENCY: Final = 8

Access = tuple[str, str, str, str]  # namespace, group, resource[/subresource], verb


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose permissions are reviewed: a ServiceAccount, or the caller (`account` None)."""

    account: tuple[str, str] | None

    @property
    def label(self) -> str:
        if self.account is None:
            return "you (the kubeconfig's identity)"
        return f"ServiceAccount {self.account[0]}/{self.account[1]}"


def _resource_label(group: str, resource: str) -> str:
    plural, _, sub = resource.partition("/")
    name = f"{plural}.{group}" if group else plural
    return f"{name}/{sub}" if sub else name


class Reviewer:
    def __init__(self, client: KubeClient, subject: Subject | None, notes: list[Item]) -> None:
        self._client = client
        self.subject = subject
        self.notes = notes  # about whose permissions are (not) reviewed: shown with each pool
        self._cache: dict[Access, bool | str] = {}
        self._limit = asyncio.Semaphore(_CONCURRENCY)

    @classmethod
    async def create(cls, client: KubeClient, as_serviceaccount: str | None) -> Reviewer:
        """Decide whose permissions to review (see the module doc)."""
        may_review: bool | str
        try:
            may_review = await _self_review(
                client,
                {
                    "group": "authorization.k8s.io",
                    "resource": "subjectaccessreviews",
                    "verb": "create",
                },
            )
        except errors.KubeError as exc:
            may_review = str(exc)
        if as_serviceaccount:
            namespace, _, name = as_serviceaccount.partition("/")
            if may_review is True:
                return cls(client, Subject((namespace, name)), [])
            why = "you may not create SubjectAccessReviews" if may_review is False else may_review
            note = Item(
                "rbac",
                Status.FAIL,
                f"ServiceAccount {as_serviceaccount}",
                f"permissions not reviewed: {why}",
                "run the check as a user who may create subjectaccessreviews",
            )
            return cls(client, None, [note])
        if isinstance(may_review, str):
            note = Item(
                "rbac",
                Status.FAIL,
                "RBAC",
                f"not reviewed: {may_review}",
                "check the API server and run the check again",
            )
            return cls(client, None, [note])
        if may_review is True:
            namespace, _, name = DEFAULT_SERVICE_ACCOUNT.partition("/")
            return cls(client, Subject((namespace, name)), [])
        note = Item(
            "rbac",
            Status.WARN,
            "RBAC",
            "reviewing your own permissions, not the operator's: you may not create "
            "SubjectAccessReviews",
            "run as a user who may, or pass --as-serviceaccount",
        )
        return cls(client, Subject(None), [note])

    def accesses(self, pool: VsphereAgentPool) -> dict[str, list[Access]]:
        """What to review, by the fix that grants it ("cluster", "leader-election" or
        "credentials")."""
        namespaces = sorted({pool.metadata.namespace, pool.spec.control_plane_namespace})
        secret_ns = pool.credentials_secret_namespace()
        wanted: dict[str, set[Access]] = defaultdict(set)
        for need in rbac.REGISTRY.declared:
            if need.scope is rbac.Scope.LEADER_ELECTION:
                account = self.subject.account if self.subject else None
                scoped = [account[0] if account else names.DEPLOYMENT_NAMESPACE]
            elif need.scope is rbac.Scope.CREDENTIALS:
                scoped = [secret_ns]
            elif not need.namespaced:
                scoped = [""]  # cluster-scoped: one review, no namespace
            else:
                scoped = namespaces
            for namespace in scoped:
                for verb in need.verbs:
                    wanted[need.scope.value].add((namespace, need.group, need.resource, verb))
        return {scope: sorted(accesses) for scope, accesses in wanted.items()}

    async def review(self, pool: VsphereAgentPool) -> list[Item]:
        items = list(self.notes)
        if self.subject is None:
            return items
        for scope, accesses in sorted(self.accesses(pool).items()):
            answers = await asyncio.gather(*(self._allowed(a) for a in accesses))
            by_namespace: dict[str, list[tuple[Access, bool | str]]] = defaultdict(list)
            for access, answer in zip(accesses, answers, strict=True):
                by_namespace[access[0]].append((access, answer))
            for namespace, results in sorted(by_namespace.items()):
                items.append(self._item(scope, namespace, results))
        return items

    def _item(self, scope: str, namespace: str, results: list[tuple[Access, bool | str]]) -> Item:
        assert self.subject is not None
        what = {
            rbac.Scope.LEADER_ELECTION.value: "leader election",
            rbac.Scope.CREDENTIALS.value: "reading credentials",
        }.get(scope, "reconciling")
        where = f"in namespace {namespace}" if namespace else "cluster-wide"
        subject = f"RBAC of {self.subject.label} for {what} {where}"
        errors_seen = sorted({a for _, a in results if isinstance(a, str)})
        if errors_seen:
            return Item(
                "rbac",
                Status.FAIL,
                subject,
                f"could not be reviewed: {errors_seen[0]}",
                "check the API server and run the check again",
            )
        denied: dict[str, list[str]] = defaultdict(list)
        for (_, group, resource, verb), allowed in results:
            if allowed is not True:
                denied[_resource_label(group, resource)].append(verb)
        if not denied:
            count = f"{len(results)} permission{'s' if len(results) != 1 else ''}"
            return Item("rbac", Status.PASS, subject, f"all {count} granted")
        missing = "; ".join(f"{r} [{', '.join(sorted(v))}]" for r, v in sorted(denied.items()))
        return Item("rbac", Status.FAIL, subject, f"denied: {missing}", self._fix(scope, namespace))

    def _fix(self, scope: str, namespace: str) -> str:
        account = self.subject.account if self.subject else None
        if account is None:
            return f"ask a cluster administrator for the rules of {names.MANAGER_ROLE}"
        sa = f"{account[0]}:{account[1]}"
        if scope == rbac.Scope.LEADER_ELECTION.value:
            return (
                f"kubectl -n {namespace} create rolebinding agent-forge-leader-election "
                f"--role={names.LEADER_ELECTION_ROLE} --serviceaccount={sa} "
                "(the Role is in config/rbac/leader_election_role.yaml)"
            )
        if scope == rbac.Scope.CREDENTIALS.value:
            return (
                f"kubectl -n {namespace} create rolebinding {names.CREDENTIALS_READER_ROLE} "
                f"--clusterrole={names.CREDENTIALS_READER_ROLE} --serviceaccount={sa}, and list "
                f"{namespace} in the operator's --credential-namespace "
                "(docs/installation.md#credentials-namespaces)"
            )
        return (
            f"kubectl create clusterrolebinding agent-forge-manager "
            f"--clusterrole={names.MANAGER_ROLE} --serviceaccount={sa} "
            "(the ClusterRole is in config/rbac/role.yaml)"
        )

    async def _allowed(self, access: Access) -> bool | str:
        cached = self._cache.get(access)
        if cached is not None:
            return cached
        namespace, group, resource, verb = access
        plural, _, sub = resource.partition("/")
        attributes = {"namespace": namespace, "group": group, "resource": plural, "verb": verb}
        if sub:
            attributes["subresource"] = sub
        async with self._limit:
            try:
                if self.subject is None or self.subject.account is None:
                    answer: bool | str = await _self_review(self._client, attributes)
                else:
                    answer = await _review(self._client, self.subject.account, attributes)
            except errors.KubeError as exc:
                answer = str(exc)
        self._cache[access] = answer
        return answer


async def _self_review(client: KubeClient, attributes: dict[str, str]) -> bool:
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = await client.request(
        "POST",
        f"{_API}/selfsubjectaccessreviews",
        verb="create",
        resource="selfsubjectaccessreviews.authorization.k8s.io",
        body=body,
    )
    return _allowed_in(answer)


async def _review(client: KubeClient, account: tuple[str, str], attributes: dict[str, str]) -> bool:
    namespace, name = account
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{name}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    answer = await client.request(
        "POST",
        f"{_API}/subjectaccessreviews",
        verb="create",
        resource="subjectaccessreviews.authorization.k8s.io",
        body=body,
    )
    return _allowed_in(answer)


def _allowed_in(answer: dict[str, Any]) -> bool:
    return bool((answer.get("status") or {}).get("allowed"))
