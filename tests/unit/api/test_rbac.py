"""RBAC rendering: declarations merge like controller-gen's and render deterministically."""

from __future__ import annotations

import pytest

from agentforge.api import kinds, names, rbac


def declare(registry: rbac.Registry) -> None:
    registry.needs(kinds.AGENT, "get", "list", "watch", why="read Agents")
    registry.needs(kinds.AGENT, "patch", "delete", why="prepare and clean up Agents")
    registry.needs(kinds.INFRA_ENV, "get", "list", "watch", why="read the discovery ISO URL")
    registry.needs(kinds.VSPHERE_AGENT_POOL, "get", "list", "watch", "patch", why="pools")
    registry.needs(kinds.VSPHERE_AGENT, "get", "list", "watch", "patch", why="VsphereAgents")
    registry.needs(kinds.VSPHERE_AGENT, "create", "delete", why="one per AgentMachine")
    registry.needs(kinds.VSPHERE_AGENT_POOL, "update", "patch", subresource="status", why="s")
    registry.needs(kinds.VSPHERE_AGENT, "update", "patch", subresource="status", why="s")
    registry.needs(kinds.SECRET, "get", why="vSphere credentials")
    registry.needs(kinds.EVENT, "create", "patch", why="events")
    registry.needs(
        kinds.LEASE, "get", "create", "update", scope=rbac.Scope.LEADER_ELECTION, why="lease"
    )


def test_verbs_of_one_resource_merge_and_same_verb_resources_share_a_rule() -> None:
    registry = rbac.Registry()
    declare(registry)
    assert registry.rules(rbac.Scope.CLUSTER) == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {
            "apiGroups": ["agent-forge.containeroo.ch"],
            "resources": ["vsphereagentpools"],
            "verbs": ["get", "list", "patch", "watch"],
        },
        {
            "apiGroups": ["agent-forge.containeroo.ch"],
            "resources": ["vsphereagentpools/status", "vsphereagents/status"],
            "verbs": ["patch", "update"],
        },
        {
            "apiGroups": ["agent-forge.containeroo.ch"],
            "resources": ["vsphereagents"],
            "verbs": ["create", "delete", "get", "list", "patch", "watch"],
        },
        {
            "apiGroups": ["agent-install.openshift.io"],
            "resources": ["agents"],
            "verbs": ["delete", "get", "list", "patch", "watch"],
        },
        {
            "apiGroups": ["agent-install.openshift.io"],
            "resources": ["infraenvs"],
            "verbs": ["get", "list", "watch"],
        },
    ]


def test_leader_election_needs_go_to_a_namespaced_role_only() -> None:
    registry = rbac.Registry()
    declare(registry)
    assert registry.rules(rbac.Scope.LEADER_ELECTION) == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "get", "update"],
        }
    ]
    role = rbac.render(registry)["leader_election_role.yaml"][1]
    assert role["kind"] == "Role"
    assert role["metadata"] == {
        "name": names.LEADER_ELECTION_ROLE,
        "namespace": names.DEPLOYMENT_NAMESPACE,
    }


def test_rendering_does_not_depend_on_declaration_order() -> None:
    forward, backward = rbac.Registry(), rbac.Registry()
    declare(forward)
    for need in reversed(forward.declared):
        backward.declared.append(need)
    assert rbac.render(forward) == rbac.render(backward)


def test_reasons_are_listed_for_the_rendered_role() -> None:
    registry = rbac.Registry()
    declare(registry)
    comments, _ = rbac.render(registry)["role.yaml"]
    assert "core/secrets [get]: vSphere credentials" in comments
    assert comments == sorted(comments)


def test_bindings_grant_the_roles_to_the_operator_service_account() -> None:
    rendered = rbac.render(rbac.Registry())
    subject = {
        "kind": "ServiceAccount",
        "name": names.SERVICE_ACCOUNT,
        "namespace": names.DEPLOYMENT_NAMESPACE,
    }
    cluster_binding = rendered["role_binding.yaml"][1]
    assert cluster_binding["roleRef"]["name"] == names.MANAGER_ROLE
    assert cluster_binding["subjects"] == [subject]
    assert rendered["leader_election_role_binding.yaml"][1]["subjects"] == [subject]
    assert rendered["service_account.yaml"][1]["metadata"]["name"] == names.SERVICE_ACCOUNT


def test_a_need_without_verbs_or_reason_is_refused() -> None:
    registry = rbac.Registry()
    with pytest.raises(ValueError, match="verbs"):
        registry.needs(kinds.AGENT, why="nothing")
    with pytest.raises(ValueError, match="verbs"):
        registry.needs(kinds.AGENT, "escalate", why="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="why"):
        registry.needs(kinds.AGENT, "get", why=" ")


def test_secrets_go_to_the_credentials_reader_which_no_file_binds_cluster_wide() -> None:
    registry = rbac.Registry()
    registry.needs(kinds.EVENT, "create", why="events")
    registry.needs(kinds.SECRET, "get", scope=rbac.Scope.CREDENTIALS, why="credentials")
    rendered = rbac.render(registry)
    assert registry.rules(rbac.Scope.CLUSTER) == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    ]
    comments, reader = rendered["credentials_reader_role.yaml"]
    assert reader["kind"] == "ClusterRole"
    assert reader["metadata"] == {"name": names.CREDENTIALS_READER_ROLE}
    assert reader["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert "core/secrets [get]: credentials" in comments
    bound = {
        obj["roleRef"]["name"] for _, obj in rendered.values() if obj["kind"].endswith("Binding")
    }
    assert names.CREDENTIALS_READER_ROLE not in bound


def test_the_application_reads_secrets_only_through_the_credentials_scope() -> None:
    import agentforge.app  # noqa: F401, PLC0415 - its modules declare their needs on import

    secrets = [n for n in rbac.REGISTRY.declared if n.resource == kinds.SECRET.plural]
    assert secrets
    assert {(n.scope, n.verbs) for n in secrets} == {(rbac.Scope.CREDENTIALS, frozenset({"get"}))}


def test_a_credentials_binding_grants_the_reader_in_its_namespace_to_the_operator() -> None:
    binding = rbac.credentials_binding("tenant-a", operator_namespace="platform")
    assert binding["kind"] == "RoleBinding"
    assert binding["metadata"] == {"name": names.CREDENTIALS_READER_ROLE, "namespace": "tenant-a"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": names.CREDENTIALS_READER_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": names.SERVICE_ACCOUNT, "namespace": "platform"}
    ]


def test_tenant_roles_aggregate_to_edit_and_view_without_any_status_subresource() -> None:
    rendered = rbac.render(rbac.Registry())
    editor = rendered["pool_editor_role.yaml"][1]
    viewer = rendered["pool_viewer_role.yaml"][1]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert editor["metadata"]["name"] == names.POOL_EDITOR_ROLE
    assert editor["metadata"]["labels"] == {f"{aggregate}edit": "true", f"{aggregate}admin": "true"}
    assert viewer["metadata"]["name"] == names.POOL_VIEWER_ROLE
    assert viewer["metadata"]["labels"] == {f"{aggregate}view": "true"}
    for role in (editor, viewer):
        (rule,) = role["rules"]
        assert rule["apiGroups"] == [names.GROUP]
        assert rule["resources"] == ["vsphereagentpools", "vsphereagents"]
    assert "create" in editor["rules"][0]["verbs"]
    assert viewer["rules"][0]["verbs"] == ["get", "list", "watch"]
