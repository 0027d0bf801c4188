"""Security properties of a running operator: secrets stay secret, permissions stay least.

* The vCenter password (and a wrong one set later, which makes the login fail and so
  exercises every error path that might quote it) appears in no operator log line,
  Event, status or other field of any object the operator writes, and no metric.
* The operator authenticates with its ServiceAccount's bearer token and holds exactly
  the permissions of `config/rbac`: no other binding names it, a permission taken
  away is reported as Forbidden (the apiserver really enforces the shipped RBAC),
  and every verb `config/rbac` grants is used by a full pool life cycle, or appears
  in `RARELY_USED` with the reason it is still needed (the life cycle includes a
  Prometheus scrape, which the operator authorises with TokenReview and
  SubjectAccessReview).
* Secrets: the operator's identity may `get` a Secret by name in its credentials
  namespace only (the world's, bound as an installer binds it) and can neither `list`
  nor `watch` Secrets in any namespace (SubjectAccessReviews and real requests
  with its token, `kube-system` and all namespaces included); a password changed in
  the Secret reaches the running operator without a restart, by `get` alone
  (docs/design/0004-secret-access.md; every install path: test_secret_access.py).
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import kinds, names, rbac
from agentforge.kube import config as kube_config
from agentforge.kube import errors as kube_errors
from agentforge.kube.client import KubeClient, RetryPolicy
from sim.controlplane import ControlPlane
from sim.operator import MetricsReader, OperatorProcess, operator_identity
from sim.world import Snapshot, World
from tests.e2e.support import OperatorHarness, eventually, pool_condition_is, wait_converged

RBAC_DIR = Path(__file__).resolve().parents[2] / "config" / "rbac"
POOL = "workers"
GRANT_SCOPED = ("Role", "ClusterRole")
BINDINGS = ("RoleBinding", "ClusterRoleBinding")

RARELY_USED: dict[tuple[str, str], str] = {
    ("delete", "agents.agent-install.openshift.io"): (
        "the vm controller deletes the unbound Agent of a VM it destroyed; the simulated "
        "Assisted Installer deletes an Agent whose VM is gone too, and in a short life "
        "cycle it is often first (tests/kube/test_reconcilers_vm_delete.py shows the operator's)"
    ),
    ("patch", "events"): (
        "the event recorder patches an Event's count when it repeats (client-go's "
        "correlator, kube/events.py); a two-VM life cycle may repeat none"
    ),
}
"""Granted (verb, resource) pairs a full pool life cycle may not use, and why they stay."""

Grant = tuple[str, str]  # (verb, resource as the proxy names it: plural[.group][/sub])


# --- RBAC as shipped ------------------------------------------------------------------


def shipped_rbac() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        objects.extend(o for o in yaml.safe_load_all(path.read_text()) if o)
    return [o for o in objects if o.get("kind") != "Kustomization"]


def operator_roles() -> list[dict[str, Any]]:
    """The shipped roles the operator holds: those its shipped bindings name, and the
    credentials reader an installer binds per credentials namespace (not the tenant
    roles, nor metrics-reader)."""
    shipped = shipped_rbac()
    bound = {o["roleRef"]["name"] for o in shipped if o["kind"] in BINDINGS}
    held = bound | {names.CREDENTIALS_READER_ROLE}
    return [o for o in shipped if o["kind"] in GRANT_SCOPED and o["metadata"]["name"] in held]


def grants(roles: list[dict[str, Any]]) -> set[Grant]:
    """Every (verb, resource) the roles grant, in the proxy's resource naming."""
    out: set[Grant] = set()
    for role in roles:
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    plural, _, sub = resource.partition("/")
                    name = f"{plural}.{group}" if group else plural
                    name += f"/{sub}" if sub else ""
                    out.update((verb, name) for verb in rule.get("verbs", []))
    return out


def test_shipped_rbac_grants_no_wildcards_and_only_get_on_secrets() -> None:
    roles = [o for o in shipped_rbac() if o["kind"] in GRANT_SCOPED]
    for role in roles:
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
    granted = grants(roles)
    assert {v for v, r in granted if r == "secrets"} == {"get"}


# --- what the operator wrote --------------------------------------------------------------


async def _objects(world: World) -> dict[str, str]:
    """Every object the operator reads or writes in the world's namespaces, as JSON."""
    client = world.client
    ns, cp = world.namespace, world.control_plane_namespace
    where = (
        (kinds.VSPHERE_AGENT_POOL, ns),
        (kinds.VSPHERE_AGENT, ns),
        (kinds.AGENT, ns),
        (kinds.INFRA_ENV, ns),
        (kinds.EVENT, ns),
        (kinds.AGENT_MACHINE, cp),
        (kinds.EVENT, cp),
        (kinds.EVENT, names.DEPLOYMENT_NAMESPACE),
        (kinds.LEASE, names.DEPLOYMENT_NAMESPACE),
    )
    texts = {}
    for kind, namespace in where:
        listed = await client.list(kind, namespace=namespace)
        texts[f"{kind.plural} in {namespace}"] = json.dumps(listed.items)
    return texts


def _forms(secret: str) -> Iterator[str]:
    yield secret
    yield base64.b64encode(secret.encode()).decode()


# The Secret is read again every 5 s instead of every minute: the tests below wait for
# a changed password to be used, and what they prove does not depend on the interval.
FAST_REFRESH = pytest.mark.operator_args("--credentials-refresh-interval", "5s")


@FAST_REFRESH
async def test_vcenter_password_appears_in_no_log_event_status_or_metric(
    world: World, operator: OperatorHarness
) -> None:
    await world.create_infraenv()
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    await world.nodepool(POOL).scale(1)
    await wait_converged(world, pool=POOL, nodepool=POOL, replicas=1)
    assert operator.process is not None
    metrics_before = await operator.process.metrics_text()

    # A wrong password: every login fails from now on, and the failure is reported.
    wrong = secrets.token_hex(16)
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=world.namespace,
        name="vsphere-credentials",
        patch={"stringData": {"password": wrong}},
    )
    await world.vcsim.control.end_sessions()
    await eventually(
        world.snapshot,
        lambda s: pool_condition_is(s, POOL, "VsphereReady", "False", ("LoginFailed",)),
        within=90,
        what="the failed vCenter login reported in VsphereReady",
    )
    failed = await _objects(world)
    metrics_failed = await operator.process.metrics_text()

    # The right password again: the pool recovers, then scales to zero.
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=world.namespace,
        name="vsphere-credentials",
        patch={"stringData": {"password": world.vcsim.password}},
    )
    await eventually(
        world.snapshot,
        lambda s: pool_condition_is(s, POOL, "VsphereReady", "True", ("VsphereConnected",)),
        within=90,
        what="VsphereReady again with the right password",
    )
    await world.nodepool(POOL).scale(0)
    await eventually(
        world.snapshot,
        lambda s: not s.vms_of_pool(POOL) and not s.vsphere_agents,
        within=120,
        what="VMs removed after scale-down",
    )

    collected = {
        "operator log": operator.log_text(),
        "metrics (converged)": metrics_before,
        "metrics (login failing)": metrics_failed,
        "metrics (end)": await operator.process.metrics_text(),
        **{f"{k} (login failing)": v for k, v in failed.items()},
        **{f"{k} (end)": v for k, v in (await _objects(world)).items()},
    }
    assert "VsphereReady" in collected["vsphereagentpools in " + world.namespace + " (end)"]
    leaks = [
        f"{label} ({'base64' if form != secret else 'plain'} {which})"
        for which, secret in (("password", world.vcsim.password), ("wrong password", wrong))
        for form in _forms(secret)
        for label, text in collected.items()
        if form in text
    ]
    assert leaks == []


# --- least privilege -------------------------------------------------------------------


async def test_operator_is_bound_only_to_the_shipped_rbac(
    world: World, operator: OperatorHarness, controlplane: ControlPlane
) -> None:
    kubeconfig = yaml.safe_load(operator.kubeconfig.read_text())
    users = kubeconfig["users"]
    assert len(users) == 1
    assert set(users[0]["user"]) == {"token"}, "a bearer token, no client certificate"

    subject = {
        "kind": "ServiceAccount",
        "name": names.SERVICE_ACCOUNT,
        "namespace": names.DEPLOYMENT_NAMESPACE,
    }
    api = controlplane.direct_client()
    bound = set()
    for kind, path in (
        ("ClusterRoleBinding", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"),
        ("RoleBinding", "/apis/rbac.authorization.k8s.io/v1/rolebindings"),
    ):
        for binding in api.get(path).body["items"]:
            if any(
                {k: s.get(k) for k in subject} == subject for s in binding.get("subjects") or []
            ):
                bound.add((kind, binding["metadata"]["name"]))
    shipped = {(o["kind"], o["metadata"]["name"]) for o in shipped_rbac() if o["kind"] in BINDINGS}
    # plus the credentials namespaces' RoleBindings, which an installer adds (the worlds')
    assert bound == shipped | {("RoleBinding", names.CREDENTIALS_READER_ROLE)}
    readers = [
        b
        for b in api.get("/apis/rbac.authorization.k8s.io/v1/rolebindings").body["items"]
        if b["metadata"]["name"] == names.CREDENTIALS_READER_ROLE
    ]
    assert {b["roleRef"]["name"] for b in readers} == {names.CREDENTIALS_READER_ROLE}
    assert world.namespace in {b["metadata"]["namespace"] for b in readers}

    for role in (o for o in shipped_rbac() if o["kind"] in GRANT_SCOPED):
        meta = role["metadata"]
        base = "/apis/rbac.authorization.k8s.io/v1"
        path = (
            f"{base}/namespaces/{meta['namespace']}/roles/{meta['name']}"
            if role["kind"] == "Role"
            else f"{base}/clusterroles/{meta['name']}"
        )
        assert grants([api.get(path).body]) == grants([role]), f"{role['kind']} {meta['name']}"

    # Everything the running operator asked went out under the ServiceAccount.
    await world.create_infraenv()
    identity = operator_identity()
    await eventually(
        lambda: controlplane.proxy.count_rows(identity),
        lambda rows: any(r.verb == "watch" for r in rows),
        within=30,
        what="the operator's watches, counted under its ServiceAccount",
    )


def _access_review(api: Any, *, verb: str, namespace: str) -> bool:
    """May the operator's ServiceAccount do `verb` on Secrets in `namespace` ("" = all)?"""
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": operator_identity(),
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{names.DEPLOYMENT_NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "namespace": namespace,
                "verb": verb,
                "version": "v1",
                "resource": "secrets",
            },
        },
    }
    answer = api.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", body).body
    return bool(answer["status"].get("allowed"))


async def test_the_operator_may_get_secrets_by_name_but_never_list_or_watch_them(
    world: World, controlplane: ControlPlane, operator_kubeconfig: Path
) -> None:
    api = controlplane.direct_client()
    namespaces = ("", "kube-system", "default", names.DEPLOYMENT_NAMESPACE, world.namespace)
    answers = {
        (verb, ns or "<all>"): _access_review(api, verb=verb, namespace=ns)
        for verb in ("list", "watch", "get")
        for ns in namespaces
    }
    # `get` only, and only in the credentials namespace the installer bound
    assert {k for k, allowed in answers.items() if allowed} == {("get", world.namespace)}, answers

    # The same, asked with the operator's own token: the apiserver refuses the reads.
    cfg = await kube_config.load_config(kubeconfig=operator_kubeconfig, environ={})
    async with KubeClient(config=cfg, retry=RetryPolicy(attempts=1)) as operator_api:
        for ns in ("kube-system", world.namespace, None):
            with pytest.raises(kube_errors.Forbidden):
                await operator_api.list(kinds.SECRET, namespace=ns)
            with pytest.raises(kube_errors.Forbidden):
                async with operator_api.watch(kinds.SECRET, namespace=ns, timeout_seconds=1):
                    pass
        await world.create_credentials()
        found = await operator_api.get(
            kinds.SECRET, namespace=world.namespace, name="vsphere-credentials"
        )
        assert found["metadata"]["name"] == "vsphere-credentials"
        with pytest.raises(kube_errors.NotFound):  # allowed to ask here: told it is not there
            await operator_api.get(kinds.SECRET, namespace=world.namespace, name="no-such-secret")
        with pytest.raises(kube_errors.Forbidden):  # elsewhere not even that
            await operator_api.get(kinds.SECRET, namespace="kube-system", name="no-such-secret")


@FAST_REFRESH
async def test_a_fixed_password_reaches_the_running_operator_by_get_alone(
    world: World, operator: OperatorHarness, controlplane: ControlPlane
) -> None:
    """Rotation without a restart and without a watch: a pool that starts with a
    wrong password fails its login, then runs once the Secret holds the right one."""
    await controlplane.proxy.reset_counts()  # this test's requests only, from here on
    await world.create_infraenv()
    await world.create_credentials()
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=world.namespace,
        name="vsphere-credentials",
        patch={"stringData": {"password": secrets.token_hex(16)}},
    )
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    await eventually(
        world.snapshot,
        lambda s: pool_condition_is(s, POOL, "VsphereReady", "False", ("LoginFailed",)),
        within=60,
        what="the failed vCenter login reported in VsphereReady",
    )
    assert operator.process is not None
    pid = operator.process.pid
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=world.namespace,
        name="vsphere-credentials",
        patch={"stringData": {"password": world.vcsim.password}},
    )
    await eventually(
        world.snapshot,
        lambda s: pool_condition_is(s, POOL, "VsphereReady", "True", ("VsphereConnected",)),
        within=90,  # the refresh interval (5 s here); a changed password is tried at once
        what="VsphereReady with the fixed password, without a restart",
    )
    assert operator.runs == 1
    assert operator.process.pid == pid
    assert operator.process.running()
    rows = await controlplane.proxy.count_rows(operator_identity())
    assert {r.verb for r in rows if r.resource == "secrets"} == {"get"}


RESTRICTED_SA = "agent-forge-restricted"


def _restricted_role(drop: Grant) -> dict[str, Any]:
    """The shipped ClusterRole under another name, without one (verb, resource)."""
    role = copy.deepcopy(
        next(
            o
            for o in shipped_rbac()
            if o["kind"] == "ClusterRole" and o["metadata"]["name"] == names.MANAGER_ROLE
        )
    )
    role["metadata"] = {"name": "agent-forge-restricted-role"}
    verb, resource = drop
    plural, _, group = resource.partition(".")
    for rule in role["rules"]:
        if group in rule["apiGroups"] and plural in rule["resources"] and verb in rule["verbs"]:
            assert rule["resources"] == [plural], "the dropped verb must not affect other kinds"
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    assert (verb, resource) not in grants([role])
    return role


def _apply(api: Any, path: str, body: dict[str, Any]) -> None:
    api.request(
        "PATCH",
        f"{path}?fieldManager=agentforge-e2e&force=true",
        body=body,
        content_type="application/apply-patch+yaml",
    )


async def test_a_permission_taken_away_is_reported_as_refused(
    world: World, controlplane: ControlPlane, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    dropped: Grant = ("patch", "agents.agent-install.openshift.io")
    api = controlplane.direct_client()
    ns = names.DEPLOYMENT_NAMESPACE
    _apply(
        api,
        f"/api/v1/namespaces/{ns}/serviceaccounts/{RESTRICTED_SA}",
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RESTRICTED_SA, "namespace": ns},
        },
    )
    role = _restricted_role(dropped)
    rbac_api = "/apis/rbac.authorization.k8s.io/v1"
    _apply(
        api,
        f"{rbac_api}/clusterroles/{role['metadata']['name']}",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", **role},
    )
    _apply(
        api,
        f"{rbac_api}/clusterrolebindings/{RESTRICTED_SA}",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": RESTRICTED_SA},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": RESTRICTED_SA, "namespace": ns}],
        },
    )
    reader = {
        **rbac.credentials_binding(world.namespace),
        "subjects": [{"kind": "ServiceAccount", "name": RESTRICTED_SA, "namespace": ns}],
    }
    reader["metadata"] = {**reader["metadata"], "name": RESTRICTED_SA}
    _apply(api, f"{rbac_api}/namespaces/{world.namespace}/rolebindings/{RESTRICTED_SA}", reader)
    kubeconfig = controlplane.serviceaccount_kubeconfig(ns, RESTRICTED_SA)
    await world.create_infraenv()
    await world.create_credentials()
    await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
    process = OperatorProcess(
        kubeconfig,
        "--namespace",
        world.namespace,
        "--namespace",
        world.control_plane_namespace,
        log_path=tmp_path / "operator.log",
    )
    try:
        process.start()
        await process.wait_ready(within=60)
        await world.nodepool(POOL).scale(1)

        def forbidden_reported(snap: Snapshot) -> bool:
            return any(
                "forbidden" in str(e.get("message", "")).lower()
                and e.get("involvedObject", {}).get("kind") == "VsphereAgentPool"
                for e in snap.events
            )

        snap = await eventually(
            world.snapshot,
            forbidden_reported,
            within=120,
            what="a Warning event on the pool saying the Agent patch was forbidden",
        )
        identity = f"system:serviceaccount:{ns}:{RESTRICTED_SA}"
        rows = await controlplane.proxy.count_rows(identity)
        assert any((r.verb, r.resource, r.status) == (*dropped, 403) for r in rows), (
            "the apiserver refused the Agent patch"
        )
        warning = next(e for e in snap.events if "forbidden" in str(e.get("message", "")).lower())
        assert warning["type"] == "Warning"
        assert "config/rbac" in warning["message"], "the event says where permissions come from"
        assert not any(
            a["metadata"].get("labels", {}).get("agent-pool") == POOL for a in snap.agents
        ), "no Agent was prepared without the permission"
    finally:
        await process.stop()
    assert world.vcsim.password not in process.log_text()


def _resource_rows(rows: list[Any]) -> set[Grant]:
    return {(r.verb, r.resource) for r in rows if not r.resource.startswith("/")}


async def test_every_granted_verb_is_used_by_a_pool_life_cycle(
    world: World,
    controlplane: ControlPlane,
    operator_kubeconfig: Path,
    metrics_reader: MetricsReader,
    tmp_path: Path,
) -> None:
    lease = f"agent-forge-verbs-{secrets.token_hex(3)}"  # new: its first acquisition creates it
    await world.create_infraenv()
    await world.create_credentials()
    await controlplane.proxy.reset_counts()
    process = OperatorProcess(
        operator_kubeconfig,
        "--leader-elect",
        "--leader-election-namespace",
        names.DEPLOYMENT_NAMESPACE,
        "--leader-election-id",
        lease,
        "--namespace",
        world.namespace,
        "--namespace",
        world.control_plane_namespace,
        log_path=tmp_path / "operator.log",
        metrics=metrics_reader,
    )
    try:
        process.start()
        await process.wait_log("became leader", within=60)
        await process.metrics_text()  # Prometheus scrapes: the operator reviews its token
        await world.create_pool(POOL, folder=f"e2e/{world.namespace}")
        await world.nodepool(POOL).scale(2)
        await wait_converged(world, pool=POOL, nodepool=POOL, replicas=2)
        await world.nodepool(POOL).scale(0)
        await eventually(
            world.snapshot,
            lambda s: not s.vsphere_agents and not s.vms_of_pool(POOL) and not s.agents,
            within=120,
            what="VMs, VsphereAgents and Agents removed after scale-down",
        )
        await world.client.delete(kinds.VSPHERE_AGENT_POOL, namespace=world.namespace, name=POOL)
        await eventually(
            world.snapshot, lambda s: s.pool(POOL) is None, within=60, what="the pool finalized"
        )
    finally:
        assert await process.stop() == 0  # SIGTERM releases the Lease (an update)
    rows = await controlplane.proxy.count_rows(operator_identity())
    used = _resource_rows(rows)
    forbidden = sorted({(r.verb, r.resource) for r in rows if r.status == 403})
    assert forbidden == [], f"requests the shipped RBAC refused: {forbidden}"
    granted = grants(operator_roles())
    unused = sorted(granted - used - set(RARELY_USED))
    print("granted but unused in this life cycle:", unused or "none")
    print("rarely used, allowed:", {f"{v} {r}": why for (v, r), why in RARELY_USED.items()})
    assert unused == [], f"granted but never used: {unused}; remove them or explain in RARELY_USED"
    assert not (used - granted), f"used without a grant: {sorted(used - granted)}"
