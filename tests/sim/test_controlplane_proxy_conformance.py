"""Through the fault proxy, clients get what they get from the apiserver itself.

The same requests, from the official clients, once through the proxy and once straight
to the apiserver, each in a namespace of its own; the answers (status codes, and
bodies without what differs by nature: resourceVersions, UIDs, timestamps, the
namespace's name) must be equal. kubectl (`.build/bin/kubectl`) and the official
Python client (`kubernetes`, which sends some requests without a `Content-Type`)
each run: create (and its conflict), server-side apply, the four patch types (JSON,
merge, strategic merge, apply), a status subresource, a watch from a resourceVersion,
delete with preconditions that fail and that hold, and a read of what is gone.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from sim.controlplane import ControlPlane
from sim.paths import REPO_ROOT

pytestmark = pytest.mark.controlplane

KUBECTL = REPO_ROOT / ".build" / "bin" / "kubectl"
VOLATILE = frozenset({"resourceVersion", "uid", "creationTimestamp", "time", "deletionTimestamp"})
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NUMBER = re.compile(r"\b\d{3,}\b")  # resourceVersions inside messages

Step = tuple[str, Any, Any]  # name, status (HTTP code or kubectl exit code), normalized body


def normalize(value: Any, namespace: str) -> Any:
    if isinstance(value, dict):
        return {k: normalize(v, namespace) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalize(v, namespace) for v in value]
    if isinstance(value, str):
        return NUMBER.sub("<n>", UUID.sub("<uid>", value.replace(namespace, "<ns>")))
    return value


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
            },
        },
    }


@pytest.fixture
def namespaces(controlplane: ControlPlane) -> Iterator[dict[str, str]]:
    """One namespace per route, made and removed straight at the apiserver."""
    made = {route: f"conformance-{route}-{uuid.uuid4().hex[:8]}" for route in ("proxy", "direct")}
    for name in made.values():
        kubectl(controlplane.direct_admin_kubeconfig, "create", "namespace", name, check=True)
    yield made
    for name in made.values():
        kubectl(controlplane.direct_admin_kubeconfig, "delete", "namespace", name, "--wait=false")


def kubeconfigs(controlplane: ControlPlane) -> dict[str, Path]:
    return {
        "proxy": controlplane.admin_kubeconfig,
        "direct": controlplane.direct_admin_kubeconfig,
    }


# --- kubectl ----------------------------------------------------------------------------


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
    return done


def kubectl_session(kubeconfig: Path, namespace: str) -> list[Step]:
    steps: list[Step] = []

    def run(name: str, *args: str, stdin: str | None = None, json_out: bool = True) -> Any:
        done = kubectl(kubeconfig, "-n", namespace, *args, stdin=stdin)
        out: Any = done.stdout
        if json_out and done.returncode == 0 and done.stdout.strip():
            out = json.loads(done.stdout)
        steps.append((name, done.returncode, normalize([out, done.stderr], namespace)))
        return out

    # `get -o json` of a collection is a List kubectl builds, without a resourceVersion
    listed = kubectl(kubeconfig, "get", "--raw", f"/api/v1/namespaces/{namespace}/configmaps")
    since = json.loads(listed.stdout)["metadata"]["resourceVersion"]
    cm = yaml.safe_dump(config_map("cm", a="1"))
    run("create", "create", "-f", "-", "-o", "json", stdin=cm)
    run("create again", "create", "-f", "-", "-o", "json", stdin=cm, json_out=False)
    applied = yaml.safe_dump(config_map("applied", a="1"))
    run("apply", "apply", "--server-side", "--field-manager=conformance", "-f", "-", "-o", "json",
        stdin=applied)  # fmt: skip
    applied = yaml.safe_dump(config_map("applied", a="2", b="3"))
    run("apply again", "apply", "--server-side", "--field-manager=conformance", "-f", "-",
        "-o", "json", stdin=applied)  # fmt: skip
    json_patch = json.dumps([{"op": "add", "path": "/data/b", "value": "2"}])
    run("patch json", "patch", "cm", "cm", "--type=json", "-p", json_patch, "-o", "json")
    run("patch merge", "patch", "cm", "cm", "--type=merge", "-p", '{"data":{"c":"3"}}',
        "-o", "json")  # fmt: skip
    run("patch strategic", "patch", "cm", "cm", "--type=strategic", "-p",
        '{"metadata":{"labels":{"x":"y"}}}', "-o", "json")  # fmt: skip
    run("patch bad", "patch", "cm", "cm", "--type=json", "-p", '[{"op":"remove","path":"/nope"}]',
        json_out=False)  # fmt: skip
    run("create deployment", "create", "-f", "-", "-o", "json",
        stdin=yaml.safe_dump(deployment("d")))  # fmt: skip
    run("patch status", "patch", "deployment", "d", "--subresource=status", "--type=merge",
        "-p", '{"status":{"observedGeneration":1,"replicas":0}}', "-o", "json")  # fmt: skip
    run("get status", "get", "deployment", "d", "--subresource=status", "-o", "json")
    path = f"/api/v1/namespaces/{namespace}/configmaps/cm"
    uid = json.loads(kubectl(kubeconfig, "-n", namespace, "get", "cm", "cm", "-o", "json").stdout)[
        "metadata"
    ]["uid"]
    for name, preconditions in (
        ("delete wrong uid", {"uid": str(uuid.uuid4())}),
        ("delete wrong resourceVersion", {"resourceVersion": "1"}),
        ("delete", {"uid": uid}),
    ):
        body = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1",
                           "preconditions": preconditions})  # fmt: skip
        run(name, "delete", "--raw", path, "-f", "-", stdin=body, json_out=False)
    run("get gone", "get", "cm", "cm", "-o", "json", json_out=False)
    watch = kubectl(
        kubeconfig,
        "get",
        "--raw",
        f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion={since}"
        "&timeoutSeconds=2",
    )
    events = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
    steps.append(("watch", watch.returncode, normalize(events, namespace)))
    return steps


# --- the official Python client -----------------------------------------------------------


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """Status and JSON body of one typed call, as the client received them."""
    try:
        response = fn(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        return int(exc.status), json.loads(exc.body) if exc.body else None
    data = response.data
    return int(response.status), json.loads(data) if data else None


def python_session(kubeconfig: Path, namespace: str) -> list[Step]:
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        return _python_steps(api, namespace)
    finally:
        api.close()


def _python_steps(api: k8s.ApiClient, namespace: str) -> list[Step]:
    core, apps = k8s.CoreV1Api(api), k8s.AppsV1Api(api)
    steps: list[Step] = []

    def step(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        status, body = call(fn, *args, **kwargs)
        steps.append((name, status, normalize(body, namespace)))
        return body

    listed = core.list_namespaced_config_map(namespace).metadata
    assert listed is not None, "a list always has its metadata"
    since = listed.resource_version
    step("create", core.create_namespaced_config_map, namespace, config_map("cm", a="1"))
    step("create again", core.create_namespaced_config_map, namespace, config_map("cm", a="1"))
    step("get", core.read_namespaced_config_map, "cm", namespace)
    for name, data in (("apply", {"a": "1"}), ("apply again", {"a": "2", "b": "3"})):
        step(name, core.patch_namespaced_config_map, "applied", namespace,
             config_map("applied", **data), field_manager="conformance", force=True,
             _content_type="application/apply-patch+yaml")  # fmt: skip
    step("patch json", core.patch_namespaced_config_map, "cm", namespace,
         [{"op": "add", "path": "/data/b", "value": "2"}])  # fmt: skip
    step("patch merge", core.patch_namespaced_config_map, "cm", namespace, {"data": {"c": "3"}},
         _content_type="application/merge-patch+json")  # fmt: skip
    step("patch strategic", core.patch_namespaced_config_map, "cm", namespace,
         {"metadata": {"labels": {"x": "y"}}})  # fmt: skip
    step("patch bad", core.patch_namespaced_config_map, "cm", namespace,
         [{"op": "remove", "path": "/nope"}])  # fmt: skip
    step("create deployment", apps.create_namespaced_deployment, namespace, deployment("d"))
    step("patch status", apps.patch_namespaced_deployment_status, "d", namespace,
         {"status": {"observedGeneration": 1, "replicas": 0}})  # fmt: skip
    current = step("get status", apps.read_namespaced_deployment_status, "d", namespace)
    if isinstance(current, dict) and current.get("kind") == "Deployment":
        current["status"]["replicas"] = 1
        step("replace status", apps.replace_namespaced_deployment_status, "d", namespace, current)
    else:  # the statuses compared below say which step failed
        steps.append(("replace status", "not sent: no Deployment to replace", None))
    _, found = call(core.read_namespaced_config_map, "cm", namespace)
    uid = ((found or {}).get("metadata") or {}).get("uid") or "no ConfigMap was created"
    for name, preconditions in (
        ("delete wrong uid", k8s.V1Preconditions(uid=str(uuid.uuid4()))),
        ("delete wrong resourceVersion", k8s.V1Preconditions(resource_version="1")),
        ("delete", k8s.V1Preconditions(uid=uid)),
    ):
        step(name, core.delete_namespaced_config_map, "cm", namespace,
             body=k8s.V1DeleteOptions(preconditions=preconditions))  # fmt: skip
    step("get gone", core.read_namespaced_config_map, "cm", namespace)
    events = [
        {"type": e["type"], "object": e["raw_object"]}
        for e in k8s_watch.Watch().stream(
            core.list_namespaced_config_map, namespace, resource_version=since, timeout_seconds=2
        )
    ]
    steps.append(("watch", 200, normalize(events, namespace)))
    return steps


# --- the comparison -----------------------------------------------------------------------


def routes(
    controlplane: ControlPlane,
    namespaces: dict[str, str],
    session: Callable[[Path, str], list[Step]],
) -> dict[str, list[Step]]:
    configs = kubeconfigs(controlplane)
    return {route: session(configs[route], namespaces[route]) for route in ("proxy", "direct")}


def statuses(steps: list[Step]) -> list[tuple[str, Any]]:
    return [(name, status) for name, status, _ in steps]


def test_the_python_client_gets_the_same_answers_through_the_proxy(
    controlplane: ControlPlane, namespaces: dict[str, str]
) -> None:
    got = routes(controlplane, namespaces, python_session)
    assert statuses(got["proxy"]) == [
        ("create", 201),
        ("create again", 409),
        ("get", 200),
        ("apply", 201),
        ("apply again", 200),
        ("patch json", 200),
        ("patch merge", 200),
        ("patch strategic", 200),
        ("patch bad", 422),
        ("create deployment", 201),
        ("patch status", 200),
        ("get status", 200),
        ("replace status", 200),
        ("delete wrong uid", 409),
        ("delete wrong resourceVersion", 409),
        ("delete", 200),
        ("get gone", 404),
        ("watch", 200),
    ]
    for (name, status, body), (_, direct_status, direct_body) in zip(
        got["proxy"], got["direct"], strict=True
    ):
        assert (status, body) == (direct_status, direct_body), name
    watched = got["proxy"][-1][2]
    assert [e["type"] for e in watched] == [
        "ADDED", "ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"
    ]  # fmt: skip


def test_kubectl_gets_the_same_answers_through_the_proxy(
    controlplane: ControlPlane, namespaces: dict[str, str]
) -> None:
    got = routes(controlplane, namespaces, kubectl_session)
    assert statuses(got["proxy"]) == [
        ("create", 0),
        ("create again", 1),
        ("apply", 0),
        ("apply again", 0),
        ("patch json", 0),
        ("patch merge", 0),
        ("patch strategic", 0),
        ("patch bad", 1),
        ("create deployment", 0),
        ("patch status", 0),
        ("get status", 0),
        ("delete wrong uid", 1),
        ("delete wrong resourceVersion", 1),
        ("delete", 0),
        ("get gone", 1),
        ("watch", 0),
    ]
    for (name, status, body), (_, direct_status, direct_body) in zip(
        got["proxy"], got["direct"], strict=True
    ):
        assert (status, body) == (direct_status, direct_body), name
    watched = got["proxy"][-1][2]
    assert [e["type"] for e in watched] == [
        "ADDED", "ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"
    ]  # fmt: skip
