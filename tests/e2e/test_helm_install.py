"""`helm install charts/agent-forge`, then the operator runs as the identity the chart made.

Helm (`.build/bin/helm`, built from helm.sh/helm/v4) installs the chart into a private
control plane that holds only the external CRDs (HyperShift, CAPI, Assisted Installer):
our CRDs come from the chart's crds/, the ServiceAccount and RBAC from its templates.
The control plane runs no kubelet and no kube-controller-manager, so the chart's
Deployment never starts a pod; instead the test mints a token for the chart's
ServiceAccount with the TokenRequest API (what the kubelet would mount) and runs the
real operator process with it and with the flags of the chart's Deployment. A NodePool
of one replica must then get its VM: the ClusterRole the chart installed lets the
operator see the demand, create the VsphereAgent and write its status, and the
RoleBindings it generated for the watched namespaces let it read the pool's credentials.

The release namespace is not `agent-forge-system`, and the chart's monitoring is on
(the Prometheus Operator's CRDs are installed, but no Prometheus Operator runs): the
test evaluates the ServiceMonitor as the Prometheus Operator would, against the
Services the API server holds, and scrapes the operator with what it names (the path,
the scheme, the TLS settings and the token of the Prometheus identity the chart binds).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentforge.api import names
from sim.controlplane import ControlPlane, identities
from sim.metrics_reader import servicemonitor_targets
from sim.operator import OperatorProcess
from sim.paths import EXTERNAL_CRDS_DIR, MONITORING_CRDS_DIR, REPO_ROOT, binary
from sim.vcsim import Vcsim
from sim.world import World
from tests.e2e.support import E2E_TIMINGS, destroy_vms, eventually, wait_converged

CHART = REPO_ROOT / "charts" / "agent-forge"
RELEASE_NAMESPACE = "platform-operators"
POOL_NAMESPACE = "helm-pools"
CONTROL_PLANE_NAMESPACE = f"clusters-{POOL_NAMESPACE}"
POOL = "workers"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The external CRDs (and the Prometheus Operator's) only: ours must come from the chart."""
    control_plane = ControlPlane(
        workdir=tmp_path_factory.mktemp("helm-cp"),
        crd_paths=[EXTERNAL_CRDS_DIR, MONITORING_CRDS_DIR],
    )
    control_plane.start()
    try:
        yield control_plane
    finally:
        control_plane.stop()


def helm(cluster: ControlPlane, *args: str) -> str:
    result = subprocess.run(
        [str(binary("helm")), *args],
        env={**os.environ, "KUBECONFIG": str(cluster.admin_kubeconfig)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _get(cluster: ControlPlane, path: str) -> dict[str, Any]:
    body: dict[str, Any] = cluster.direct_client().get(path).body
    return body


@pytest.fixture(scope="module")
def installed(cluster: ControlPlane) -> dict[str, Any]:
    """The chart installed for the pool's two namespaces, with monitoring; its Deployment
    as the API has it. The namespaces exist first: the chart binds the credentials reader
    in each."""
    for namespace in (POOL_NAMESPACE, CONTROL_PLANE_NAMESPACE):
        cluster.create_namespace(namespace)
    helm(
        cluster,
        "install",
        "agent-forge",
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--set",
        "image.repository=registry.example.com/agent-forge",
        "--set",
        f"namespaces={{{POOL_NAMESPACE},{CONTROL_PLANE_NAMESPACE}}}",
        "--set",
        "monitoring.enabled=true",
    )
    return _get(
        cluster,
        f"/apis/apps/v1/namespaces/{RELEASE_NAMESPACE}/deployments/agent-forge-controller-manager",
    )


def test_helm_installed_the_crds_rbac_and_deployment_into_the_release_namespace(
    cluster: ControlPlane, installed: dict[str, Any]
) -> None:
    status = helm(cluster, "status", "agent-forge", "--namespace", RELEASE_NAMESPACE)
    assert "STATUS: deployed" in status
    for plural in ("vsphereagentpools", "vsphereagents"):
        crd = _get(
            cluster,
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{names.GROUP}",
        )
        assert crd["metadata"]["name"] == f"{plural}.{names.GROUP}"
    binding = _get(
        cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/agent-forge-manager-rolebinding",
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": names.SERVICE_ACCOUNT, "namespace": RELEASE_NAMESPACE}
    ]
    assert binding["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    manager_role = _get(
        cluster, "/apis/rbac.authorization.k8s.io/v1/clusterroles/agent-forge-manager-role"
    )
    assert not [r for r in manager_role["rules"] if "secrets" in r["resources"]]
    for namespace in (POOL_NAMESPACE, CONTROL_PLANE_NAMESPACE):  # the watched ones
        reader = _get(
            cluster,
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/"
            f"{names.CREDENTIALS_READER_ROLE}",
        )
        assert reader["roleRef"]["name"] == names.CREDENTIALS_READER_ROLE
        assert reader["subjects"] == binding["subjects"]
    (manager,) = installed["spec"]["template"]["spec"]["containers"]
    assert manager["image"].startswith("registry.example.com/agent-forge:")
    assert f"--namespace={POOL_NAMESPACE}" in manager["args"]


def _operator_args(deployment: dict[str, Any]) -> list[str]:
    """The chart's flags, except where to listen (the harness binds to 127.0.0.1:0) and
    with the Lease in the release namespace (a pod reads that from its token mount)."""
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [a for a in manager["args"] if "-bind-address=" not in a]
    return [*args, "--leader-election-namespace", RELEASE_NAMESPACE]


@pytest.fixture
async def operator(
    cluster: ControlPlane, installed: dict[str, Any], tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    # The token the kubelet would mount: TokenRequest for the chart's ServiceAccount
    # (it exists: Helm created it; this only asks for a token).
    kubeconfig = cluster.serviceaccount_kubeconfig(RELEASE_NAMESPACE, names.SERVICE_ACCOUNT)
    process = OperatorProcess(
        kubeconfig, *_operator_args(installed), log_path=tmp_path / "operator.log"
    )
    process.start()
    try:
        await process.wait_ready(within=60)
        await process.wait_log("became leader", within=60)
        yield process
    finally:
        await process.stop()


def _named_port(container: dict[str, Any], target: str | int) -> int:
    """The container port a Service's `targetPort` (a name or a number) means."""
    for port in container["ports"]:
        if target in (port.get("name"), port["containerPort"]):
            return int(port["containerPort"])
    raise AssertionError(f"no port {target!r} in the {container['name']} container")


async def test_the_charts_servicemonitor_scrapes_the_operator_outside_agent_forge_system(
    cluster: ControlPlane, installed: dict[str, Any], operator: OperatorProcess
) -> None:
    assert RELEASE_NAMESPACE != names.DEPLOYMENT_NAMESPACE
    (monitor,) = _get(
        cluster, f"/apis/monitoring.coreos.com/v1/namespaces/{RELEASE_NAMESPACE}/servicemonitors"
    )["items"]
    # What the Prometheus Operator would select among every Service in the cluster.
    services = _get(cluster, "/api/v1/services")["items"]
    ((service, endpoint),) = servicemonitor_targets(monitor, services)
    assert service["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert service["metadata"]["name"] == "agent-forge-controller-manager-metrics-service"
    # Its endpoints are the Deployment's pods, on the port the operator serves /metrics.
    pod = installed["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (manager,) = pod["spec"]["containers"]
    bound = _named_port(manager, port["targetPort"])
    assert f"--metrics-bind-address=:{bound}" in manager["args"]

    # The scrape, as the endpoint says: the harness binds the operator to 127.0.0.1:0
    # instead of the pod's port; the scheme and the path are the endpoint's.
    await operator.wait_serving()
    assert endpoint["scheme"] == operator.metrics_scheme == "https"
    assert operator.metrics_url.endswith(endpoint["path"])
    # The operator serves a certificate generated at start, which the endpoint says not
    # to verify (docs/operations.md, "Metrics"); `get_metrics` does not verify it either.
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # Prometheus scrapes with its own projected, expiring ServiceAccount token (no token
    # Secret ships); the chart binds the metrics reader to that ServiceAccount. The
    # token the kubelet would project into Prometheus' pod comes from TokenRequest.
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert "authorization" not in endpoint
    binding = _get(
        cluster, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/agent-forge-metrics-reader"
    )
    assert binding["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    (prometheus,) = binding["subjects"]
    assert prometheus["kind"] == "ServiceAccount"
    token = identities.serviceaccount_token(
        cluster.direct_client(), namespace=prometheus["namespace"], name=prometheus["name"]
    )
    status, body = await operator.get_metrics(token=token)
    assert status == 200, body
    assert "agent_forge_build_info{" in body
    assert (await operator.get_metrics(token=None))[0] == 401


async def test_operator_with_the_charts_identity_creates_a_vm_for_a_waiting_agent_machine(
    cluster: ControlPlane, vcsim: Vcsim, operator: OperatorProcess
) -> None:
    async with World(
        controlplane=cluster,
        vcsim=vcsim,
        namespace=POOL_NAMESPACE,
        control_plane_namespace=CONTROL_PLANE_NAMESPACE,
        timings=E2E_TIMINGS,
        iso_size=1024 * 1024,
    ) as world:
        try:
            await world.create_infraenv()
            await world.create_credentials()
            await world.create_pool(POOL, folder=f"e2e/{POOL_NAMESPACE}")
            await world.nodepool(POOL).scale(1)
            snap = await eventually(
                world.snapshot,
                lambda s: len(s.vms_of_pool(POOL)) == 1 and len(s.vsphere_agents) == 1,
                within=120,
                what="one VM and its VsphereAgent for the waiting AgentMachine",
            )
            (agent,) = snap.vsphere_agents
            assert agent["spec"]["poolRef"]["name"] == POOL
            # Bound first: a VM whose AgentMachine goes before it has an Agent is kept
            # as a spare for a replacement (docs/operations.md, hand-over) for minutes.
            await wait_converged(world, pool=POOL, nodepool=POOL, replicas=1)
            await world.nodepool(POOL).scale(0)
            await eventually(
                world.snapshot,
                lambda s: not s.vms_of_pool(POOL) and not s.vsphere_agents,
                within=120,
                what="the VM and its VsphereAgent gone after scaling to 0",
            )
        finally:
            leftovers = (await world.snapshot()).vms
    await destroy_vms(vcsim, leftovers)
    world.check()
    log = operator.log_text()
    assert "forbidden" not in log.lower(), "the chart's RBAC let the operator do its job"
    assert vcsim.password not in log, "the operator logged a password"
