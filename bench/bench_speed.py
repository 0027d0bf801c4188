"""Capacity at real vCenter speed: 200 AgentMachines over 20 pools, scale-up and scale-down.

`bench_capacity` measures against a simulator whose tasks end at once; a real vCenter
takes seconds per task. Here vcsim keeps every task `running` as long as a production
vCenter takes (two profiles, `PROFILES`), and the real operator process runs with
the shipped defaults: no flag but its namespaces and leader election, exactly what
`config/default` runs.

Per profile, with a control plane, vcsim and world of its own:

1. The pools (20 of them, 10 replicas each, plus one "small" pool of 1) are created
   and their ISOs cached first, so the clock measures VM work only.
2. **Scale-up.** The 20 NodePools are scaled to 10 at once; the clock stops when
   every AgentMachine has a prepared Agent (the Assisted Installer registers one only
   for a powered-on VM booting the ISO). Once the burst has as many create tasks in
   flight as the cap allows (so a queue has formed), the small pool asks for 1 VM:
   its time to its VM running and to its Agent prepared is reported, against one VM's
   task chain (goal: about two chains, not "after the burst").
3. CAPI binds and the Assisted Installer installs (not timed).
4. **Scale-down.** Every NodePool is scaled to 0; the clock stops when vCenter holds
   no VM (power off, then destroy). Its API writes are counted until the operator made
   no request for 5 s (the VMs' Agents deleted and finalizers removed included) and
   reported per deleted VM.

Each time is reported with its **floor**: one VM's task chain (what the first VM
cannot beat) plus the vSphere requests the phase made divided by `--vsphere-qps` (what
the request budget cannot beat), and the ratio to it (goal 1.5). The load average is
noted: the machine may be shared.

Knobs for quick tries: `AGENT_FORGE_BENCH_SPEED_POOLS` (20),
`AGENT_FORGE_BENCH_SPEED_REPLICAS` (10), `AGENT_FORGE_BENCH_SPEED_PROFILES`
(`vcenter,slow`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import psutil

from agentforge.api import kinds, names
from agentforge.settings import Settings
from bench.bench_capacity import (
    GO_LOGINS_PER_VM,
    GO_REQUESTS_PER_VM,
    WRITE_VERBS,
    ApiCount,
    Mark,
    VsphereCount,
    _all_bound,
    _conflicts,
    _mark,
    _nodepool_of,
    _prepared,
    _quiet,
    stage,
)
from bench.harness import COUNT, WALL, Context, Goal, Section
from sim.operator import Sample, operator_identity
from sim.vcsim import Vcsim
from sim.world import World

POOLS = int(os.environ.get("AGENT_FORGE_BENCH_SPEED_POOLS", "20"))
REPLICAS = int(os.environ.get("AGENT_FORGE_BENCH_SPEED_REPLICAS", "10"))
CHOSEN = os.environ.get("AGENT_FORGE_BENCH_SPEED_PROFILES", "vcenter,slow").split(",")
NAMESPACE = "bench-speed"
CONTROL_PLANE_NAMESPACE = "clusters-bench-speed"
LEASE_ID = "bench-speed"
SMALL = "small"
INFRAENVS = 4
WITHIN = 1800.0
DEFAULTS = Settings()
QPS = DEFAULTS.vsphere_qps
CAP = DEFAULTS.vsphere_max_tasks_in_flight
RATIO_GOAL = 1.5
SMALL_GOAL_CHAINS = 2.0
DOWN_WRITES_GOAL = 6.0
"""API writes per deleted VM during the scale-down (issue 24)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    task_ms: dict[str, int]
    about: str

    def seconds(self, method: str) -> float:
        return self.task_ms.get(method, 0) / 1000.0

    @property
    def create_chain(self) -> float:
        """One VM's tasks from nothing to running: create, then power on."""
        return self.seconds("CreateVM_Task") + self.seconds("PowerOnVM_Task")

    @property
    def delete_chain(self) -> float:
        """One VM's tasks from running to gone: power off, then destroy."""
        return self.seconds("PowerOffVM_Task") + self.seconds("Destroy_Task")


PROFILES = {
    "vcenter": Profile(
        "vcenter",
        {
            "CreateVM_Task": 5000,
            "PowerOnVM_Task": 2000,
            "ReconfigVM_Task": 2000,
            "Destroy_Task": 3000,
        },
        "a production vCenter: CreateVM 5 s, PowerOnVM 2 s, ReconfigVM 2 s, Destroy 3 s",
    ),
    "slow": Profile(
        "slow",
        {
            "CreateVM_Task": 20000,
            "PowerOnVM_Task": 2000,
            "ReconfigVM_Task": 2000,
            "Destroy_Task": 3000,
        },
        "a slow vCenter: CreateVM 20 s, the rest as the vCenter profile",
    ),
}


@dataclass(slots=True)
class Outcome:
    profile: Profile
    vms: int
    up_s: float | None
    up_requests: VsphereCount
    up_api: ApiCount
    prepared: int
    small_running_s: float | None
    small_prepared_s: float | None
    small_asked_after: int
    down_s: float | None
    down_requests: VsphereCount
    down_api: ApiCount
    logins: int
    load: tuple[str, str]
    up_timeline: str
    down_timeline: str
    small_stages: str
    cpu: str
    waits: str
    notes: list[str]


async def _until(
    probe: Callable[[], Awaitable[bool]], *, within: float, every: float = 0.5
) -> float | None:
    started = time.monotonic()
    while not await probe():
        if time.monotonic() - started > within:
            return None
        await asyncio.sleep(every)
    return time.monotonic()


def _load() -> str:
    with contextlib.suppress(OSError):
        return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    return "n/a"


class SmallStages:
    """When the small pool's VM was first seen at each step of its chain (polled)."""

    def __init__(self, asked_at: float) -> None:
        self._asked_at = asked_at
        self.seen: dict[str, float] = {}

    def note(self, stage: str) -> None:
        self.seen.setdefault(stage, time.monotonic() - self._asked_at)

    def __str__(self) -> str:
        steps = sorted(self.seen.items(), key=lambda kv: kv[1])
        return ", ".join(f"{stage} +{at:.1f} s" for stage, at in steps) or "nothing seen"


async def _small_vm_running(world: World, stages: SmallStages) -> bool:
    vas = (
        await world.client.list(
            kinds.VSPHERE_AGENT,
            namespace=NAMESPACE,
            label_selector=f"{names.LABEL_POOL}={SMALL}",  # (a cheap poll: one object)
        )
    ).items
    for va in vas:
        if (va["spec"].get("poolRef") or {}).get("name") != SMALL:
            continue
        stages.note("VsphereAgent created")
        status = va.get("status") or {}
        creation = status.get("creation") or {}
        if creation:
            stages.note("creation checkpointed")
        if creation.get("phase") == "CreateIssued" and creation.get("taskRef"):
            stages.note("CreateVM started")
        if creation.get("phase") == "PowerOnIssued" or (status.get("vm") or {}).get("biosUUID"):
            stages.note("VM created")
        for c in status.get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                stages.note("VM running")
                return True
    return False


def _role(process: psutil.Process, *, operator: int) -> str:
    """What a process is in the benchmark's world, for the CPU breakdown."""
    if process.pid == operator:
        return "operator"
    if process.pid == os.getpid():
        return "this benchmark (the simulated world's actors, the polls)"
    cmdline = process.cmdline()
    name: str = os.path.basename(cmdline[0]) if cmdline else process.name()
    if "python" in name and "-m" in cmdline:
        return f"python -m {cmdline[cmdline.index('-m') + 1]}"
    return name


class CpuUse:
    """CPU seconds used over a span: by the operator, by every other process of the
    benchmark's world (by role), and by the whole machine."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._started = time.monotonic()
        self._before = self._per_process()
        self._busy = self._busy_seconds()

    def _per_process(self) -> dict[int, tuple[str, float]]:
        found: dict[int, tuple[str, float]] = {}
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                t = process.cpu_times()
                used = float(t.user + t.system)
                found[process.pid] = (_role(process, operator=self._pid), used)
        return found

    @staticmethod
    def _busy_seconds() -> float:
        t = psutil.cpu_times()
        return float(t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0))

    def __str__(self) -> str:
        wall = time.monotonic() - self._started
        busy = self._busy_seconds() - self._busy
        by_role: dict[str, float] = {}
        for pid, (role, used) in self._per_process().items():
            before = self._before.get(pid)
            spent = used - (before[1] if before is not None and before[0] == role else 0.0)
            if spent > 0.05:
                by_role[role] = by_role.get(role, 0.0) + spent
        cpus = os.cpu_count() or 1
        roles = ", ".join(
            f"{role} {spent:.1f}" for role, spent in sorted(by_role.items(), key=lambda kv: -kv[1])
        )
        return (
            f"whole machine {busy:.1f} CPU s of {wall * cpus:.0f} available "
            f"({busy / (wall * cpus):.0%} busy) over {wall:.0f} s; by process, CPU s: {roles}"
        )


def _waits(before: list[Sample], after: list[Sample]) -> str:
    """Mean queue wait and work time per controller, and mean API request latency per
    verb, over the span between two /metrics scrapes."""

    def sums(samples: list[Sample], metric: str, label: str) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for name, labels, value in samples:
            if name not in (f"{metric}_sum", f"{metric}_count"):
                continue
            key = labels.get(label, "")
            total, count = out.get(key, (0.0, 0.0))
            if name.endswith("_sum"):
                total += value
            else:
                count += value
            out[key] = (total, count)
        return out

    def means(metric: str, label: str, unit: float = 1000.0) -> str:
        old, new = sums(before, metric, label), sums(after, metric, label)
        parts = []
        for key, (total, count) in sorted(new.items()):
            was_total, was_count = old.get(key, (0.0, 0.0))
            n = count - was_count
            if n > 0:
                parts.append(f"{key} {(total - was_total) / n * unit:.0f} ms x{n:.0f}")
        return ", ".join(parts) or "none"

    lag = max((v for n, _, v in after if n == "agent_forge_event_loop_lag_seconds"), default=0.0)
    return (
        f"queue wait per controller {means('workqueue_queue_duration_seconds', 'name')}; "
        f"reconcile time {means('workqueue_work_duration_seconds', 'name')}; "
        f"API request latency {means('agent_forge_kube_request_duration_seconds', 'verb')}; "
        f"event loop lag at the end {lag * 1000:.0f} ms"
    )


async def _create_tasks(vcsim: Vcsim) -> int:
    counters = await vcsim.control.counters()
    return int((counters.get("methods") or {}).get("CreateVM_Task", 0))


async def _measure(ctx: Context, profile: Profile) -> Outcome:
    pools = [f"np{i:02d}" for i in range(POOLS)]
    vms = POOLS * REPLICAS
    identity = operator_identity()
    notes: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        ctx.step(f"[{profile.name}] a control plane and vcsim ({profile.about})")
        staged = await stage(  # the shipped defaults: nothing tuned
            stack,
            ctx,
            namespace=NAMESPACE,
            control_plane_namespace=CONTROL_PLANE_NAMESPACE,
            lease_id=LEASE_ID,
            name=f"speed-{profile.name}",
            args=[],
            task_delays=dict(profile.task_ms),
            metrics=True,
        )
        cp, vcsim, world, profile_q, op = (
            staged.cp, staged.vcsim, staged.world, staged.profile, staged.op
        )  # fmt: skip
        proxy = cp.proxy

        async def mark() -> Mark:
            return await _mark(proxy, identity, world, vcsim, profile_q)

        first = await mark()

        # 1. pools and their ISOs, before any demand
        await asyncio.gather(
            world.create_credentials(),
            *(world.create_infraenv(f"discovery-{i}") for i in range(INFRAENVS)),
        )
        await asyncio.gather(
            *(
                world.create_pool(p, infraenv=f"discovery-{i % INFRAENVS}", folder="bench-speed")
                for i, p in enumerate([*pools, SMALL])
            )
        )

        async def isos_cached() -> bool:
            listed = (await world.client.list(kinds.VSPHERE_AGENT_POOL, namespace=NAMESPACE)).items
            return len(listed) == POOLS + 1 and all(
                ((p.get("status") or {}).get("iso") or {}).get("path") for p in listed
            )

        await _until(isos_cached, within=600)
        await _quiet(proxy, identity, quiet=5.0, within=300)

        # 2. scale-up, with the small pool asking during the burst
        ctx.step(f"[{profile.name}] {POOLS} pools x {REPLICAS}: scale-up")
        load_before = _load()
        up_seq, up_t0 = await vcsim.control.last_seq(), datetime.now(UTC)
        start = await mark()
        cpu = CpuUse(op.pid)
        samples_before = await op.metrics()
        await asyncio.gather(*(world.nodepool(p).scale(REPLICAS) for p in pools))
        burst = min(CAP, vms)
        await _until(lambda: _ge(_create_tasks(vcsim), burst), within=600, every=0.2)
        small_asked = await _create_tasks(vcsim)
        small_at = time.monotonic()
        await world.nodepool(SMALL).scale(1)
        ams = (
            await world.client.list(kinds.AGENT_MACHINE, namespace=CONTROL_PLANE_NAMESPACE)
        ).items
        am_pools = {am["metadata"]["name"]: _nodepool_of(am) for am in ams}
        small_ams = {k: v for k, v in am_pools.items() if v == SMALL}
        stages = SmallStages(small_at)
        small_running = await _until(
            lambda: _small_vm_running(world, stages), within=WITHIN, every=0.2
        )
        small_prepared = await _until(lambda: _ge(_prepared(world, small_ams), 1), within=WITHIN)

        async def all_prepared() -> bool:
            return await _prepared(world, am_pools) >= len(am_pools)

        up_done = await _until(all_prepared, within=WITHIN, every=1.0)
        up_cpu = str(cpu)
        waits = _waits(samples_before, await op.metrics())
        up = await mark()
        tasks = await _timeline(vcsim, up_seq, up_t0, ("CreateVM_Task", "PowerOnVM_Task"))
        done = f"; all prepared at +{up_done - start.at:.1f} s" if up_done is not None else ""
        up_timeline = f"{await _created(world, up_t0)}; {tasks}{done}"
        prepared = await _prepared(world, am_pools)
        await _quiet(proxy, identity, quiet=5.0, within=300)
        settled = await mark()

        # 3. bind and install (not timed)
        ctx.step(f"[{profile.name}] CAPI binds, the Assisted Installer installs")
        world.capi.start()
        if await _until(lambda: _all_bound(world, prepared), within=WITHIN, every=1.0) is None:
            notes.append("not every prepared Agent was bound and installed before scale-down")
        await _quiet(proxy, identity, quiet=5.0, within=300)

        # 4. scale-down
        ctx.step(f"[{profile.name}] scale-down to 0")
        down_seq, down_t0 = await vcsim.control.last_seq(), datetime.now(UTC)
        down_start = await mark()
        await asyncio.gather(*(world.nodepool(p).scale(0) for p in [*pools, SMALL]))

        async def no_vms() -> bool:
            return not await world.vcenter.vms()

        down_done = await _until(no_vms, within=WITHIN, every=1.0)
        down = await mark()
        await _quiet(proxy, identity, quiet=5.0, within=300)  # the Agents and finalizers too
        down_settled = await mark()
        down_timeline = await _timeline(
            vcsim, down_seq, down_t0, ("PowerOffVM_Task", "Destroy_Task")
        ) + (f"; no VM left at +{down_done - down_start.at:.1f} s" if down_done is not None else "")
        load_after = _load()
        if not op.running():
            notes.append("the operator exited during the run: see its log")
        problems = [*world.violations, *world.failures()]
        if problems:
            notes.append(f"the simulated world saw problems: {problems[:5]}")
    return Outcome(
        profile=profile,
        vms=vms,
        up_s=up_done - start.at if up_done is not None else None,
        up_requests=up.vsphere - start.vsphere,
        up_api=settled.api - start.api,
        prepared=prepared - len(small_ams),
        small_running_s=small_running - small_at if small_running is not None else None,
        small_prepared_s=small_prepared - small_at if small_prepared is not None else None,
        small_asked_after=small_asked,
        down_s=down_done - down_start.at if down_done is not None else None,
        down_requests=down.vsphere - down_start.vsphere,
        down_api=down_settled.api - down_start.api,
        logins=down.vsphere.logins - first.vsphere.logins,
        load=(load_before, load_after),
        up_timeline=up_timeline,
        down_timeline=down_timeline,
        small_stages=str(stages),
        cpu=up_cpu,
        waits=waits,
        notes=notes,
    )


async def _timeline(vcsim: Vcsim, since: int, t0: datetime, methods: tuple[str, ...]) -> str:
    """When vCenter saw each task method called, from the first to the last, after `t0`."""
    parts = []
    for method in methods:
        entries = await vcsim.control.request_log(method, since=since)
        times = [datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00")) for e in entries]
        if times:
            first, last = ((t - t0).total_seconds() for t in (min(times), max(times)))
            parts.append(f"{method} x{len(times)} at +{first:.1f}..+{last:.1f} s")
    return "; ".join(parts) or "no tasks"


async def _created(world: World, t0: datetime) -> str:
    """When the VsphereAgents were created (their creationTimestamp: whole seconds)."""
    vas = (await world.client.list(kinds.VSPHERE_AGENT, namespace=NAMESPACE)).items
    times = [
        datetime.fromisoformat(str(va["metadata"]["creationTimestamp"]).replace("Z", "+00:00"))
        for va in vas
    ]
    if not times:
        return "no VsphereAgent"
    first, last = ((t - t0).total_seconds() for t in (min(times), max(times)))
    return f"VsphereAgents x{len(times)} created at +{first:.0f}..+{last:.0f} s"


async def _ge(value: Awaitable[int], n: int) -> bool:
    return await value >= n


def _report(section: Section, out: Outcome) -> None:
    p = out.profile
    tag = f"[{p.name}]"
    up_floor = p.create_chain + out.up_requests.requests / QPS
    down_floor = p.delete_chain + out.down_requests.requests / QPS
    section.add(f"{tag} scale-up: {out.vms} Agents prepared", out.up_s, "s", guard=WALL)
    section.add(f"{tag}   floor (chain {p.create_chain:g} s + requests / qps)", up_floor, "s")
    section.add(
        f"{tag}   ratio to floor",
        out.up_s / up_floor if out.up_s is not None else None,
        "x",
        Goal.at_most(RATIO_GOAL),
    )
    section.add(f"{tag}   AgentMachines with a prepared Agent", out.prepared, f"of {out.vms}")
    section.add(f"{tag}   vSphere requests", out.up_requests.requests, "requests")
    section.add(
        f"{tag}   API writes per prepared VM", out.up_api.writes / out.vms, "writes", guard=COUNT
    )
    section.add(
        f"{tag} small pool during the burst: its VM running",
        out.small_running_s,
        "s",
    )
    section.add(
        f"{tag}   in task chains ({p.create_chain:g} s each)",
        out.small_running_s / p.create_chain if out.small_running_s is not None else None,
        "chains",
        Goal.at_most(SMALL_GOAL_CHAINS),
    )
    section.add(f"{tag}   its Agent prepared", out.small_prepared_s, "s")
    section.add(f"{tag} scale-down: {out.vms} VMs destroyed", out.down_s, "s", guard=WALL)
    section.add(f"{tag}   floor (chain {p.delete_chain:g} s + requests / qps)", down_floor, "s")
    section.add(
        f"{tag}   ratio to floor",
        out.down_s / down_floor if out.down_s is not None else None,
        "x",
        Goal.at_most(RATIO_GOAL),
    )
    section.add(f"{tag}   vSphere requests", out.down_requests.requests, "requests")
    section.add(
        f"{tag}   API writes per deleted VM",
        out.down_api.writes / out.vms,
        "writes",
        Goal.at_most(DOWN_WRITES_GOAL),
        guard=COUNT,
    )
    per_vm = (out.up_requests.requests + out.down_requests.requests) / out.vms
    section.add(
        f"{tag} vSphere requests per VM lifecycle (create + delete)",
        per_vm,
        "requests",
        guard=COUNT,
    )
    section.add(
        f"{tag}   / the Go operator's ({GO_REQUESTS_PER_VM} per lifecycle)",
        per_vm / GO_REQUESTS_PER_VM,
        "ratio",
    )
    section.add(
        f"{tag} vSphere logins, whole run (Go operator: {GO_LOGINS_PER_VM} per VM)",
        out.logins,
        "logins",
    )
    section.notes += [
        f"{tag} task delays {p.about}; vcsim keeps each task running that long, locking "
        "nothing (as a busy vCenter does).",
        f"{tag} scale-up vSphere requests: {out.up_requests.breakdown()}.",
        f"{tag} scale-up timeline (from the NodePools' scale-up): {out.up_timeline}.",
        f"{tag} scale-down timeline (from the NodePools' scale-down): {out.down_timeline}.",
        f"{tag} scale-up API writes: {out.up_api.breakdown(WRITE_VERBS)} (counted until the "
        f"operator made no request for 5 s); 409 Conflicts: {_conflicts(out.up_api)}.",
        f"{tag} the small pool asked for its VM when {out.small_asked_after} create tasks "
        f"had been started (the cap is {CAP}: a queue had formed); its VsphereAgent as "
        f"polled every 0.2 s, from the ask: {out.small_stages}.",
        f"{tag} CPU during the scale-up (the NodePools' scale-up to all prepared): {out.cpu}.",
        f"{tag} where the operator's time went during the scale-up (its /metrics, means): "
        f"{out.waits}.",
        f"{tag} scale-down vSphere requests: {out.down_requests.breakdown()}; API writes "
        f"{out.down_api.breakdown(WRITE_VERBS)} (counted until the operator made no request "
        f"for 5 s: the VMs' Agents and finalizers included); 409 Conflicts: "
        f"{_conflicts(out.down_api)}.",
        f"{tag} load average (1, 5, 15 min) before the scale-up {out.load[0]}, after the "
        f"scale-down {out.load[1]} on {os.cpu_count()} CPUs.",
        *(f"{tag} {n}" for n in out.notes),
    ]


async def run(ctx: Context) -> Section:
    section = Section(
        title=f"Capacity at real vCenter speed: {POOLS * REPLICAS} AgentMachines over {POOLS} "
        "pools, shipped defaults"
    )
    for name in CHOSEN:
        _report(section, await _measure(ctx, PROFILES[name.strip()]))
    section.notes.insert(
        0,
        f"Shipped defaults: --max-concurrent-reconciles {DEFAULTS.max_concurrent_reconciles}, "
        f"--vsphere-qps {QPS:g}, --vsphere-burst {DEFAULTS.vsphere_burst}, "
        f"--vsphere-max-tasks-in-flight {CAP}. Floor = one VM's task chain + the phase's "
        f"vSphere requests / --vsphere-qps; goal: within {RATIO_GOAL}x of it. The small pool "
        f"(1 replica) asks once the burst fills the task cap; goal: its VM runs within "
        f"{SMALL_GOAL_CHAINS:g} task chains.",
    )
    return section
