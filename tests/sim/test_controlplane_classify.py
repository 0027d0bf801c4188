"""The proxy names requests with the apiserver's words (pure unit tests, no processes)."""

from __future__ import annotations

import pytest

from sim.controlplane.proxy.classify import classify

G = "agent-forge.containeroo.ch"


@pytest.mark.parametrize(
    ("method", "path", "query", "verb", "resource", "namespace", "name"),
    [
        ("GET", "/api/v1/namespaces/ns/configmaps", {}, "list", "configmaps", "ns", ""),
        ("GET", "/api/v1/namespaces/ns/configmaps/a", {}, "get", "configmaps", "ns", "a"),
        ("GET", "/api/v1/configmaps", {}, "list", "configmaps", "", ""),
        ("POST", "/api/v1/namespaces/ns/configmaps", {}, "create", "configmaps", "ns", ""),
        ("PUT", "/api/v1/namespaces/ns/configmaps/a", {}, "update", "configmaps", "ns", "a"),
        ("PATCH", "/api/v1/namespaces/ns/configmaps/a", {}, "patch", "configmaps", "ns", "a"),
        ("DELETE", "/api/v1/namespaces/ns/configmaps/a", {}, "delete", "configmaps", "ns", "a"),
        (
            "DELETE",
            "/api/v1/namespaces/ns/configmaps",
            {},
            "deletecollection",
            "configmaps",
            "ns",
            "",
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/configmaps",
            {"watch": "true"},
            "watch",
            "configmaps",
            "ns",
            "",
        ),
        ("GET", "/api/v1/configmaps", {"watch": "1"}, "watch", "configmaps", "", ""),
        ("GET", "/api/v1/configmaps", {"watch": "false"}, "list", "configmaps", "", ""),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, "watch", "pods", "ns", ""),
        (
            "PATCH",
            f"/apis/{G}/v1alpha1/namespaces/ns/vsphereagents/x/status",
            {},
            "patch",
            f"vsphereagents.{G}/status",
            "ns",
            "x",
        ),
        (
            "GET",
            f"/apis/{G}/v1alpha1/vsphereagentpools",
            {"watch": "true"},
            "watch",
            f"vsphereagentpools.{G}",
            "",
            "",
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
            {},
            "update",
            "leases.coordination.k8s.io",
            "ns",
            "l",
        ),
        ("GET", "/api/v1/namespaces", {}, "list", "namespaces", "", ""),
        ("GET", "/api/v1/namespaces/ns", {}, "get", "namespaces", "", "ns"),
        ("PUT", "/api/v1/namespaces/ns/finalize", {}, "update", "namespaces/finalize", "", "ns"),
        ("GET", "/api/v1/namespaces/ns/status", {}, "get", "namespaces/status", "", "ns"),
        (
            "POST",
            "/api/v1/namespaces/ns/serviceaccounts/sa/token",
            {},
            "create",
            "serviceaccounts/token",
            "ns",
            "sa",
        ),
    ],
)
def test_resource_requests_are_named_like_the_apiserver_names_them(
    method: str,
    path: str,
    query: dict[str, str],
    verb: str,
    resource: str,
    namespace: str,
    name: str,
) -> None:
    info = classify(method, path, query)
    assert (info.verb, info.resource, info.namespace, info.name) == (
        verb,
        resource,
        namespace,
        name,
    )
    assert info.is_resource_request


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/version"),
        ("GET", "/healthz"),
        ("GET", "/api"),
        ("GET", "/api/v1"),
        ("GET", "/apis"),
        ("GET", f"/apis/{G}/v1alpha1"),
        ("GET", "/openapi/v3"),
    ],
)
def test_non_resource_urls_count_under_their_path_and_lowercase_method(
    method: str, path: str
) -> None:
    info = classify(method, path, {})
    assert (info.verb, info.resource, info.namespace) == ("get", path, "")
    assert not info.is_resource_request
