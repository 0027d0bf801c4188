"""CPU: what a whole 50-VM up, idle, down run costs the operator, against the Go operator.

One world of its own at a production vCenter's task latencies (the speed benchmark's
`vcenter` profile), the operator started with the shipped defaults (leader election,
the self-signed metrics certificate, the kubeconfig probe). 5 pools x 10 replicas:
scale-up until every AgentMachine has a prepared Agent, CAPI binds and the Assisted
Installer installs, one idle minute, scale-down until no VM is left. The figure is the
operator process's CPU time over its whole life, its own and its children's (the
kubeconfig probe, the certificate), read with psutil just before it is stopped.

The yardstick is the Go operator's figure for the same run measured side by side on
one control plane and one vcsim (issue 24): 17.7 CPU s, self and children.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import psutil

from agentforge.api import kinds
from bench.bench_capacity import _all_bound, _nodepool_of, _prepared, stage
from bench.bench_speed import PROFILES, _until
from bench.harness import Context, Goal, Guard, Section

POOLS = 5
REPLICAS = 10
IDLE_SECONDS = 60.0
WITHIN = 900.0
GO_CPU_SECONDS = 17.7
GOAL_RATIO = 0.3
NAMESPACE = "bench-cpu"
CONTROL_PLANE_NAMESPACE = "clusters-bench-cpu"
CPU = Guard(0.15)
"""CPU seconds of one run: the same run spread by about 10% on this machine."""


def _cpu_seconds(process: psutil.Process) -> tuple[float, float]:
    """(own, reaped children's) user + system CPU seconds of a live process."""
    t = process.cpu_times()
    return float(t.user + t.system), float(t.children_user + t.children_system)


async def run(ctx: Context) -> Section:
    vms = POOLS * REPLICAS
    profile = PROFILES["vcenter"]
    section = Section(title=f"CPU: a whole {vms}-VM up, idle, down run, against the Go operator")
    pools = [f"cpu{i}" for i in range(POOLS)]
    notes: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        ctx.step(f"a control plane and vcsim ({profile.about})")
        staged = await stage(
            stack,
            ctx,
            namespace=NAMESPACE,
            control_plane_namespace=CONTROL_PLANE_NAMESPACE,
            lease_id="bench-cpu",
            name="cpu",
            args=[],
            task_delays=dict(profile.task_ms),
        )
        world, op = staged.world, staged.op
        process = psutil.Process(op.pid)
        started = _cpu_seconds(process)

        ctx.step(f"{POOLS} pools x {REPLICAS}: scale-up to prepared Agents")
        await world.create_credentials()
        await world.create_infraenv("discovery")
        await asyncio.gather(*(world.create_pool(p, infraenv="discovery") for p in pools))
        await asyncio.gather(*(world.nodepool(p).scale(REPLICAS) for p in pools))
        ams = (
            await world.client.list(kinds.AGENT_MACHINE, namespace=CONTROL_PLANE_NAMESPACE)
        ).items
        am_pools = {am["metadata"]["name"]: _nodepool_of(am) for am in ams}

        async def all_prepared() -> bool:
            return await _prepared(world, am_pools) >= vms

        if await _until(all_prepared, within=WITHIN, every=1.0) is None:
            notes.append("not every AgentMachine got a prepared Agent")
        up = _cpu_seconds(process)

        ctx.step("CAPI binds, the Assisted Installer installs; then one idle minute")
        world.capi.start()
        if await _until(lambda: _all_bound(world, vms), within=WITHIN, every=1.0) is None:
            notes.append("not every prepared Agent was bound and installed")
        bound = _cpu_seconds(process)
        await asyncio.sleep(IDLE_SECONDS)
        idle = _cpu_seconds(process)

        ctx.step("scale-down to 0")
        await asyncio.gather(*(world.nodepool(p).scale(0) for p in pools))

        async def no_vms() -> bool:
            return not await world.vcenter.vms()

        if await _until(no_vms, within=WITHIN, every=1.0) is None:
            notes.append("VMs were left after the scale-down")
        own, children = _cpu_seconds(process)
        if not op.running():
            notes.append("the operator exited during the run: see its log")
        problems = [*world.violations, *world.failures()]
        if problems:
            notes.append(f"the simulated world saw problems: {problems[:5]}")

    total = own + children
    section.add("operator CPU, whole run (self + children)", total, "CPU s", guard=CPU)
    section.add(
        f"  / the Go operator's ({GO_CPU_SECONDS:g} CPU s)",
        total / GO_CPU_SECONDS,
        "ratio",
        Goal.at_most(GOAL_RATIO),
    )
    section.add("  start-up to leading (self)", started[0], "CPU s")
    section.add("  children (kubeconfig probe, metrics certificate)", children, "CPU s")
    section.add("  scale-up to prepared (self)", up[0] - started[0], "CPU s")
    section.add("  bind + install (self)", bound[0] - up[0], "CPU s")
    section.add(f"  idle {IDLE_SECONDS:g} s (self)", idle[0] - bound[0], "CPU s")
    section.add("  scale-down (self)", own - idle[0], "CPU s")
    load = "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    section.notes += [
        f"{POOLS} pools x {REPLICAS} replicas, shipped defaults, task delays of "
        f"{profile.about}; CPU read from the operator process with psutil (user + system, "
        "its own and its reaped children's) over its whole life, start-up included.",
        f"Go operator yardstick: {GO_CPU_SECONDS:g} CPU s for the same run (self + "
        "children), measured side by side on one control plane and one vcsim.",
        f"Load average (1, 5, 15 min) at the end {load} on {os.cpu_count()} CPUs.",
        *notes,
    ]
    return section
