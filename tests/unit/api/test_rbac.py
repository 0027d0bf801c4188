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
