"""`make install / deploy / undeploy / uninstall` against a real API server of its own.

docs/installation.md tells users to run these targets against their cluster; here
they run (as `python -m scripts.deploy`, which is what the targets call) against a
private control plane, so deleting CRDs and RBAC cannot disturb the session's shared
one. The API server is the judge of the manifests: it validates every object,
including the CEL rules of our CRDs on the samples, and its PodSecurity admission
checks the Deployment's pod template against the "restricted" standard.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agentforge.api import names
from scripts.deploy import rendered
from sim.controlplane import ControlPlane
from sim.controlplane.rest import RestClient
from sim.paths import REPO_ROOT

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


def deploy_cli(cluster: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.deploy",
            *args,
            "--kubeconfig",
            str(cluster.admin_kubeconfig),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


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


def test_make_targets_call_the_deploy_helper() -> None:
    dry = subprocess.run(
        ["make", "-n", "install", "deploy", "undeploy", "uninstall", f"IMG={IMAGE}", "FORCE=1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in (
        "-m scripts.deploy install",
        f"-m scripts.deploy deploy --image {IMAGE}",
        "-m scripts.deploy undeploy",
        "-m scripts.deploy uninstall  --force",
    ):
        assert line in dry


def test_install_then_deploy_creates_every_object_of_the_default_overlay(
    cluster: ControlPlane,
) -> None:
    api = cluster.direct_client()
    ok(deploy_cli(cluster, "install"))
    crds = rendered(CONFIG / "crd")
    for crd in crds:
        status = api.get(path_of(api, crd)).body["status"]
        established = [c for c in status["conditions"] if c["type"] == "Established"]
        assert established[0]["status"] == "True"

    out = ok(deploy_cli(cluster, "deploy", "--image", IMAGE))
    objects = rendered(CONFIG / "default", image=IMAGE)
    assert len(objects) == out.count("applied ")
    missing = [f"{o['kind']} {o['metadata']['name']}" for o in objects if not exists(api, o)]
    assert missing == []
    deployment = api.get(
        f"/apis/apps/v1/namespaces/{names.DEPLOYMENT_NAMESPACE}/deployments/"
        "agent-forge-controller-manager"
    ).body
    assert [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]] == [IMAGE]

    ok(deploy_cli(cluster, "deploy", "--image", IMAGE))  # applying again changes nothing


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
    ok(deploy_cli(cluster, "deploy", "--image", IMAGE))
    api = cluster.direct_client()
    deployment = next(o for o in rendered(CONFIG / "default") if o["kind"] == "Deployment")
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
    ok(deploy_cli(cluster, "install"))
    api = cluster.direct_client()
    samples = rendered(CONFIG / "samples")
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
    ok(deploy_cli(cluster, "deploy", "--image", IMAGE))
    ok(deploy_cli(cluster, "undeploy"))
    objects = rendered(CONFIG / "default")
    left = [o["kind"] for o in objects if o["kind"] != "Namespace" and exists(api, o)]
    assert left == ["CustomResourceDefinition", "CustomResourceDefinition"]

    pool = next(o for o in rendered(CONFIG / "samples") if o["kind"] == "VsphereAgentPool")
    cluster.create_namespace(pool["metadata"]["namespace"])
    api.request(
        "PATCH",
        path_of(api, pool) + "?fieldManager=test",
        body=pool,
        content_type="application/apply-patch+yaml",
    )
    refused = deploy_cli(cluster, "uninstall")
    assert refused.returncode == 1
    assert "1 VsphereAgentPool(s) still exist" in refused.stderr
    assert all(exists(api, crd) for crd in rendered(CONFIG / "crd"))

    ok(deploy_cli(cluster, "uninstall", "--force"))
    for crd in rendered(CONFIG / "crd"):
        gone = api.request("GET", path_of(api, crd), expect=(200, 404))
        # Deletion is immediate, or waits for the API server to remove the CRD's objects.
        assert gone.status == 404 or gone.body["metadata"].get("deletionTimestamp")


def test_render_prints_the_manifests_deploy_applies() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scripts.deploy", "render", "config/default", "--image", IMAGE],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    printed = [o for o in yaml.safe_load_all(out) if o]
    assert printed == rendered(CONFIG / "default", image=IMAGE)
