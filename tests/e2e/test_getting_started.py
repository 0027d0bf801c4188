"""docs/getting-started.md, followed literally: every `<!-- runnable -->` block is run.

The guide is written against `make demo KEEP=1`. This test builds the same world the
kept demo leaves behind (namespace `demo`, hosted control plane namespace
`clusters-demo`, hosted cluster `demo`, InfraEnv `discovery`, Secret
`vsphere-credentials`, pool `workers` at one bound replica, an operator holding the
default Lease in `agent-forge-system`) on the session's control plane and vcsim, then
runs each marked shell block in order with `bash -euo pipefail`, `KUBECONFIG`
pointing at the admin kubeconfig (the one step the guide takes from the demo's
state directory) and the checkout as working directory. A block that exits non-zero
fails the test with its output; the guide's own `kubectl wait` lines are the checks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentforge.api import names
from sim.controlplane import ControlPlane
from sim.operator import OperatorProcess, grant_credentials
from sim.paths import REPO_ROOT, binary
from sim.vcsim import Vcsim
from sim.world import World
from tests.e2e.support import E2E_TIMINGS, destroy_vms, eventually, wait_converged

GUIDE = REPO_ROOT / "docs" / "getting-started.md"
MARKER = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 600

# The names the guide uses are the demo's (sim/demo.py); tests/unit/test_docs.py pins them.
NAMESPACE = "demo"
CONTROL_PLANE_NAMESPACE = "clusters-demo"
HOSTED_CLUSTER = "demo"


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, script) of every fenced `sh` block right after the marker line."""
    lines = text.splitlines()
    blocks: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = lines[index + 1].strip() if index + 1 < len(lines) else ""
        if fence != "```sh":
            raise AssertionError(f"{GUIDE.name}:{index + 1}: {MARKER} must precede a ```sh block")
        body: list[str] = []
        for inner in lines[index + 2 :]:
            if inner.strip() == "```":
                break
            body.append(inner)
        blocks.append((index + 3, "\n".join(body) + "\n"))
    return blocks


@pytest.fixture
async def demo_world(
    controlplane: ControlPlane, vcsim: Vcsim, operator_kubeconfig: Path, tmp_path: Path
) -> AsyncIterator[tuple[World, OperatorProcess]]:
    controlplane.create_namespace(NAMESPACE)
    grant_credentials(controlplane, NAMESPACE)  # docs/installation.md#credentials-namespaces
    operator = OperatorProcess(
        operator_kubeconfig,
        "--leader-elect",
        "--leader-election-namespace",
        names.DEPLOYMENT_NAMESPACE,
        "--namespace",
        NAMESPACE,
        "--namespace",
        CONTROL_PLANE_NAMESPACE,
        log_path=tmp_path / "operator.log",
    )
    async with World(
        controlplane=controlplane,
        vcsim=vcsim,
        namespace=NAMESPACE,
        control_plane_namespace=CONTROL_PLANE_NAMESPACE,
        hosted_cluster=HOSTED_CLUSTER,
        timings=E2E_TIMINGS,
        iso_size=1024 * 1024,
    ) as world:
        try:
            await world.create_infraenv()
            await world.create_credentials()
            await world.create_pool("workers", eject_after_install=True)  # as sim/demo.py
            operator.start()
            await operator.wait_ready(within=60)
            # A Lease left by an earlier test's operator expires within its 15 s.
            await operator.wait_log("became leader", within=60)
            await world.nodepool("workers").scale(1)
            await wait_converged(world, pool="workers", nodepool="workers", replicas=1)
            yield world, operator
        finally:
            await operator.stop()
            leftovers = (await world.snapshot()).vms
    await destroy_vms(vcsim, leftovers)
    assert vcsim.password not in operator.log_text(), "the operator logged a password"
    world.check()


def test_guide_marks_shell_blocks_runnable() -> None:
    blocks = runnable_blocks(GUIDE.read_text())
    assert len(blocks) >= 10
    scripts = "\n".join(script for _, script in blocks)
    assert "scripts.demo_nodepool demo/burst --replicas 2" in scripts
    assert "--replicas 0" in scripts


async def test_getting_started_guide_runs_against_a_kept_demo_world(
    demo_world: tuple[World, OperatorProcess], controlplane: ControlPlane
) -> None:
    kubectl = binary("kubectl")  # fails with the make target that builds it
    world, operator = demo_world
    env = {
        **os.environ,
        "KUBECONFIG": str(controlplane.admin_kubeconfig),
        "PATH": f"{kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for line, script in runnable_blocks(GUIDE.read_text()):
        result = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, (
            f"{GUIDE.name}:{line}: block exited {result.returncode}\n--- script\n{script}"
            f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
            f"--- operator log (tail)\n{operator.log_text()[-6000:]}"
        )

    snap = await eventually(
        world.snapshot,
        lambda s: not s.vms_of_pool("burst") and s.pool("burst") is None,
        within=60,
        what="the guide's pool and its VMs gone",
    )
    assert len(snap.vms_of_pool("workers")) == 1, "the demo's own pool is untouched"
