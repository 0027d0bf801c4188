"""`python -m agentforge check` end to end: the real CLI, the real control plane, vcsim.

The CLI runs as a subprocess (its own event loop, its own kubeconfig probe) while the
simulated world runs in the test's loop: the ISO server the CLI probes answers from
here, so the CLI is started with asyncio's subprocess support, never a blocking run.
The operator is not running: `check` answers "would this pool work?" before it does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import kinds, names
from sim.controlplane import ControlPlane
from sim.paths import REPO_ROOT
from sim.world import World, samples

CLI_TIMEOUT = 180.0


async def run_check(*args: str | Path) -> tuple[int, str, str]:
    """The CLI's exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentforge",
        "check",
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
        env={**os.environ, "KUBECONFIG": "/nonexistent"},
    )
    out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def write_manifests(path: Path, *pools: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(pools, sort_keys=False))
    return path


def items_of(report: dict[str, Any], pool: str) -> list[dict[str, str]]:
    (found,) = [p for p in report["pools"] if p["pool"].endswith(f"/{pool}")]
    items: list[dict[str, str]] = found["items"]
    return items


def failed(report: dict[str, Any], pool: str) -> dict[str, list[str]]:
    """check id -> `subject: message` of each failed item of `pool`."""
    out: dict[str, list[str]] = {}
    for item in items_of(report, pool):
        if item["status"] == "fail":
            out.setdefault(item["check"], []).append(f"{item['subject']}: {item['message']}")
    return out


def fail_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("✗")]


async def prepare_good_world(world: World) -> None:
    await world.create_infraenv()
    await world.create_credentials()
    await world.nodepool("workers").scale(1)


async def test_a_good_pool_passes_every_item_from_a_file_and_from_the_cluster(
    controlplane: ControlPlane, operator_kubeconfig: Path, world: World, tmp_path: Path
) -> None:
    await prepare_good_world(world)
    manifest = write_manifests(tmp_path / "pool.yaml", world.pool_manifest("workers"))
    kubeconfig = controlplane.admin_kubeconfig

    code, out, err = await run_check("-f", manifest, "--kubeconfig", kubeconfig)
    assert code == 0, out + err
    lines = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert lines
    assert all(line.startswith("✓") for line in lines), out
    for subject in (
        f"VsphereAgentPool {world.namespace}/workers",
        f"InfraEnv {world.namespace}/discovery",
        "ISO URL http://127.0.0.1:",
        f"Secret {world.namespace}/vsphere-credentials",
        f"vCenter {world.vcsim.server}",
        f"AgentMachines in {world.control_plane_namespace}",
        f"NodePool {world.namespace}/workers",
        "RBAC of ServiceAccount agent-forge-system/agent-forge-controller-manager for "
        f"reconciling in namespace {world.namespace}",
        "RBAC of ServiceAccount agent-forge-system/agent-forge-controller-manager for "
        f"reconciling in namespace {world.control_plane_namespace}",
        "RBAC of ServiceAccount agent-forge-system/agent-forge-controller-manager for "
        "leader election in namespace agent-forge-system",
        "RBAC of ServiceAccount agent-forge-system/agent-forge-controller-manager for "
        f"reading credentials in namespace {world.namespace}",
    ):
        assert any(line.startswith(f"✓ {subject}") for line in lines), (subject, out)
    assert "1 carry hypershift.openshift.io/nodePool" in out
    assert "HTTP 200, 1.0 MiB (1048576 bytes)" in out
    assert "all checks passed" in out
    assert world.vcsim.password not in out + err

    await world.create_pool("workers")
    pool_ref = f"{world.namespace}/workers"
    code, out, err = await run_check("--pool", pool_ref, "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["ok"] is True
    assert report["exitCode"] == 0
    statuses = {(i["check"], i["status"]) for i in items_of(report, "workers")}
    assert {s for _, s in statuses} == {"pass"}
    checks = {c for c, _ in statuses}
    expected = {"spec", "infraenv", "iso-url", "secret", "vsphere", "agentmachines", "nodepool"}
    assert expected | {"rbac"} <= checks
    assert world.vcsim.password not in out + err

    # A second pool for the same NodePool makes both ambiguous; a missing pool is named.
    await world.create_pool("twin", nodepool="workers")
    code, out, err = await run_check("--pool", pool_ref, "--kubeconfig", kubeconfig)
    assert code == 1, out + err
    assert fail_lines(out) == [
        f"✗ NodePool {pool_ref}: also served by VsphereAgentPool {world.namespace}/twin (its "
        "AgentMachines would match two pools: reported, never served) → delete the other pool, "
        "or point one of them at another NodePool"
    ]
    code, out, err = await run_check(
        "--pool", f"{world.namespace}/nope", "--kubeconfig", kubeconfig
    )
    assert code == 1, out + err
    assert fail_lines(out) == [
        f"✗ VsphereAgentPool {world.namespace}/nope: not found → check the name "
        "(kubectl get vap -A)"
    ]


async def test_each_bad_input_fails_with_a_line_naming_it_in_one_run(
    controlplane: ControlPlane, operator_kubeconfig: Path, world: World, tmp_path: Path
) -> None:
    ns = world.namespace
    await prepare_good_world(world)
    await world.create_infraenv("empty-url", manual_status={})
    await world.create_infraenv("gone-iso")
    world.iso_server.fail(ns, "gone-iso", status=404)
    await world.create_credentials("no-password", omit=("password",))
    pools = [
        world.pool_manifest("no-infraenv", infraenv="missing"),
        world.pool_manifest("empty-url", infraenv="empty-url"),
        world.pool_manifest("iso-404", infraenv="gone-iso"),
        world.pool_manifest("no-password", secret="no-password"),
        world.pool_manifest("bad-dsc", overrides={"vsphere": {"datastoreCluster": "no-dsc"}}),
        world.pool_manifest("bad-net", overrides={"vsphere": {"network": "no-net"}}),
    ]
    manifest = write_manifests(tmp_path / "pools.yaml", *pools)

    code, out, err = await run_check("-f", manifest, "--kubeconfig", controlplane.admin_kubeconfig)
    assert code == 1, out + err
    lines = fail_lines(out)
    expected = [
        f"✗ InfraEnv {ns}/missing: not found",
        f"✗ InfraEnv {ns}/empty-url: has no status.isoDownloadURL",
        f"✗ ISO URL {world.iso_server.base_url}/images/{ns}/gone-iso/discovery.iso: answers "
        "HTTP 404",
        f"✗ Secret {ns}/no-password: has no key 'password' (or it is empty) → add it",
        "✗ datastore cluster no-dsc:",
        "✗ network no-net:",
    ]
    for start in expected:
        assert any(line.startswith(start) for line in lines), (start, out)
    assert len(lines) == len(expected), out  # nothing else failed
    assert all("→" in line for line in lines), "every failure names its fix"
    assert "6 failed (6 problems)" in out
    assert world.vcsim.password not in out + err

    code, out, err = await run_check(
        "-f", manifest, "--kubeconfig", controlplane.admin_kubeconfig, "-o", "json"
    )
    assert code == 1, out + err
    report = json.loads(out)
    assert [p["ok"] for p in report["pools"]] == [False] * 6
    assert set(failed(report, "no-infraenv")) == {"infraenv"}
    assert set(failed(report, "empty-url")) == {"infraenv"}
    assert set(failed(report, "iso-404")) == {"iso-url"}
    assert set(failed(report, "no-password")) == {"secret"}
    assert [i["status"] for i in items_of(report, "no-password") if i["check"] == "vsphere"] == [
        "skip"
    ]
    assert set(failed(report, "bad-dsc")) == {"vsphere"}
    assert "set spec.vsphere.datastoreCluster" in json.dumps(items_of(report, "bad-dsc"))
    assert set(failed(report, "bad-net")) == {"vsphere"}
    assert world.vcsim.password not in out + err


async def test_a_secret_of_another_namespace_fails_until_it_lists_the_pools(
    controlplane: ControlPlane, world: World, tmp_path: Path
) -> None:
    """The operator's namespace boundary, as the check reports it to a user who may read
    the Secret: refused while unannotated, passed once it lists the pool's namespace."""
    await prepare_good_world(world)
    tenant = controlplane.create_namespace(f"{world.namespace[:50]}-tenant")
    borrower = world.pool_manifest(
        "borrower",
        overrides={"vsphere": {"credentialsSecretRef": {"namespace": world.namespace}}},
    )
    borrower["metadata"]["namespace"] = tenant
    manifest = write_manifests(tmp_path / "pool.yaml", borrower)
    kubeconfig = controlplane.admin_kubeconfig
    subject = f"Secret {world.namespace}/vsphere-credentials"

    code, out, err = await run_check("-f", manifest, "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 1, out + err
    report = json.loads(out)
    (refusal,) = failed(report, "borrower")["secret"]
    assert refusal.startswith(f"{subject}: in another namespace than the pool ({tenant})")
    assert "CredentialsNotShared" in refusal
    assert [i["status"] for i in items_of(report, "borrower") if i["check"] == "vsphere"] == [
        "skip"
    ]

    await world.client.patch_merge(
        kinds.SECRET,
        namespace=world.namespace,
        name="vsphere-credentials",
        patch={"metadata": {"annotations": {names.ANNOTATION_ALLOWED_NAMESPACES: tenant}}},
    )
    code, out, err = await run_check("-f", manifest, "--kubeconfig", kubeconfig, "-o", "json")
    report = json.loads(out)
    secret_items = [i for i in items_of(report, "borrower") if i["check"] == "secret"]
    assert [(i["status"], i["subject"]) for i in secret_items] == [("pass", subject)], out + err
    assert secret_items[0]["message"].startswith(f"shared with namespace {tenant}")
    vcenter = [i["status"] for i in items_of(report, "borrower") if i["check"] == "vsphere"]
    assert vcenter == ["pass"]
    assert world.vcsim.password not in out + err


async def test_a_serviceaccount_without_the_clusterrole_fails_the_rbac_items(
    controlplane: ControlPlane, world: World, tmp_path: Path
) -> None:
    ns = world.namespace
    await prepare_good_world(world)
    own_kubeconfig = controlplane.serviceaccount_kubeconfig(ns, "no-role")  # creates it
    manifest = write_manifests(tmp_path / "pool.yaml", world.pool_manifest("workers"))

    code, out, err = await run_check(
        "-f",
        manifest,
        "--kubeconfig",
        controlplane.admin_kubeconfig,
        "--as-serviceaccount",
        f"{ns}/no-role",
        "-o",
        "json",
    )
    assert code == 1, out + err
    report = json.loads(out)
    assert set(failed(report, "workers")) == {"rbac"}
    rbac = [i for i in items_of(report, "workers") if i["check"] == "rbac"]
    namespaces = {ns, world.control_plane_namespace}
    for namespace in namespaces:
        (item,) = [
            i for i in rbac if i["subject"].endswith(f"reconciling in namespace {namespace}")
        ]
        assert item["status"] == "fail"
        assert item["subject"].startswith(f"RBAC of ServiceAccount {ns}/no-role")
        assert (
            "agentmachines.capi-provider.agent-install.openshift.io [list, patch, watch]"
            in (item["message"])
        )
        assert f"--serviceaccount={ns}:no-role" in item["fix"]
        assert "agent-forge-manager-role" in item["fix"]
    (reader,) = [i for i in rbac if "reading credentials" in i["subject"]]
    assert reader["subject"].endswith(f"in namespace {ns}")
    assert reader["message"] == "denied: secrets [get]"
    assert reader["fix"].startswith(
        f"kubectl -n {ns} create rolebinding agent-forge-credentials-reader "
        f"--clusterrole=agent-forge-credentials-reader --serviceaccount={ns}:no-role"
    )

    # With the ServiceAccount's own kubeconfig: it may not create SubjectAccessReviews, so
    # its own permissions are reviewed (and it may not even read the InfraEnv).
    code, out, err = await run_check("-f", manifest, "--kubeconfig", own_kubeconfig)
    assert code == 1, out + err
    assert "reviewing your own permissions" in out
    assert any(line.startswith("✗ RBAC of you") for line in fail_lines(out)), out
    assert any(line.startswith(f"✗ InfraEnv {ns}/discovery: could not") for line in fail_lines(out))


async def test_invalid_yaml_and_invalid_specs_exit_2_with_field_messages(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("apiVersion: v1\nkind: [\n")
    code, out, err = await run_check("-f", bad_yaml)
    assert code == 2, out + err
    assert f"{bad_yaml}: not valid YAML: line 3, column 1" in err

    pool = samples.pool_manifest(
        name="workers",
        namespace="ns",
        control_plane_namespace="cp",
        hosted_cluster="hc1",
        nodepool="workers",
        infraenv="discovery",
        secret="vsphere-credentials",
        labels={"agent-pool": "workers"},
    )
    pool["spec"]["template"]["numCPUs"] = 500
    del pool["spec"]["vsphere"]["network"]
    pool["spec"]["vsphere"]["netwrk"] = "VM Network"
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    manifest = write_manifests(tmp_path / "pool.yaml", pool, other)
    code, out, err = await run_check("-f", manifest, "-o", "json")
    assert code == 2, out + err
    errors = {(e["source"], e["field"], e["message"]) for e in json.loads(out)["errors"]}
    first, second = f"{manifest} document 1", f"{manifest} document 2"
    assert (first, "spec.template.numCPUs", "Input should be less than or equal to 128") in errors
    assert (first, "spec.vsphere.network", "Field required") in errors
    assert any(s == first and f == "spec.vsphere.netwrk" for s, f, _ in errors)
    assert any(s == second and "ConfigMap" in m for s, _, m in errors)

    code, out, err = await run_check("-f", manifest)
    assert code == 2
    assert f"✗ {first}: spec.template.numCPUs: Input should be less than or equal to 128" in err


@pytest.mark.parametrize("ref", ["no-slash", "a/b/c"])
async def test_a_bad_pool_reference_is_a_usage_error(ref: str) -> None:
    code, _, err = await run_check("--pool", ref)
    assert code == 2
    assert "is not NAMESPACE/NAME" in err
