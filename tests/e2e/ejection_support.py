"""Helpers of the ISO ejection e2e tests: the operator with a crash point, the world's VMs,
the simulator's request log per VM, and holding installation back.

- `run_operator(harness, crash_at=...)` (re)starts the fixture's operator process with
  the test-only `AGENT_FORGE_TEST_CRASH_AT` hook set (or cleared); `crashed(harness)`
  waits for the process to have exited with 137 at that point. Boundaries that can be
  seen from outside (a disconnect in flight) are killed with SIGKILL instead.
- `disconnects` / `answers` read vcsim's request log for one VM: ReconfigVM_Task calls
  that disconnect a CD-ROM, and AnswerVM calls with their question ids.
- `hold_installation` / `release_installation` stretch the Assisted Installer's
  install time, so a test can act while Agents are Bound but not Installed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.reconcilers.ejection import run as ejection_run
from agentforge.vsphere.model import markers
from sim.actors.vcenter import VmFact
from sim.operator import MetricsReader, OperatorProcess
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from sim.world.snapshot import condition_of
from tests.e2e.conftest import OPERATOR_KEY
from tests.e2e.support import E2E_TIMINGS, OperatorHarness, eventually, wait_converged

__all__ = [
    "POOL",
    "answers",
    "crashed",
    "disconnects",
    "ejected_reasons",
    "hold_installation",
    "iso_ejected",
    "pending_questions",
    "pool_iso",
    "release_installation",
    "run_operator",
    "set_ejection",
    "set_up",
    "unstarted_operator",
    "vm_of",
    "wait_reasons",
]

POOL = "workers"
WAIT_S = 90.0


# --- the operator --------------------------------------------------------------------------


@pytest.fixture
async def unstarted_operator(
    request: pytest.FixtureRequest,
    operator_kubeconfig: Path,
    metrics_reader: MetricsReader,
    world: World,
    tmp_path: Path,
) -> AsyncIterator[OperatorHarness]:
    """The `operator` fixture's harness, not started: the test starts it (`run_operator`),
    with the crash hook when it wants one. Failure reports attach its log as usual."""
    harness = OperatorHarness(
        kubeconfig=operator_kubeconfig,
        namespaces=(world.namespace, world.control_plane_namespace),
        log_path=tmp_path / "operator.log",
        metrics=metrics_reader,
    )
    request.node.stash[OPERATOR_KEY] = harness
    try:
        yield harness
    finally:
        await harness.stop()
    assert world.vcsim.password not in harness.log_text(), "the operator logged a password"


async def run_operator(harness: OperatorHarness, *, crash_at: str | None = None) -> None:
    """Kill -9 what runs, start a fresh operator (with the crash hook when given)."""
    if harness.process is not None and harness.process.running():
        harness.process.kill()
        await harness.process.wait_exit(within=10)
    env = dict(os.environ)
    env.pop(ejection_run.CRASH_ENV, None)
    if crash_at is not None:
        env[ejection_run.CRASH_ENV] = crash_at
    args = ["--max-concurrent-reconciles", "2"]
    for namespace in harness.namespaces:
        args += ["--namespace", namespace]
    harness.runs += 1
    harness.process = OperatorProcess(
        harness.kubeconfig,
        *args,
        log_path=harness.log_path,
        env=env,
        name=f"operator#{harness.runs}",
        metrics=harness.metrics,
    ).start()
    await harness.process.wait_ready(within=60)


async def crashed(harness: OperatorHarness, *, point: str, within: float = WAIT_S) -> None:
    """The operator exited at the crash point (exit 137, the hook's log line written)."""
    assert harness.process is not None
    code = await harness.process.wait_exit(within=within)
    assert code == ejection_run.CRASH_EXIT_CODE, f"operator exited with {code}, not at {point}"
    assert any(e.get("crash_point") == point for e in harness.process.log_entries()), (
        f"the operator did not stop at crash point {point}"
    )


# --- the world -----------------------------------------------------------------------------


async def set_up(world: World, pool: str = POOL, **fields: Any) -> None:
    await world.create_infraenv()
    await world.create_credentials()
    await world.create_pool(pool, folder=f"e2e/{world.namespace}", **fields)


async def set_ejection(world: World, on: bool, pool: str = POOL) -> None:
    await world.client.patch_merge(
        kinds.VSPHERE_AGENT_POOL,
        namespace=world.namespace,
        name=pool,
        patch={"spec": {"iso": {"ejectAfterInstall": on}}},
    )


def hold_installation(world: World) -> None:
    """Bound Agents start installing but do not finish until released."""
    world.assisted.timings = dataclasses.replace(world.assisted.timings, install=3600.0)


def release_installation(world: World) -> None:
    world.assisted.timings = dataclasses.replace(
        world.assisted.timings, install=E2E_TIMINGS.install
    )
    world.assisted.kick()


async def bound(world: World, replicas: int, pool: str = POOL) -> Snapshot:
    """`replicas` workers bound (installation held or not)."""
    return await wait_converged(world, pool=pool, nodepool=pool, replicas=replicas)


def vas_of(snap: Snapshot, pool: str = POOL) -> list[dict[str, Any]]:
    return [
        va
        for va in snap.vsphere_agents
        if (va["metadata"].get("labels") or {}).get(names.LABEL_POOL) == pool
    ]


def vm_of(snap: Snapshot, va: dict[str, Any]) -> VmFact:
    name = va["metadata"]["name"]
    found = [vm for vm in snap.vms if vm.extra_config.get(markers.PREFIX + "vsphere-agent") == name]
    assert len(found) == 1, f"VsphereAgent {name} has {len(found)} VMs"
    return found[0]


def iso_ejected(va: dict[str, Any]) -> dict[str, Any]:
    return condition_of(va, "ISOEjected") or {}


def ejected_reasons(snap: Snapshot, pool: str = POOL) -> dict[str, str]:
    """VsphereAgent name -> its ISOEjected reason ("" when it has none)."""
    return {va["metadata"]["name"]: iso_ejected(va).get("reason", "") for va in vas_of(snap, pool)}


async def wait_reasons(
    world: World, reasons: Iterable[str], *, pool: str = POOL, within: float = WAIT_S
) -> Snapshot:
    """Every VsphereAgent of the pool reports one of `reasons`."""
    wanted = set(reasons)

    def done(snap: Snapshot) -> bool:
        got = ejected_reasons(snap, pool)
        return bool(got) and set(got.values()) <= wanted

    return await eventually(
        world.snapshot, done, within=within, what=f"every ISOEjected reason in {sorted(wanted)}"
    )


def pool_iso(snap: Snapshot, pool: str = POOL) -> str:
    """`[iso-ds] <path>` of the pool's current cached ISO."""
    path = (snap.pool_status(pool).get("iso") or {}).get("path")
    assert path, f"pool {pool} has no cached ISO"
    return f"[iso-ds] {path}"


# --- the simulator's request log -------------------------------------------------------------


def _on(entry: dict[str, Any], moref: str) -> bool:
    return (entry.get("target") or {}).get("value") == moref


async def disconnects(control: VcsimControl, moref: str, *, since: int = 0) -> list[dict[str, Any]]:
    """ReconfigVM_Task calls on the VM that disconnect (or change the medium of) a CD-ROM,
    oldest first, after log entry `since` (a mark taken before the operator's turn)."""
    return [
        e
        for e in await control.request_log("ReconfigVM_Task", since=since)
        if e.get("cdrom_disconnect") and _on(e, moref)
    ]


async def answers(control: VcsimControl, moref: str, *, since: int = 0) -> list[dict[str, Any]]:
    """AnswerVM calls on the VM (`question_id`, `answer_choice`), oldest first."""
    return [e for e in await control.request_log("AnswerVM", since=since) if _on(e, moref)]


async def pending_questions(control: VcsimControl, moref: str) -> list[dict[str, Any]]:
    """The VM's pending questions in queue order (`id`, `message_id`, `shown`, ...)."""
    return [q for q in await control.questions() if q.get("vm") == moref]
