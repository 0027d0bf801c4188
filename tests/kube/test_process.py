"""The operator process: probes, metrics, signals and exit codes, against the real API."""

from __future__ import annotations

import asyncio
import base64
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import names
from agentforge.api.kinds import AGENT
from agentforge.kube import client
from sim import paths
from sim.controlplane.control import ProxyControl
from sim.controlplane.controlplane import ControlPlane
from sim.operator import (
    PROBE_STAMP,
    MetricsReader,
    OperatorProcess,
    first_to_log,
    install_operator,
    metrics_reader,
)

NAMESPACE = names.DEPLOYMENT_NAMESPACE


@pytest.fixture(scope="module")
def operator_kubeconfig(controlplane: ControlPlane) -> Path:
    return install_operator(controlplane)


@pytest.fixture(scope="module")
def reader(controlplane: ControlPlane, operator_kubeconfig: Path) -> MetricsReader:
    return metrics_reader(controlplane)


NO_CREDENTIALS = ("--credential-namespace", NAMESPACE)
"""Required when watching all namespaces; no pool here reads a Secret."""


def _leader_args(lease_name: str) -> list[str]:
    return [
        *NO_CREDENTIALS,
        "--leader-elect",
        "--leader-election-namespace",
        NAMESPACE,
        "--leader-election-id",
        lease_name,
    ]


@pytest.fixture
async def probe_operator(
    operator_kubeconfig: Path, reader: MetricsReader, tmp_path: Path
) -> AsyncIterator[tuple[OperatorProcess, str]]:
    """An operator with the probe controller, leading its own Lease."""
    lease_name = f"t-{secrets.token_hex(4)}"
    op = OperatorProcess(
        operator_kubeconfig,
        *_leader_args(lease_name),
        log_path=tmp_path / "op.log",
        probe=True,
        metrics=reader,
    )
    async with op:
        await op.wait_ready(within=60)
        await op.wait_log("became leader", within=20)
        yield op, lease_name


def _agent(name: str, *, stamp: float | None = None) -> dict[str, Any]:
    annotations = {PROBE_STAMP: repr(stamp)} if stamp is not None else {}
    return {
        "apiVersion": AGENT.api_version,
        "kind": AGENT.kind,
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"approved": False, "role": "worker"},
    }


async def test_readyz_is_503_until_the_caches_synced_then_200(
    operator_kubeconfig: Path, proxy: ProxyControl, tmp_path: Path
) -> None:
    await proxy.set_latency(1500)  # every LIST takes 1.5 s: the unsynced state is visible
    async with OperatorProcess(
        operator_kubeconfig, *NO_CREDENTIALS, log_path=tmp_path / "op.log"
    ) as op:
        await op.wait_serving(within=30)
        assert await op.readyz() == 503
        assert await op.healthz() == 200  # alive while not ready
        assert not [e for e in op.log_entries() if e.get("msg") == "caches synced"]
        await proxy.set_latency(0)
        await op.wait_ready(within=30)
        synced = await op.wait_log("caches synced", within=1)
        assert set(synced["objects"]) == {
            "vsphereagentpools",
            "vsphereagents",
            "agents",
            "agentmachines",
            "machines",
            "infraenvs",
        }


async def test_sigterm_drains_releases_and_exits_0_within_a_few_seconds(
    probe_operator: tuple[OperatorProcess, str],
) -> None:
    op, _ = probe_operator
    op.terminate()
    started = time.monotonic()
    assert await op.wait_exit(within=10) == 0
    assert time.monotonic() - started < 3
    messages = [e.get("msg") for e in op.log_entries()]
    assert messages.index("received SIGTERM, shutting down") < messages.index(
        "released leader lease"
    )
    assert messages[-1] == "shut down"


async def test_metrics_expose_workqueue_leader_reconcile_and_client_metrics(
    probe_operator: tuple[OperatorProcess, str], kube: client.KubeClient, namespace: str
) -> None:
    op, lease_name = probe_operator
    await kube.create(AGENT, _agent("metrics-probe", stamp=time.time()), namespace=namespace)
    key = f"{namespace}/metrics-probe"
    await op.wait_log("probe reconciled", within=10, where={"key": key})
    assert await op.metric("leader_election_master_status", name=lease_name) == 1
    assert await op.metric("workqueue_depth", name="probe") is not None
    assert (await op.metric("workqueue_adds_total", name="probe") or 0) >= 1
    assert (await op.metric("agent_forge_reconcile_total", controller="probe") or 0) >= 1
    assert (
        await op.metric("agent_forge_event_to_reconcile_seconds_count", controller="probe") or 0
    ) >= 1
    assert (await op.metric("agent_forge_kube_requests_total", verb="list") or 0) >= 1
    assert await op.metric("agent_forge_build_info", version="0.1.0") == 1


async def test_only_the_leader_runs_controllers_and_a_new_leader_reconciles_everything(
    operator_kubeconfig: Path,
    reader: MetricsReader,
    kube: client.KubeClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    lease_name = f"t-{secrets.token_hex(4)}"
    args = _leader_args(lease_name)
    a, b = (
        OperatorProcess(
            operator_kubeconfig, *args, log_path=tmp_path / f"{n}.log", probe=True, metrics=reader
        )
        for n in ("a", "b")
    )
    async with a, b:
        await asyncio.gather(a.wait_ready(within=60), b.wait_ready(within=60))
        leader_op = await first_to_log([a, b], "became leader", within=20)
        standby = b if leader_op is a else a
        await kube.create(AGENT, _agent("gated", stamp=time.time()), namespace=namespace)
        key = f"{namespace}/gated"
        await leader_op.wait_log("probe reconciled", within=10, where={"key": key})
        # The standby has no controller to reconcile with: no probe work queue exists,
        # so no waiting can make it reconcile; and it logged no reconcile.
        assert await standby.metric("leader_election_master_status", name=lease_name) == 0
        assert await standby.metric("workqueue_adds_total", name="probe") is None
        assert await leader_op.metric("workqueue_adds_total", name="probe") is not None
        assert not [e for e in standby.log_entries() if e["msg"] == "probe reconciled"]
        leader_op.terminate()
        assert await leader_op.wait_exit(within=10) == 0
        # The new leader builds its controllers on a warm cache: every cached object
        # is replayed to them, so the Agent changed before the hand-over is reconciled.
        entry = await standby.wait_log("probe reconciled", within=15, where={"key": key})
        assert entry["latency_s"] > 0


def test_a_bad_setting_exits_2_with_one_message_naming_the_flag_and_no_traceback() -> None:
    env = dict(os.environ, AGENT_FORGE_RETRY_PERIOD="soon")
    result = subprocess.run(
        [sys.executable, "-m", "agentforge", "run", "--max-concurrent-reconciles", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=paths.REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "invalid --max-concurrent-reconciles '0'" in result.stderr
    assert "invalid --retry-period (from AGENT_FORGE_RETRY_PERIOD) 'soon'" in result.stderr


ARBITRARY_UID = 12345  # no passwd entry: OpenShift's restricted SCC picks one like it


def _owned_copy(kubeconfig: Path, directory: Path, uid: int) -> Path:
    """`kubeconfig` with its CA embedded, in `directory`, both readable by `uid` alone."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        ca = Path(entry["cluster"].pop("certificate-authority"))
        entry["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    copy = directory / "kubeconfig"
    copy.touch(mode=0o600)
    copy.write_text(yaml.safe_dump(config))
    for path in (directory, copy):
        os.chown(path, uid, 0)
    return copy


def _setpriv(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", "--regid=0", "--clear-groups"]


def _python_for(uid: int) -> str:
    """An interpreter `uid` can execute (for this one the operator's configuration probe
    child too): this one, else the system's of the same version (a virtualenv whose
    base interpreter lives in root's home cannot be run by another UID)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, shutil.which(version, path="/usr/local/bin:/usr/bin")):
        check = [*_setpriv(uid), "/bin/sh", "-c", '"$0" -c pass', str(python)]
        if python and subprocess.run(check, capture_output=True, check=False).returncode == 0:
            return python
    raise AssertionError(f"no {version} that UID {uid} can execute")


def _identity(pid: int) -> tuple[list[str], list[str], list[str], list[bytes]]:
    """The process' real and effective UID and GID, its groups and its environment."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return status["Uid"].split()[:2], status["Gid"].split()[:2], status["Groups"].split(), environ


async def test_an_arbitrary_uid_without_home_starts_and_serves(
    operator_kubeconfig: Path, reader: MetricsReader, tmp_path: Path
) -> None:
    """As a restricted pod runs: a UID with no passwd entry, group 0, HOME unset, an
    explicit --kubeconfig. Nothing may need a home directory (needs root to switch UID)."""
    with pytest.raises(KeyError):
        pwd.getpwuid(ARBITRARY_UID)
    env = {k: v for k, v in os.environ.items() if k != "HOME"}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # this environment's packages
    python = _python_for(ARBITRARY_UID)
    with tempfile.TemporaryDirectory(prefix="agentforge-uid-") as private:
        kubeconfig = _owned_copy(operator_kubeconfig, Path(private), ARBITRARY_UID)
        op = OperatorProcess(
            kubeconfig,
            "--credential-namespace=default",  # watching all namespaces needs the list
            log_path=tmp_path / "op.log",
            env=env,
            uid=ARBITRARY_UID,
            python=python,
        )
        async with op:
            await op.wait_ready(within=60)
            uid, gid, groups, environ = _identity(op.pid)
            assert (uid, gid, groups) == ([str(ARBITRARY_UID)] * 2, ["0", "0"], [])
            assert not [e for e in environ if e.startswith(b"HOME=")]
            code, body = await op.get_metrics(token=reader.token)
            assert code == 200, body
            assert "agent_forge_build_info" in body


def test_watching_all_namespaces_without_credential_namespaces_exits_2_naming_the_fix() -> None:
    """An empty list of credentials namespaces is no grant of all: the process stops."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"AGENT_FORGE_NAMESPACE", "AGENT_FORGE_CREDENTIAL_NAMESPACE"}
    }
    result = subprocess.run(
        [sys.executable, "-m", "agentforge", "run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=paths.REPO_ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--credential-namespace is required when the operator watches all" in result.stderr
    assert names.CREDENTIALS_READER_ROLE in result.stderr
