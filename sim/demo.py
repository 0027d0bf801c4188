"""`make demo` (`python -m sim.demo [--keep]`): the capacity bridge end to end, on one machine.

Starts etcd + kube-apiserver + the counting proxy and govmomi's vcsim, installs the
CRDs and RBAC generated from the code, and runs two operator replicas with leader
election as the operator's ServiceAccount; shows that both synced and which one
leads. Then the simulated world (`sim.world`: image service, InfraEnv, NodePool,
CAPI agent provider, Assisted Installer) gets an InfraEnv, vCenter credentials and a
VsphereAgentPool, and the sample NodePool `demo/workers` is scaled 0 -> 3 -> 1 -> 0
while live tables show the pool's counts, the VMs in vcsim, the Agents and the
Machines. The pool has `spec.iso.ejectAfterInstall: true` (the seed's headline
feature): once a worker reports Installed=True its discovery ISO is ejected, and the
guest of one VM holds its CD-ROM door locked (vcsim's fault injection), so vCenter
asks whether to override the lock and the operator answers that one question, once.
Between 3 and 1 the leader gets SIGTERM and the standby finishes the job. A summary
closes: how long each step took, what vCenter was asked to do, the ISO ejections and
the lock question answered, bytes of ISO served, API requests of the operator,
leader transitions, broken rules (none).

`--keep` stops at 1 replica and keeps everything running until Ctrl-C, printing the
kubeconfig and how to look around (kubectl, curl, govc). State lives in
`demo-state/` (ignored by git) so its paths stay the same between runs; a normal
exit stops every process and removes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from agentforge.api import names
from agentforge.api.kinds import LEASE
from agentforge.kube import client, config
from sim import paths
from sim.actors import DEMO_TIMINGS
from sim.controlplane import ControlPlane
from sim.operator import (
    MetricsReader,
    OperatorProcess,
    first_to_log,
    grant_credentials,
    install_operator,
    metrics_reader,
    operator_identity,
)
from sim.vcsim import Vcsim
from sim.world import Snapshot, World
from sim.world.render import world_view

STATE = paths.REPO_ROOT / "demo-state"
LEASE_NAME = "agent-forge.containeroo.ch"
NAMESPACE = names.DEPLOYMENT_NAMESPACE
POOL_NAMESPACE = "demo"
CONTROL_PLANE_NAMESPACE = "clusters-demo"
HOSTED_CLUSTER = "demo"
POOL = "workers"
STEP_TIMEOUT_S = 240.0
console = Console()


class DemoStuck(RuntimeError):
    """A step did not converge in time; the message shows the world."""


def _claim_state_dir() -> Path:
    """A fresh `demo-state/`, refusing to clobber a demo that is still running."""
    pid_file = STATE / "demo.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            os.kill(pid, 0)
            console.print(
                f"[red]a demo is still running (pid {pid}); stop it with Ctrl-C in its "
                f"terminal or `kill {pid}`."
            )
            raise SystemExit(1)
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    pid_file.write_text(str(os.getpid()))
    return STATE


# --- part 1: the operator replicas (sync and leadership) -------------------------------


async def _lease(api: client.KubeClient) -> dict[str, Any]:
    return dict((await api.get(LEASE, namespace=NAMESPACE, name=LEASE_NAME))["spec"])


async def _replica_row(op: OperatorProcess) -> list[str]:
    if not op.running():
        return [op.name, str(op.pid), "[dim]exited", "-", "-", "-", "-"]
    samples = await op.metrics()

    def value(metric: str, **labels: str) -> float:
        return sum(
            v
            for n, lab, v in samples
            if n == metric and all(lab.get(k) == w for k, w in labels.items())
        )

    leading = value("leader_election_master_status", name=LEASE_NAME) == 1
    requests = int(value("agent_forge_kube_requests_total"))
    rss = value("process_resident_memory_bytes") / 1024 / 1024
    return [
        op.name,
        str(op.pid),
        "[green]200" if await op.readyz() == 200 else "[red]503",
        "[bold green]leader" if leading else "standby (warm)",
        f"{requests}",
        f"{rss:.0f} MB",
        op.metrics_url,
    ]


async def _show_replicas(api: client.KubeClient, ops: list[OperatorProcess]) -> None:
    replicas = Table(title="operator replicas (python -m agentforge run --leader-elect)")
    for column in ("replica", "pid", "/readyz", "role", "API requests", "RSS", "metrics"):
        replicas.add_column(column)
    for op in ops:
        replicas.add_row(*await _replica_row(op))
    console.print(replicas)
    spec = await _lease(api)
    lease = Table(title=f"Lease {NAMESPACE}/{LEASE_NAME}", show_header=False)
    for key in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime"):
        lease.add_row(key, str(spec.get(key)))
    lease.add_row("leaseTransitions", str(spec.get("leaseTransitions", 0)))
    console.print(lease)


async def _hand_over(
    api: client.KubeClient, leader: OperatorProcess, standby: OperatorProcess
) -> float:
    console.rule("hand-over: SIGTERM to the leader")
    leader.terminate()
    started = time.monotonic()
    code = await leader.wait_exit(within=15)
    exited = time.monotonic() - started
    await standby.wait_log("became leader", within=30)
    took = time.monotonic() - started
    spec = await _lease(api)
    console.print(
        f"{leader.name} exited with code {code} after {exited:.1f} s (drained, released the "
        f"Lease); {standby.name} became leader {took:.1f} s after the signal, well inside "
        f"the {spec.get('leaseDurationSeconds')} s lease (transitions now "
        f"{spec.get('leaseTransitions')})."
    )
    return took


# --- part 2: the capacity bridge -------------------------------------------------------


async def _watch(
    world: World, until: Callable[[Snapshot], bool], *, title: str, within: float
) -> Snapshot:
    """Show the world live until `until` holds (DemoStuck after `within` seconds)."""
    key = f"{world.namespace}/{POOL}"
    deadline = time.monotonic() + within
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            snap = await world.snapshot()
            live.update(
                world_view(
                    snap, pool=POOL, nodepool_key=key, journal=world.journal.tail(8), title=title
                )
            )
            if until(snap):
                break
            if time.monotonic() > deadline:
                raise DemoStuck(f"{title}: not done after {within:.0f} s\n{snap.describe()}")
            await asyncio.sleep(0.5)
    console.line()
    return snap


def _all_ejected(snap: Snapshot) -> bool:
    """Every VsphereAgent of the pool reports ISOEjected=True (its CD-ROM is empty)."""
    return all(
        any(
            c.get("type") == "ISOEjected" and c.get("status") == "True"
            for c in (va.get("status") or {}).get("conditions") or []
        )
        for va in snap.vsphere_agents
    )


async def _scale(world: World, replicas: int) -> float:
    started = time.monotonic()
    key = f"{world.namespace}/{POOL}"
    await world.nodepool(POOL).scale(replicas)
    await _watch(
        world,
        lambda s: (
            s.converged(pool=POOL, nodepool_key=key, replicas=replicas)
            and len(s.installed_agents()) == replicas  # the nodes joined, not just bound
            and _all_ejected(s)  # ejectAfterInstall: the installed workers' ISOs are out
            and (replicas > 0 or not (s.machines or s.agents or s.vsphere_agents))
        ),
        title=f"NodePool {key} scaled to {replicas}",
        within=STEP_TIMEOUT_S,
    )
    took = time.monotonic() - started
    console.print(f"[green]scaled to {replicas}: converged in {took:.1f} s")
    return took


async def _set_up_world(world: World) -> None:
    console.rule("the simulated world: InfraEnv, vCenter credentials, VsphereAgentPool")
    await world.create_infraenv()
    await world.create_credentials()
    await world.create_pool(POOL, eject_after_install=True)
    iso_url = world.infraenvs.expected_url(POOL_NAMESPACE, "discovery")
    console.print(
        f"InfraEnv {POOL_NAMESPACE}/discovery (ISO at {iso_url}), "
        f"Secret {POOL_NAMESPACE}/vsphere-credentials (vcsim {world.vcsim.server}, CA bundle), "
        f"VsphereAgentPool {POOL_NAMESPACE}/{POOL} for NodePool {POOL_NAMESPACE}/{POOL} "
        f"(AgentMachines in {CONTROL_PLANE_NAMESPACE}, VMs in folder dc1/vm/{HOSTED_CLUSTER}, "
        "spec.iso.ejectAfterInstall: true)"
    )


async def _lock_one_door(world: World, vc: Vcsim) -> str:
    """The guest of the first VM that powers on locks its CD-ROM door (before it is
    installed, so its ejection meets the lock); returns the VM's name."""
    while True:
        snap = await world.snapshot()
        running = [vm for vm in snap.vms_of_pool(POOL) if vm.powered_on]
        if running:
            vm = running[0]
            await vc.control.lock_cdrom(vm.moref)
            world.journal.add("guest", f"VM {vm.name} locks its CD-ROM door")
            return vm.name
        await asyncio.sleep(0.2)


async def _ejections(vc: Vcsim) -> tuple[int, int]:
    """CD-ROM disconnects the operator sent, and lock questions it answered."""
    disconnects = [
        e for e in await vc.control.request_log("ReconfigVM_Task") if e.get("cdrom_disconnect")
    ]
    answers = await vc.control.request_log("AnswerVM")
    return len(disconnects), len(answers)


async def _summary(
    cp: ControlPlane,
    vc: Vcsim,
    world: World,
    steps: list[tuple[str, float]],
    api: client.KubeClient,
) -> None:
    counters = await vc.control.counters()
    methods = counters.get("methods") or {}
    iso = world.iso_server.stats()
    requests = await cp.proxy.counts(identity=operator_identity())
    spec = await _lease(api)
    disconnects, answers = await _ejections(vc)
    table = Table(title="summary", show_header=False)
    for step, seconds in steps:
        table.add_row(step, f"{seconds:.1f} s")
    for method in ("CreateVM_Task", "PowerOnVM_Task", "ReconfigVM_Task", "Destroy_Task"):
        table.add_row(f"vCenter {method}", str(methods.get(method, 0)))
    table.add_row(
        "ISO ejections (ejectAfterInstall)",
        f"{disconnects} CD-ROM disconnect(s) of installed workers",
    )
    table.add_row(
        "CD-ROM lock questions answered",
        f"{answers} (the one guest that locked its door; AnswerVM calls)",
    )
    table.add_row(
        "ISO served",
        f"{iso.bytes_served / 1024 / 1024:.1f} MiB in {iso.downloads} download(s), "
        f"{iso.not_modified} not-modified answer(s)",
    )
    table.add_row("operator API requests", str(sum(requests.values())))
    table.add_row("leader transitions", str(spec.get("leaseTransitions", 0)))
    table.add_row("broken rules", "; ".join(world.violations) or "none")
    console.print(table)


def _how_to_use(
    cp: ControlPlane, vc: Vcsim, ops: list[OperatorProcess], state: Path, reader: MetricsReader
) -> None:
    kubeconfig = cp.admin_kubeconfig
    token_file = state / "admin.token"
    token_file.write_text(cp.admin_token)
    token_file.chmod(0o600)
    reader_token = state / "metrics-reader.token"
    reader_token.write_text(reader.token)
    reader_token.chmod(0o600)
    api = f"{cp.server}/apis/agent-forge.containeroo.ch/v1alpha1"
    lines = [
        f"kubeconfig (admin, through the proxy): {kubeconfig}",
        "",
        f"  export KUBECONFIG={kubeconfig}",
        "  kubectl get vap,va -A",
        f"  kubectl get agents -n {POOL_NAMESPACE}; kubectl get agentmachines,machines -n "
        f"{CONTROL_PLANE_NAMESPACE}",
        f"  kubectl get lease -n {NAMESPACE} {LEASE_NAME} -o yaml",
        "",
        "without kubectl:",
        f'  curl --cacert {cp.ca_file} -H "Authorization: Bearer $(cat {token_file})" \\',
        f"       {api}/vsphereagentpools",
        f"  curl ... {api}/vsphereagents",
        "",
        "vCenter (vcsim):",
        *(f"  export {k}={v}" for k, v in vc.govc_env().items()),
        f"  {paths.bin_dir() / 'govc'} ls /dc1/vm/{HOSTED_CLUSTER}",
        "",
    ]
    lines.append(f"/metrics, with the token of {reader.identity} (metrics-reader role):")
    for op in ops:
        if op.running():
            lines.append(
                f'  {op.name}: curl --cacert {reader.ca_file} -H "Authorization: Bearer '
                f'$(cat {reader_token})" {op.metrics_url} ; log {op.log_path}'
            )
    lines += ["", "Ctrl-C stops everything and removes demo-state/."]
    console.rule("running (--keep): look around")
    console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)


async def _wait_for_ctrl_c() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def _demo(cp: ControlPlane, vc: Vcsim, state: Path, *, keep: bool) -> int:
    with console.status("installing CRDs and RBAC generated from the code"):
        kubeconfig = await asyncio.to_thread(install_operator, cp)
        reader = await asyncio.to_thread(metrics_reader, cp)
        await asyncio.to_thread(cp.create_namespace, POOL_NAMESPACE)
        await asyncio.to_thread(grant_credentials, cp, POOL_NAMESPACE)
    cfg = await config.load_config(kubeconfig=cp.admin_kubeconfig, environ={})
    # The pools' Secrets are in POOL_NAMESPACE: the operator may read Secrets there only.
    args = (
        "--leader-elect",
        "--leader-election-namespace",
        NAMESPACE,
        "--credential-namespace",
        POOL_NAMESPACE,
    )
    ops = [
        OperatorProcess(kubeconfig, *args, log_path=state / f"{n}.log", name=n, metrics=reader)
        for n in ("replica-a", "replica-b")
    ]
    world = World(
        controlplane=cp,
        vcsim=vc,
        namespace=POOL_NAMESPACE,
        control_plane_namespace=CONTROL_PLANE_NAMESPACE,
        hosted_cluster=HOSTED_CLUSTER,
        timings=DEMO_TIMINGS,
        iso_size=2 * 1024 * 1024,
    )
    async with client.KubeClient(config=cfg) as api, ops[0], ops[1], world:
        with console.status("waiting for both replicas to sync and one to lead"):
            await asyncio.gather(*(op.wait_ready(within=120) for op in ops))
            leader = await first_to_log(ops, "became leader", within=60)
        await _show_replicas(api, ops)
        standby = ops[1] if leader is ops[0] else ops[0]
        await _set_up_world(world)
        await cp.proxy.reset_counts()
        await vc.control.clear_request_log()
        locker = asyncio.create_task(_lock_one_door(world, vc))
        try:
            steps = [("scale 0 -> 3 (ISOs ejected)", await _scale(world, 3))]
            locked = await locker
            console.print(
                f"[green]VM {locked}'s guest locked its CD-ROM door: vCenter asked, the "
                "operator answered that question once and ejected the ISO"
            )
            steps.append(("leader hand-over", await _hand_over(api, leader, standby)))
            steps.append(("scale 3 -> 1", await _scale(world, 1)))
            if not keep:
                steps.append(("scale 1 -> 0", await _scale(world, 0)))
        except DemoStuck:
            locker.cancel()
            for op in ops:
                console.print(Panel(op.log_text()[-3000:], title=f"{op.name} log (tail)"))
            console.print(Panel(world.journal.render(40), title="what the actors did"))
            raise
        await _summary(cp, vc, world, steps, api)
        world.check()
        if keep:
            await _show_replicas(api, ops)
            _how_to_use(cp, vc, ops, state, reader)
            await _wait_for_ctrl_c()
        console.rule("shutting down")
    console.print(f"replicas exited with { ({op.name: op.returncode for op in ops}) }")
    return 0


async def main(*, keep: bool) -> int:
    state = _claim_state_dir()
    console.rule("agent-forge demo: NodePool demand -> vSphere VMs -> Agents -> Machines")
    cp = ControlPlane(workdir=state / "controlplane", quiet=True)
    vc = Vcsim(workdir=state / "vcsim")
    code = 1
    try:
        with console.status("starting etcd, kube-apiserver, the proxy and vcsim"):
            await asyncio.to_thread(cp.start)
            await asyncio.to_thread(vc.start)
        console.print(
            f"control plane ready in {cp.startup_seconds:.1f} s ({cp.server}); "
            f"vcsim ready in {vc.startup_seconds:.1f} s ({vc.url})"
        )
        code = await _demo(cp, vc, state, keep=keep)
    except DemoStuck as stuck:
        console.print(f"[red]{stuck}")
    except AssertionError as broken:
        console.print(f"[red]{broken}")
    finally:
        await asyncio.to_thread(vc.stop)
        await asyncio.to_thread(cp.stop)
        shutil.rmtree(state, ignore_errors=True)
    outcome = "[green]done" if code == 0 else "[red]failed"
    console.print(f"{outcome}: control plane and vcsim stopped, demo-state removed")
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m sim.demo", description=__doc__)
    parser.add_argument(
        "--keep", action="store_true", help="stop at 1 replica and keep running until Ctrl-C"
    )
    sys.exit(asyncio.run(main(keep=parser.parse_args().keep)))
