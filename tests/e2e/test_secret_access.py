"""Secrets only where pools live: no install path lets the operator read a hosted
cluster's Secrets (docs/installation.md#credentials-namespaces, design 0004).

On a HyperShift management cluster the valuable Secrets have predictable names:
`clusters-<name>/admin-kubeconfig`, `<ns>/<name>-admin-kubeconfig`. For the RBAC of every
install path, as that path creates it, the API server's own authorizer is asked
(SubjectAccessReview, with the Secret's name) whether the operator's ServiceAccount
may `get` `clusters-x/admin-kubeconfig` and `x/x-admin-kubeconfig` (no), a Secret in
its credentials namespace (yes: the test would prove nothing if the operator could
read no Secret at all), and `list`/`watch` Secrets anywhere (no):

* `make deploy CREDENTIAL_NAMESPACES=...`: config/default through the Makefile's
  overlay, which adds a RoleBinding per credentials namespace;
* Helm watching all namespaces (`credentialNamespaces`), Helm with `namespaces`, and
  Helm with `namespaces` naming the hosted cluster's own namespaces but credentials
  kept apart (`credentialNamespaces`): `helm template` output, the RoleBindings the
  chart generates included;
* the OLM bundle under MultiNamespace and AllNamespaces: the CSV's
  `clusterPermissions` as a ClusterRole + ClusterRoleBinding, its `permissions` as
  OLM applies them (a Role + RoleBinding in the operator's and every target
  namespace, or lifted to a ClusterRole + ClusterRoleBinding under AllNamespaces),
  the bundle's plain ClusterRoles, and the documented RoleBinding.

The control plane is private: the install paths share fixed ClusterRole names, so
each mode's objects replace the previous mode's. Finally, the running operator
refuses a pool whose Secret lies outside its credentials namespaces, with a
condition naming the fix, and never asks the API server for that Secret.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import kinds, names, rbac
from scripts import bundle, kustomize
from sim.controlplane import ControlPlane
from sim.controlplane.rest import RestClient
from sim.operator import operator_identity
from sim.paths import REPO_ROOT, binary
from sim.world import World
from tests.e2e.support import OperatorHarness, eventually, pool_condition_is

CHART = REPO_ROOT / "charts" / "agent-forge"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CREDENTIALS = "vsphere-credentials"
"""A namespace of its own for credentials, as docs/installation.md recommends."""
HOSTED_SECRETS = (("clusters-x", "admin-kubeconfig"), ("x", "x-admin-kubeconfig"))
"""What a stolen token would read first on a HyperShift management cluster."""

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Mode:
    """One install path: where the operator runs, what it installs, where it may read."""

    operator_namespace: str
    objects: list[Obj]
    credentials: tuple[str, ...]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """RBAC only: no CRDs are needed to ask the authorizer."""
    control_plane = ControlPlane(workdir=tmp_path_factory.mktemp("secret-access-cp"), crd_paths=[])
    control_plane.start()
    try:
        yield control_plane
    finally:
        control_plane.stop()


# --- what each install path creates ----------------------------------------------------


def _rbac_of(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in RBAC_KINDS]


def _kustomize() -> Mode:
    """`make deploy CREDENTIAL_NAMESPACES=vsphere-credentials`: config/default through the
    overlay the Makefile writes."""
    made = subprocess.run(
        [
            str(REPO_ROOT / "scripts" / "kustomize-overlay.sh"),
            str(REPO_ROOT / "config" / "default"),
            "--credential-namespace",
            CREDENTIALS,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    overlay = Path(made.stdout.strip())
    try:
        objects = _rbac_of(kustomize.build(overlay))
    finally:
        shutil.rmtree(overlay)
    return Mode(names.DEPLOYMENT_NAMESPACE, objects, (CREDENTIALS,))


def _helm(namespace: str, *sets: str, credentials: tuple[str, ...]) -> Mode:
    result = subprocess.run(
        [str(binary("helm")), "template", "agent-forge", str(CHART), "--namespace", namespace]
        + [f"--set={s}" for s in sets],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr
    objects = _rbac_of([o for o in yaml.safe_load_all(result.stdout) if o])
    for o in objects:
        o["metadata"].pop("labels", None)
    return Mode(namespace, objects, credentials)


def _olm(namespace: str, targets: tuple[str, ...] | None) -> Mode:
    """What OLM creates from the bundle; `targets` None is AllNamespaces."""
    manifests = bundle.BUNDLE / "manifests"
    csv = yaml.safe_load((manifests / f"{bundle.PACKAGE}.clusterserviceversion.yaml").read_text())
    strategy = csv["spec"]["install"]["spec"]
    (cluster_permissions,) = strategy["clusterPermissions"]
    (permissions,) = strategy["permissions"]
    account = cluster_permissions["serviceAccountName"]
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]

    def grant(kind: str, role: str, rules: list[Obj], where: str | None) -> list[Obj]:
        meta: Obj = {"name": role} if where is None else {"name": role, "namespace": where}
        api = "rbac.authorization.k8s.io"
        return [
            {"apiVersion": f"{api}/v1", "kind": kind, "metadata": meta, "rules": rules},
            {
                "apiVersion": f"{api}/v1",
                "kind": f"{kind}Binding",
                "metadata": meta,
                "roleRef": {"apiGroup": api, "kind": kind, "name": role},
                "subjects": subject,
            },
        ]

    objects: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace},
        }
    ]
    objects += grant("ClusterRole", f"{namespace}-cluster", cluster_permissions["rules"], None)
    if targets is None:  # AllNamespaces: OLM lifts `permissions` to the cluster
        objects += grant("ClusterRole", f"{namespace}-lifted", permissions["rules"], None)
    else:
        for where in (namespace, *targets):
            objects += grant("Role", f"{namespace}-permissions", permissions["rules"], where)
    for path in sorted(manifests.glob("*_clusterrole.yaml")):
        objects.append(yaml.safe_load(path.read_text()))
    credentials = (targets[0],) if targets else (CREDENTIALS,)
    objects += [rbac.credentials_binding(ns, operator_namespace=namespace) for ns in credentials]
    return Mode(namespace, objects, credentials)


MODES: dict[str, Callable[[], Mode]] = {
    "make deploy": _kustomize,
    "helm all namespaces": lambda: _helm(
        "helm-all", f"credentialNamespaces={{{CREDENTIALS}}}", credentials=(CREDENTIALS,)
    ),
    "helm namespaces": lambda: _helm(
        "helm-ns",
        "namespaces={tenant-a,clusters-tenant-a}",
        credentials=("tenant-a", "clusters-tenant-a"),
    ),
    "helm namespaces of cluster x, credentials apart": lambda: _helm(
        "helm-x",
        "namespaces={x,clusters-x}",
        f"credentialNamespaces={{{CREDENTIALS}}}",
        credentials=(CREDENTIALS,),
    ),
    "olm MultiNamespace": lambda: _olm("olm-multi", ("tenant-a", "clusters-tenant-a")),
    "olm AllNamespaces": lambda: _olm("olm-all", None),
}


# --- asking the authorizer ---------------------------------------------------------------


def _path(obj: Obj) -> str:
    api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    where = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{base}{where}/{kind.lower()}s/{meta['name']}"


def install(api: RestClient, cluster: ControlPlane, mode: Mode) -> None:
    for namespace in {o["metadata"].get("namespace") for o in mode.objects} - {None}:
        cluster.create_namespace(str(namespace))
    for obj in mode.objects:
        api.request(
            "PATCH",
            _path(obj) + "?fieldManager=agentforge-e2e&force=true",
            body=obj,
            content_type="application/apply-patch+yaml",
        )


def may(api: RestClient, mode: Mode, verb: str, namespace: str, name: str = "") -> bool:
    """The API server's answer: may the mode's operator `verb` Secrets (`name`) there?"""
    attributes = {"namespace": namespace, "verb": verb, "version": "v1", "resource": "secrets"}
    if name:
        attributes["name"] = name
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": operator_identity(mode.operator_namespace),
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{mode.operator_namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    answer = api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", body).body
    return bool(answer["status"].get("allowed"))


@pytest.mark.parametrize("mode_name", list(MODES))
def test_no_install_path_lets_the_operator_read_a_hosted_clusters_secrets(
    cluster: ControlPlane, mode_name: str
) -> None:
    mode = MODES[mode_name]()
    api = cluster.direct_client()
    install(api, cluster, mode)
    readable = {
        (ns, name): may(api, mode, "get", ns, name)
        for ns, name in (*HOSTED_SECRETS, ("kube-system", "bootstrap-token-abcdef"))
    }
    assert readable == dict.fromkeys(readable, False), readable
    assert not may(api, mode, "get", ""), "get on Secrets in every namespace"
    for namespace in mode.credentials:
        assert may(api, mode, "get", namespace, "vsphere"), f"no get in {namespace}"
    listed = {
        (verb, ns): may(api, mode, verb, ns)
        for verb in ("list", "watch")
        for ns in ("", "clusters-x", *mode.credentials)
    }
    assert listed == dict.fromkeys(listed, False), listed


# --- the running operator -------------------------------------------------------------------


async def test_a_pool_naming_a_secret_outside_the_credentials_namespaces_is_refused_unread(
    world: World, operator: OperatorHarness, controlplane: ControlPlane
) -> None:
    """The operator watches the world's namespaces, so only their Secrets are credentials;
    a pool pointing at a hosted cluster's kubeconfig is refused with the fix, and the
    operator does not even ask for it (its RBAC would refuse; asking would tell whether
    that name exists)."""
    await controlplane.proxy.reset_counts()
    await world.create_infraenv()
    manifest = world.pool_manifest("greedy", folder=f"e2e/{world.namespace}")
    manifest["spec"]["vsphere"]["credentialsSecretRef"] = {
        "name": "admin-kubeconfig",
        "namespace": "clusters-x",
    }
    await world.client.create(kinds.VSPHERE_AGENT_POOL, manifest)
    snap = await eventually(
        world.snapshot,
        lambda s: pool_condition_is(
            s, "greedy", "VsphereReady", "False", ("CredentialsNamespaceNotAllowed",)
        ),
        within=60,
        what="VsphereReady=False, CredentialsNamespaceNotAllowed",
    )
    pool = snap.pool("greedy")
    assert pool is not None
    (ready,) = [c for c in pool["status"]["conditions"] if c["type"] == "VsphereReady"]
    assert "clusters-x/admin-kubeconfig" in ready["message"]
    assert "--credential-namespace" in ready["message"]
    assert names.CREDENTIALS_READER_ROLE in ready["message"]
    assert any(
        e.get("reason") == "CredentialsNamespaceNotAllowed"
        and e.get("involvedObject", {}).get("name") == "greedy"
        for e in snap.events
    ), "a Warning event on the pool"
    rows = await controlplane.proxy.count_rows(operator_identity())
    asked = {(r.verb, r.namespace) for r in rows if r.resource == "secrets"}
    assert ("get", "clusters-x") not in asked, asked
