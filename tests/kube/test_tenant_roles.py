"""Tenant roles: a team with `edit` runs pools, and never writes status.

`config/rbac` ships `agent-forge-pool-editor` and `agent-forge-pool-viewer`, labelled to
aggregate into the built-in `edit`/`admin` and `view` roles. The API server is the judge:
its own `edit` ClusterRole (bootstrapped by kube-apiserver, with the aggregationRule
Kubernetes ships) must select our roles, and a user bound to `edit` in a namespace must
be able to create a VsphereAgentPool and a VsphereAgent there, and be refused writing
`vsphereagents/status` (the VM identity adoption trusts) and `vsphereagentpools/status`.

This control plane runs no kube-controller-manager, so no clusterrole-aggregation
controller fills `edit`'s rules. When they are missing, the test does what that
controller does, from the API server's own objects: the rules of every ClusterRole
`edit`'s selectors pick, recursively through aggregated roles such as `view`, into a
ClusterRole the user is bound to.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import kinds, names
from agentforge.kube import client, errors
from sim.cluster_config import cluster_config
from sim.controlplane import ControlPlane
from sim.controlplane.rest import RestClient
from sim.world import samples

RBAC = "/apis/rbac.authorization.k8s.io/v1"
CONFIG_RBAC = Path(__file__).resolve().parents[2] / "config" / "rbac"

Obj = dict[str, Any]


def _apply(api: RestClient, path: str, obj: Obj) -> None:
    api.request(
        "PATCH",
        f"{path}?fieldManager=agentforge-test&force=true",
        body=obj,
        content_type="application/apply-patch+yaml",
    )


def _selected(selectors: list[Obj], labels: dict[str, str]) -> bool:
    """Does any of an aggregationRule's selectors (matchLabels, as Kubernetes ships
    them) select an object with these labels?"""
    for selector in selectors:
        assert set(selector) <= {"matchLabels"}, f"unexpected selector {selector}"
        wanted = selector.get("matchLabels") or {}
        if all(labels.get(k) == v for k, v in wanted.items()):
            return True
    return False


def _aggregated_rules(role: Obj, every: list[Obj], seen: frozenset[str] = frozenset()) -> list[Obj]:
    """What the clusterrole-aggregation controller makes of `role`'s rules."""
    rule = role.get("aggregationRule")
    if not rule:
        return list(role.get("rules") or [])
    out: list[Obj] = []
    for other in every:
        name = other["metadata"]["name"]
        if name in seen or name == role["metadata"]["name"]:
            continue
        if _selected(rule["clusterRoleSelectors"], other["metadata"].get("labels") or {}):
            for r in _aggregated_rules(other, every, seen | {role["metadata"]["name"]}):
                if r not in out:
                    out.append(r)
    return out


def _grants(rules: list[Obj], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and verb in r.get("verbs", [])
        for r in rules
    )


@pytest.fixture
def edit_role(controlplane: ControlPlane) -> str:
    """The name of a ClusterRole holding what the built-in `edit` aggregates, with the
    shipped tenant roles applied: `edit` itself when an aggregation controller filled
    it, else its aggregation done here."""
    api = controlplane.direct_client()
    for file in ("pool_editor_role.yaml", "pool_viewer_role.yaml"):
        role = yaml.safe_load((CONFIG_RBAC / file).read_text())
        _apply(api, f"{RBAC}/clusterroles/{role['metadata']['name']}", role)
    edit = api.get(f"{RBAC}/clusterroles/edit").body
    assert edit.get("aggregationRule"), "the API server bootstraps `edit` as an aggregated role"
    if _grants(edit.get("rules") or [], names.GROUP, "vsphereagentpools", "create"):
        return "edit"  # a controller aggregates on this control plane
    every = api.get(f"{RBAC}/clusterroles").body["items"]
    rules = _aggregated_rules(edit, every)
    assert _grants(rules, "", "configmaps", "create"), "edit's own rules were aggregated"
    name = "agent-forge-test-edit"
    _apply(
        api,
        f"{RBAC}/clusterroles/{name}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
    )
    return name


def test_the_built_in_roles_select_the_shipped_tenant_roles(
    controlplane: ControlPlane, edit_role: str
) -> None:
    api = controlplane.direct_client()
    every = api.get(f"{RBAC}/clusterroles").body["items"]
    by_name = {r["metadata"]["name"]: r for r in every}
    for built_in, ours in (
        ("admin", names.POOL_EDITOR_ROLE),
        ("edit", names.POOL_EDITOR_ROLE),
        ("view", names.POOL_VIEWER_ROLE),
    ):
        selectors = by_name[built_in]["aggregationRule"]["clusterRoleSelectors"]
        assert _selected(selectors, by_name[ours]["metadata"]["labels"]), (built_in, ours)
    view = _aggregated_rules(by_name["view"], every)
    assert _grants(view, names.GROUP, "vsphereagents", "list")
    assert not _grants(view, names.GROUP, "vsphereagents", "create")
    for built_in in ("admin", "edit", "view"):
        rules = _aggregated_rules(by_name[built_in], every)
        for resource in ("vsphereagentpools/status", "vsphereagents/status"):
            assert not any(
                _grants(rules, names.GROUP, resource, verb) for verb in ("update", "patch")
            ), (built_in, resource)


async def test_a_user_with_edit_creates_a_pool_and_cannot_write_status(
    controlplane: ControlPlane, current_crds: None, namespace: str, edit_role: str
) -> None:
    api = controlplane.direct_client()
    user = f"tenant-{secrets.token_hex(3)}"
    _apply(
        api,
        f"{RBAC}/namespaces/{namespace}/rolebindings/{user}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": user, "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": edit_role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    cfg = await cluster_config(controlplane.user_kubeconfig(user))
    async with client.KubeClient(config=cfg, retry=client.RetryPolicy(attempts=1)) as tenant:
        pool = samples.pool_manifest(
            name="workers",
            namespace=namespace,
            control_plane_namespace="clusters-hc",
            hosted_cluster="hc",
            nodepool="workers",
            infraenv="infraenv",
            secret="vsphere-credentials",
            labels={"pool": "workers"},
        )
        created = await tenant.create(kinds.VSPHERE_AGENT_POOL, pool)
        agent = await tenant.create(
            kinds.VSPHERE_AGENT,
            {
                "apiVersion": kinds.VSPHERE_AGENT.api_version,
                "kind": kinds.VSPHERE_AGENT.kind,
                "metadata": {"name": "adopted", "namespace": namespace},
                "spec": {"poolRef": {"name": "workers"}},
            },
        )
        listed = await tenant.list(kinds.VSPHERE_AGENT_POOL, namespace=namespace)
        assert [p["metadata"]["name"] for p in listed.items] == ["workers"]
        forged = {**agent, "status": {"vm": {"name": "someone-elses-vm"}}}
        with pytest.raises(errors.Forbidden):
            await tenant.replace_status(kinds.VSPHERE_AGENT, forged)
        with pytest.raises(errors.Forbidden):
            await tenant.replace_status(kinds.VSPHERE_AGENT_POOL, {**created, "status": {}})
        with pytest.raises(errors.Forbidden):  # `edit` in one namespace, not another
            await tenant.create(
                kinds.VSPHERE_AGENT_POOL,
                {**pool, "metadata": {"name": "x", "namespace": "default"}},
            )
