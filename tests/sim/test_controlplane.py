"""The real control plane and its fault proxy do what the tests of other pieces rely on.

Every test here talks to real etcd / kube-apiserver / proxy processes over loopback.
A raw aiohttp client (`Raw`) is used where the exact requests matter (counting,
watch streams); kubernetes_asyncio where a normal client is the point.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from agentforge.api import kinds
from sim import paths
from sim.actors.waiting import eventually
from sim.controlplane import ControlPlane, ProxyControl
from sim.controlplane.processes import StartupError

pytestmark = pytest.mark.controlplane

EXTERNAL_KINDS = (kinds.AGENT, kinds.INFRA_ENV, kinds.AGENT_MACHINE, kinds.MACHINE)


class Raw:
    """A bare HTTPS client with one bearer token: the proxy sees exactly its requests."""

    def __init__(self, base_url: str, *, ca_file: Path, token: str | None) -> None:
        self.base_url = base_url
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Raw:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl),
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        assert self._session is not None
        return self._session.request(method, self.base_url + path, **kwargs)

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.request(method, path, **kwargs) as response:
            return response.status, await response.json(content_type=None)


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration, persist_config=False
    )
    async with client.ApiClient(configuration) as api:
        yield api


def admin_raw(cp: ControlPlane) -> Raw:
    return Raw(cp.server, ca_file=cp.ca_file, token=cp.admin_token)


def grant_configmap_reading(cp: ControlPlane, namespace: str, subject: dict[str, str]) -> None:
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    direct = cp.direct_client()
    direct.post(
        f"{rbac}/namespaces/{namespace}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-configmaps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
        expect=(201, 409),
    )
    direct.post(
        f"{rbac}/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"read-configmaps-{subject['name'].replace(':', '-')}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-configmaps",
            },
            "subjects": [subject],
        },
    )


# --- the cluster itself --------------------------------------------------------------


async def test_control_plane_serves_the_four_external_crds(
    namespace: str, admin_api: client.ApiClient
) -> None:
    objects = client.CustomObjectsApi(admin_api)
    for kind in EXTERNAL_KINDS:
        listed = await objects.list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural
        )
        assert listed["items"] == [], kind.kind

    agent = {
        "apiVersion": kinds.AGENT.api_version,
        "kind": "Agent",
        "metadata": {"name": "a1"},
        "spec": {"approved": False, "role": "worker"},
    }
    created = await objects.create_namespaced_custom_object(
        kinds.AGENT.group, kinds.AGENT.version, namespace, kinds.AGENT.plural, agent
    )
    assert created["spec"]["role"] == "worker"
    with pytest.raises(ApiException) as invalid:  # the upstream schema is enforced
        await objects.create_namespaced_custom_object(
            kinds.AGENT.group,
            kinds.AGENT.version,
            namespace,
            kinds.AGENT.plural,
            {**agent, "metadata": {"name": "a2"}, "spec": {"role": "worker"}},
        )
    assert invalid.value.status == 422


async def test_serviceaccount_without_a_grant_is_forbidden_and_allowed_once_bound(
    controlplane: ControlPlane, namespace: str
) -> None:
    kubeconfig = controlplane.serviceaccount_kubeconfig(namespace, "reader")
    async with api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        with pytest.raises(ApiException) as denied:
            await core.list_namespaced_config_map(namespace)
        assert denied.value.status == 403

        grant_configmap_reading(
            controlplane,
            namespace,
            {"kind": "ServiceAccount", "name": "reader", "namespace": namespace},
        )

        async def allowed() -> bool:
            try:
                await core.list_namespaced_config_map(namespace)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return False
            return True

        await eventually(allowed, what="the RoleBinding to take effect", within=10.0)


async def test_user_identities_minted_after_start_authenticate_through_the_token_webhook(
    controlplane: ControlPlane, namespace: str
) -> None:
    kubeconfig = controlplane.user_kubeconfig("alice", ["team-a"])
    token = kubeconfig.read_text().split("token: ", 1)[1].split()[0]
    async with Raw(controlplane.server, ca_file=controlplane.ca_file, token=token) as alice:
        status, review = await alice.json(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert status == 201
        user = review["status"]["userInfo"]
        assert user["username"] == "alice"
        assert {"team-a", "system:authenticated"} <= set(user["groups"])

        configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
        assert (await alice.json("GET", configmaps))[0] == 403
        grant_configmap_reading(
            controlplane,
            namespace,
            {"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"},
        )

        async def allowed() -> bool:
            return (await alice.json("GET", configmaps))[0] == 200

        await eventually(allowed, what="the group RoleBinding to take effect", within=10.0)

    async with Raw(controlplane.server, ca_file=controlplane.ca_file, token="not-a-token") as bad:
        assert (await bad.json("GET", "/api/v1/namespaces"))[0] == 401


# --- the proxy's counters ------------------------------------------------------------


async def test_proxy_counts_requests_by_identity_kubernetes_verb_and_resource(
    controlplane: ControlPlane, namespace: str, proxy: ProxyControl
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    agents = f"{kinds.AGENT.path(namespace=namespace)}"
    async with admin_raw(controlplane) as kube:
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "a"},
            "data": {"k": "1"},
        }
        assert (await kube.json("POST", cms, json=cm))[0] == 201
        status, current = await kube.json("GET", f"{cms}/a")
        assert status == 200
        assert (await kube.json("GET", cms))[0] == 200
        merge = {"Content-Type": "application/merge-patch+json"}
        assert (await kube.json("PATCH", f"{cms}/a", data='{"data":{"k":"2"}}', headers=merge))[
            0
        ] == 200
        current["data"] = {"k": "3"}
        current["metadata"].pop("resourceVersion")
        assert (await kube.json("PUT", f"{cms}/a", json=current))[0] == 200
        async with kube.request("GET", cms, params={"watch": "true"}) as watch:
            assert watch.status == 200
            first = json.loads(await watch.content.readline())
            assert first["type"] == "ADDED"
        assert (await kube.json("DELETE", f"{cms}/a"))[0] == 200
        assert (await kube.json("DELETE", cms))[0] == 200

        agent = {
            "apiVersion": kinds.AGENT.api_version,
            "kind": "Agent",
            "metadata": {"name": "a1"},
            "spec": {"approved": False, "role": "worker"},
        }
        assert (await kube.json("POST", agents, json=agent))[0] == 201
        status_patch = '{"status":{"conditions":[]}}'
        assert (await kube.json("PATCH", f"{agents}/a1/status", data=status_patch, headers=merge))[
            0
        ] == 200
        missing = f"{kinds.MACHINE.path(namespace=namespace, name='nope')}/status"
        assert (await kube.json("GET", missing))[0] == 404

    sa = controlplane.serviceaccount_kubeconfig(namespace, "nobody")
    sa_token = sa.read_text().split("token: ", 1)[1].split()[0]
    async with Raw(controlplane.server, ca_file=controlplane.ca_file, token=sa_token) as nobody:
        assert (await nobody.json("GET", cms))[0] == 403
    async with Raw(controlplane.server, ca_file=controlplane.ca_file, token="forged") as forged:
        assert (await forged.json("GET", cms))[0] == 401

    assert await proxy.counts("admin") == {
        ("create", "configmaps"): 1,
        ("get", "configmaps"): 1,
        ("list", "configmaps"): 1,
        ("patch", "configmaps"): 1,
        ("update", "configmaps"): 1,
        ("watch", "configmaps"): 1,
        ("delete", "configmaps"): 1,
        ("deletecollection", "configmaps"): 1,
        ("create", "agents.agent-install.openshift.io"): 1,
        ("patch", "agents.agent-install.openshift.io/status"): 1,
        ("get", "machines.cluster.x-k8s.io/status"): 1,
    }
    rows = {
        (r.identity, r.verb, r.resource, r.namespace, r.status): r.count
        for r in await proxy.count_rows()
    }
    assert rows[("admin", "get", "machines.cluster.x-k8s.io/status", namespace, 404)] == 1
    sa_name = f"system:serviceaccount:{namespace}:nobody"
    assert rows[(sa_name, "list", "configmaps", namespace, 403)] == 1
    assert rows[("unknown", "list", "configmaps", namespace, 401)] == 1

    log = await proxy.requests("admin")
    assert [r.verb for r in log][:3] == ["create", "get", "list"]
    await proxy.reset_counts()
    assert await proxy.counts() == {}


# --- the proxy's faults ---------------------------------------------------------------


async def test_drop_watches_ends_every_open_watch_stream(
    controlplane: ControlPlane, namespace: str, proxy: ProxyControl
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with admin_raw(controlplane) as kube:
        async with kube.request("GET", cms, params={"watch": "true"}) as watch:
            assert watch.status == 200
            await proxy.wait_open_watches(1, resource="configmaps")
            assert await proxy.drop_watches() == 1
            assert await asyncio.wait_for(watch.content.read(), 10) == b""  # clean end
        assert await proxy.open_watches() == 0

        async with kube.request("GET", cms, params={"watch": "true"}) as watch:
            await proxy.wait_open_watches(1, resource="configmaps")
            assert await proxy.drop_watches(abort=True) == 1
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(watch.content.read(), 10)  # connection cut mid-stream


async def test_gone_next_watch_sends_one_410_expired_event_then_closes(
    controlplane: ControlPlane, namespace: str, proxy: ProxyControl
) -> None:
    await proxy.gone_next_watch("configmaps")
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    async with admin_raw(controlplane) as kube:
        async with kube.request("GET", secrets, params={"watch": "true"}) as unaffected:
            controlplane.direct_client().post(
                secrets, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
            )
            event = json.loads(await asyncio.wait_for(unaffected.content.readline(), 10))
            assert event["type"] == "ADDED"

        cms = f"/api/v1/namespaces/{namespace}/configmaps"
        async with kube.request("GET", cms, params={"watch": "true"}) as watch:
            assert watch.status == 200
            lines = (await asyncio.wait_for(watch.content.read(), 10)).splitlines()
        assert len(lines) == 1
        gone = json.loads(lines[0])
        assert gone["type"] == "ERROR"
        assert gone["object"]["kind"] == "Status"
        assert (gone["object"]["code"], gone["object"]["reason"]) == (410, "Expired")

        async with kube.request("GET", cms, params={"watch": "true"}) as again:
            assert again.status == 200
            await proxy.wait_open_watches(1, resource="configmaps")  # a normal watch again


async def test_a_watch_the_client_closes_stops_counting_as_open(
    controlplane: ControlPlane, namespace: str, proxy: ProxyControl
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with admin_raw(controlplane) as kube:
        async with kube.request("GET", cms, params={"watch": "true"}) as watch:
            assert watch.status == 200
            await proxy.wait_open_watches(1, resource="configmaps")
            watch.close()  # hang up mid-stream

        async def none_open() -> bool:
            return await proxy.open_watches() == 0

        await eventually(none_open, what="the proxy to notice the client hung up", within=10.0)


async def test_fail_next_answers_n_matching_requests_with_the_status_then_passes(
    controlplane: ControlPlane, namespace: str, proxy: ProxyControl
) -> None:
    cms = f"/api/v1/namespaces/{namespace}/configmaps"
    async with admin_raw(controlplane) as kube:
        await proxy.fail_next(2, 503, verb="list", resource="configmaps")
        assert (await kube.json("GET", f"/api/v1/namespaces/{namespace}/secrets"))[0] == 200
        for _ in range(2):
            async with kube.request("GET", cms) as failed:
                assert failed.status == 503
                assert failed.headers["Retry-After"] == "1"
                body = await failed.json()
                assert (body["kind"], body["code"], body["reason"]) == (
                    "Status",
                    503,
                    "ServiceUnavailable",
                )
        assert (await kube.json("GET", cms))[0] == 200

        await proxy.fail_next(1, 429, retry_after=7)
        async with kube.request("GET", cms) as throttled:
            assert throttled.status == 429
            assert throttled.headers["Retry-After"] == "7"
        await proxy.fail_next(1)
        async with kube.request("GET", cms) as broken:
            assert broken.status == 500
            assert "Retry-After" not in broken.headers
        assert (await kube.json("GET", cms))[0] == 200

    statuses = [r.status for r in await proxy.requests("admin") if r.resource == "configmaps"]
    assert statuses == [503, 503, 200, 429, 500, 200]


async def test_latency_delays_each_forwarded_request_until_cleared(
    controlplane: ControlPlane, proxy: ProxyControl
) -> None:
    await proxy.set_latency(400)
    async with admin_raw(controlplane) as kube:
        started = time.monotonic()
        assert (await kube.json("GET", "/api/v1/namespaces/default"))[0] == 200
        assert time.monotonic() - started >= 0.4
    assert (await proxy.requests("admin"))[-1].duration_ms >= 400
    await proxy.clear_faults()
    assert await proxy.faults() == {"latency_ms": 0.0, "fail_next": [], "gone_next_watch": []}


# --- lifecycle: nothing left behind ------------------------------------------------------


def _gone(processes: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_stopped_control_plane_leaves_no_process_and_only_the_callers_files(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "given"
    workdir.mkdir()
    (workdir / "keep.txt").write_text("the caller's")
    control_plane = ControlPlane(workdir, crd_paths=[], quiet=True)
    control_plane.start()
    try:
        pids = control_plane.pids()
        assert len(pids) == 3
        processes = [psutil.Process(pid) for pid in pids]
        assert all(os.getpgid(pid) == pid for pid in pids), "each component leads its own group"
        assert control_plane.direct_client().status_of("/readyz") == 200
    finally:
        control_plane.stop()
    assert _gone(processes)
    assert sorted(p.name for p in workdir.iterdir()) == ["keep.txt"]


async def test_async_with_control_plane_removes_its_temporary_workdir() -> None:
    async with ControlPlane(crd_paths=[], quiet=True) as control_plane:
        workdir = control_plane.workdir
        processes = [psutil.Process(pid) for pid in control_plane.pids()]
        async with api_client(control_plane.admin_kubeconfig) as api:
            names = [
                ns.metadata.name for ns in (await client.CoreV1Api(api).list_namespace()).items
            ]
        assert "default" in names
    assert _gone(processes)
    assert not workdir.exists()


async def test_cli_up_serves_until_sigterm_then_tears_everything_down(tmp_path: Path) -> None:
    workdir = tmp_path / "cp"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sim.controlplane",
        "up",
        "--dir",
        str(workdir),
        "--no-crds",
        cwd=paths.REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        printed: dict[str, str] = {}
        async with asyncio.timeout(120):
            while "pids" not in printed:
                line = (await process.stdout.readline()).decode()
                assert line, f"`up` exited early with {await process.wait()}: see stderr above"
                key, _, value = line.partition("  ")
                printed[key.strip()] = value.strip()
        kubeconfig = Path(printed["admin kubeconfig"])
        processes = [psutil.Process(int(pid)) for pid in printed["pids"].split()]
        async with api_client(kubeconfig) as api:
            await client.CoreV1Api(api).read_namespace("default")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert _gone(processes)
    assert not workdir.exists()


def test_a_missing_binary_fails_naming_the_make_target_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTFORGE_BIN_DIR", str(tmp_path / "empty"))
    workdir = tmp_path / "wd"
    with pytest.raises(paths.MissingBinaryError, match="make controlplane"):
        ControlPlane(workdir, crd_paths=[], quiet=True).start()
    assert not workdir.exists()


def test_a_component_dying_at_startup_fails_with_its_log_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_etcd = bin_dir / "etcd"
    fake_etcd.write_text("#!/bin/sh\necho boom-from-fake-etcd >&2\nexit 3\n")
    fake_etcd.chmod(0o755)
    (bin_dir / "kube-apiserver").symlink_to(paths.binary("kube-apiserver"))
    monkeypatch.setenv("AGENTFORGE_BIN_DIR", str(bin_dir))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    workdir = tmp_path / "wd"
    with pytest.raises(StartupError, match=r"(?s)etcd exited with status 3.*boom-from-fake-etcd"):
        ControlPlane(workdir, crd_paths=[], quiet=True).start()
    leftovers = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert leftovers == []  # the proxy started alongside etcd was stopped too
    assert not workdir.exists()
