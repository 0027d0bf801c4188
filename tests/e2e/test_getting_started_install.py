"""`make install / deploy / undeploy / uninstall / render`, run literally, against an API server.

docs/installation.md tells users to run these targets against their cluster; here they
run as written (`make deploy IMG=...` with `KUBECONFIG` set and kubectl on PATH, the one
`make controlplane` builds) against a private control plane, so deleting CRDs and RBAC
cannot disturb the session's shared one. The targets are kubectl's server-side apply of
config/ (`apply -k --server-side`), as kubebuilder projects do. The API server is the
judge of the manifests: it validates every object, including the CEL rules of our CRDs
on the samples, and its PodSecurity admission checks the Deployment's pod template
against the "restricted" standard.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agentforge.api import names
from scripts import kustomize
from sim.controlplane import ControlPlane
from sim.controlplane.processes import wait_for
from sim.controlplane.rest import RestClient
from sim.paths import REPO_ROOT, binary

CONFIG = REPO_ROOT / "config"
IMAGE = "registry.example.com/agent-forge:v1.2.3"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """An empty cluster: none of our CRDs, nothing of the operator."""
    control_plane = ControlPlane(workdir=tmp_path_factory.mktemp("install-cp"), crd_paths=[])
    control_plane.start()
    try:
        yield control_plane
    finally:
        control_plane.stop()


def make(cluster: ControlPlane | None, *args: str) -> subprocess.CompletedProcess[str]:
    """`make ARGS` as a user runs it: KUBECONFIG set, kubectl on PATH."""
    kubectl = binary("kubectl")  # fails with the make target that builds it
    env = {**os.environ, "PATH": f"{kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("KUBECTL", None)
    if cluster is not None:
        env["KUBECONFIG"] = str(cluster.admin_kubeconfig)
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def rendered(directory: str) -> list[dict[str, Any]]:
    return kustomize.build(CONFIG / directory)


def path_of(api: RestClient, obj: dict[str, Any]) -> str:
    api_version = obj["apiVersion"]
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    resources = api.get(base).body["resources"]
    resource = next(r for r in resources if r["kind"] == obj["kind"] and "/" not in r["name"])
    meta = obj["metadata"]
    where = f"/namespaces/{meta['namespace']}" if resource["namespaced"] else ""
    return f"{base}{where}/{resource['name']}/{meta['name']}"


def exists(api: RestClient, obj: dict[str, Any]) -> bool:
    status = api.request("GET", path_of(api, obj), expect=(200, 404)).status
    return status == 200


def established(api: RestClient, crd: dict[str, Any]) -> bool:
    status = api.get(path_of(api, crd)).body.get("status") or {}
    return any(
        c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or []
    )


def test_make_targets_are_kubectl_server_side_applies_of_config() -> None:
    dry = ok(
        make(None, "-n", "install", "deploy", "undeploy", "uninstall", f"IMG={IMAGE}", "FORCE=1")
    )
    apply = "kubectl apply --server-side --force-conflicts --field-manager=agent-forge-deploy"
    assert f"{apply} -k config/crd" in dry
    assert f"scripts/kustomize-overlay.sh config/default --image {IMAGE}" in dry
    assert "scripts/kustomize-overlay.sh config/default --without-crds" in dry
    assert "kubectl delete --ignore-not-found --wait=false -k config/crd" in dry
    assert "python" not in dry, "no virtualenv needed to deploy"


def test_install_then_deploy_creates_every_object_of_the_default_overlay(
    cluster: ControlPlane,
) -> None:
    api = cluster.direct_client()
    ok(make(cluster, "install"))
    for crd in rendered("crd"):
        wait_for(
            functools.partial(established, api, crd),
            what=f"CRD {crd['metadata']['name']} to be Established",
            timeout=60,
        )

    cluster.create_namespace("vsphere-credentials")  # as docs/installation.md says, first
    credentials = "CREDENTIAL_NAMESPACES=vsphere-credentials"
    out = ok(make(cluster, "deploy", f"IMG={IMAGE}", credentials))
    rendering = ok(make(None, "render", f"IMG={IMAGE}", credentials))
    objects = [o for o in yaml.safe_load_all(rendering) if o]
    assert len(objects) == out.count("serverside-applied")
    missing = [f"{o['kind']} {o['metadata']['name']}" for o in objects if not exists(api, o)]
    assert missing == []
    deployment = api.get(
        f"/apis/apps/v1/namespaces/{names.DEPLOYMENT_NAMESPACE}/deployments/"
        "agent-forge-controller-manager"
    ).body
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["image"] == IMAGE
    assert {"name": "AGENT_FORGE_CREDENTIAL_NAMESPACE", "value": "vsphere-credentials"} in (
        manager["env"]
    )
    reader = api.get(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/vsphere-credentials/rolebindings/"
        f"{names.CREDENTIALS_READER_ROLE}"
    ).body
    assert reader["roleRef"]["name"] == names.CREDENTIALS_READER_ROLE
    managers = {m["manager"] for m in deployment["metadata"]["managedFields"]}
    assert "agent-forge-deploy" in managers

    ok(make(cluster, "deploy", f"IMG={IMAGE}", credentials))  # applying again changes nothing
    assert not list((REPO_ROOT / "config").rglob("*.orig")), "the checkout stays clean"


def _pod_from_template(template: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": names.DEPLOYMENT_NAMESPACE, **template["metadata"]},
        "spec": template["spec"],
    }


def test_deployment_pod_passes_the_apiservers_restricted_pod_security_admission(
    cluster: ControlPlane,
) -> None:
    ok(make(cluster, "deploy", f"IMG={IMAGE}"))
    api = cluster.direct_client()
    deployment = next(o for o in rendered("default") if o["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    pods = f"/api/v1/namespaces/{names.DEPLOYMENT_NAMESPACE}/pods?dryRun=All"

    accepted = api.request("POST", pods, body=_pod_from_template(template, "psa-check"))
    assert accepted.status == 201

    # The control: the same pod allowed to escalate privileges is refused, so the
    # admission above really ran with the namespace's "restricted" level.
    loose = _pod_from_template(yaml.safe_load(yaml.safe_dump(template)), "psa-control")
    loose["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = api.request("POST", pods, body=loose, expect=(403,))
    assert "restricted" in str(refused.body)


def test_samples_pass_the_apiservers_validation_including_crd_rules(cluster: ControlPlane) -> None:
    ok(make(cluster, "install"))
    api = cluster.direct_client()
    samples = rendered("samples")
    namespaces = {o["metadata"]["namespace"] for o in samples}
    for namespace in namespaces:
        cluster.create_namespace(namespace)
    for obj in samples:
        path = path_of(api, obj) + "?fieldManager=test&dryRun=All"
        response = api.request("PATCH", path, body=obj, content_type="application/apply-patch+yaml")
        assert response.status in (200, 201), response.body


def test_undeploy_keeps_the_crds_and_uninstall_refuses_while_pools_exist(
    cluster: ControlPlane,
) -> None:
    api = cluster.direct_client()
    ok(make(cluster, "deploy", f"IMG={IMAGE}"))
    out = ok(make(cluster, "undeploy"))
    assert "CRDs kept" in out
    objects = rendered("default")
    # The Namespace is Terminating: this control plane has no namespace controller.
    left = [o["kind"] for o in objects if o["kind"] != "Namespace" and exists(api, o)]
    assert left == ["CustomResourceDefinition", "CustomResourceDefinition"]

    pool = next(o for o in rendered("samples") if o["kind"] == "VsphereAgentPool")
    cluster.create_namespace(pool["metadata"]["namespace"])
    api.request(
        "PATCH",
        path_of(api, pool) + "?fieldManager=test",
        body=pool,
        content_type="application/apply-patch+yaml",
    )
    refused = make(cluster, "uninstall")
    assert refused.returncode != 0
    assert "1 VsphereAgentPool(s) and 0 VsphereAgent(s) still exist" in refused.stderr
    assert "make uninstall FORCE=1" in refused.stderr
    assert all(exists(api, crd) for crd in rendered("crd"))

    ok(make(cluster, "uninstall", "FORCE=1"))
    for crd in rendered("crd"):
        gone = api.request("GET", path_of(api, crd), expect=(200, 404))
        # Deletion is immediate, or waits for the API server to remove the CRD's objects.
        assert gone.status == 404 or gone.body["metadata"].get("deletionTimestamp")


def test_render_prints_the_manifests_deploy_applies() -> None:
    printed = [o for o in yaml.safe_load_all(ok(make(None, "render", f"IMG={IMAGE}"))) if o]
    expected = rendered("default")
    for obj in expected:
        for container in (
            obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            container["image"] = IMAGE
    assert printed == expected
