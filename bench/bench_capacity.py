"""Capacity bridge at scale: 200 AgentMachines over 20 pools to prepared Agents, then at rest.

The real operator process (its ServiceAccount, leader election, the shipped defaults)
runs against a control plane and vcsim of its own,
with the simulated world around it (`sim.world.World`: image service, InfraEnv
stand-in, NodePool drivers, CAPI's Machine controller and agent provider, the
Assisted Installer). 20 NodePools of 10 replicas each, one VsphereAgentPool per
NodePool; the pools share 4 InfraEnvs (5 pools each), as NodePools of one hosted
cluster share its InfraEnv in practice, so every Agent event fans out to 5 pools.

1. **Zero to prepared.** With the operator synced and leading and every counter at
   zero: the InfraEnvs, the credentials Secret, the 20 pools (ISO `checkInterval` left
   to its default) and the 200 Machine + AgentMachine pairs are created; the clock
   stops when every AgentMachine has a prepared Agent (approved, the pool's labels,
   the selection label naming that AgentMachine), which the Assisted Installer
   registers only for a powered-on VM booting the ISO. CAPI's binding is held back
   meanwhile so the figure is the operator's alone; counts are read once the
   operator has made no API request for a while (its trailing status writes
   included). When no Agent was prepared for a minute while the operator made no
   request, the run counts as stalled: the figures cover what was reached, and the
   notes say why the rest was not (VMs sharing a MAC, an ISO cached under a name
   that is not its content's sha256).
2. **Bind and install.** CAPI binds, the Assisted Installer installs; counted apart.
3. **Steady state.** Over a window (`AGENT_FORGE_BENCH_STEADY_SECONDS`, default 120):
   the operator's API writes and vSphere calls per minute (goals 0 and 0).
4. **The periodic work there is.** One ISO revalidation, forced on one pool with the
   force-iso-refresh annotation (the same check `checkInterval` triggers), counted,
   and spread over 20 pools and the default interval.

API figures come from the fault proxy's per-identity counters (the world talks to
the apiserver directly, so they are the operator's alone). vSphere figures come from
vcsim's counters, minus the Assisted Installer's reads: it shares the simulator; the
requests one of its queries costs (a `Fetch` and a `RetrievePropertiesEx` below 500
VMs) are measured before the operator starts, its reader counts its queries, and
counters are read while holding the reader's lock so no query of its is in flight.

Knobs for quick tries: `AGENT_FORGE_BENCH_CAPACITY_POOLS` (20),
`AGENT_FORGE_BENCH_CAPACITY_REPLICAS` (10), `AGENT_FORGE_BENCH_CAPACITY_WORKERS` (unset:
the operator's default `--max-concurrent-reconciles`). `bench_speed` measures the same
bridge with vCenter's real task times.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentforge.api import kinds, names
from agentforge.kube.events import FLUSH_INTERVAL_S
from agentforge.settings import Settings
from bench.harness import COUNT, Context, Goal, Section
from sim.actors import Timings
from sim.actors.capi import is_bound
from sim.controlplane import ControlPlane, ProxyControl
from sim.operator import (
    OperatorProcess,
    grant_credentials,
    install_operator,
    metrics_reader,
    operator_identity,
)
from sim.vcsim import Vcsim
from sim.world import World

POOLS = int(os.environ.get("AGENT_FORGE_BENCH_CAPACITY_POOLS", "20"))
REPLICAS = int(os.environ.get("AGENT_FORGE_BENCH_CAPACITY_REPLICAS", "10"))
MORE = max(1, REPLICAS // 2)
"""Replicas each pool gains in the second burst (on pools that exist)."""
WORKERS = os.environ.get("AGENT_FORGE_BENCH_CAPACITY_WORKERS", "")
"""Empty: the shipped default of `--max-concurrent-reconciles`."""
STEADY_SECONDS = float(os.environ.get("AGENT_FORGE_BENCH_STEADY_SECONDS", "120"))
SHIPPED_WORKERS = Settings().max_concurrent_reconciles
INFRAENVS = 4
NAMESPACE = "bench-capacity"
CONTROL_PLANE_NAMESPACE = "clusters-bench-capacity"
HOSTED_CLUSTER = "bench"
LEASE_ID = "bench-capacity"
TIMINGS = Timings(tick=0.5, boot=0.5, install_start=0.5, install=2.0, drain=0.3, reclaim=0.3)
QUIET_SECONDS = FLUSH_INTERVAL_S + 5.0
"""No request for this long: the operator is done (its Event counts, written at most
every `FLUSH_INTERVAL_S` while an Event repeats, included)."""
BUSY_QUIET_SECONDS = 30.0  # no request for this long, and no Agent prepared: stalled
STALL_SECONDS = 60.0  # no Agent prepared for this long, and the operator quiet: stalled
PREPARE_WITHIN = 900.0
SETTLE_WITHIN = 600.0
GO_LOGINS_PER_VM = 8
"""The Go operator, measured on itself: about 8 logins (a govc process each) and 145
vSphere requests per VM lifecycle (create + destroy)."""
GO_REQUESTS_PER_VM = 145
DEFAULT_CHECK_INTERVAL = timedelta(minutes=10)

LEASES = "leases.coordination.k8s.io"
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
READ_VERBS = ("get", "list")
POOL_LABEL = "agent-pool"  # World.nodepool_labels: the NodePool's agentLabelSelector
COMPONENT = "agent-forge"  # the operator's Events' source.component


# --- counting ---------------------------------------------------------------------------


@dataclass(slots=True)
class ApiCount:
    """The operator's API requests, by (verb, resource), leases kept apart."""

    by: Counter[tuple[str, str]] = field(default_factory=Counter)
    conflicts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests answered 409 (also counted in `by`)."""

    def __sub__(self, other: ApiCount) -> ApiCount:
        diff = Counter(self.by)
        diff.subtract(other.by)
        conflicts = Counter(self.conflicts)
        conflicts.subtract(other.conflicts)
        return ApiCount(
            Counter({k: v for k, v in diff.items() if v}),
            Counter({k: v for k, v in conflicts.items() if v}),
        )

    def total(self, verbs: tuple[str, ...], *, leases: bool = False) -> int:
        return sum(
            n for (verb, res), n in self.by.items() if verb in verbs and (res == LEASES) == leases
        )

    @property
    def writes(self) -> int:
        return self.total(WRITE_VERBS)

    @property
    def reads(self) -> int:
        return self.total(READ_VERBS)

    @property
    def lease(self) -> int:
        return self.total((*WRITE_VERBS, *READ_VERBS), leases=True)

    @property
    def watches(self) -> int:
        return sum(n for (verb, _), n in self.by.items() if verb == "watch")

    def busy(self) -> int:
        """Every request but watches and the Lease (what 'the operator is quiet' means)."""
        return self.writes + self.reads

    def rows(self, verbs: tuple[str, ...]) -> list[tuple[str, str, int]]:
        """(verb, resource, n) of `verbs`, Lease aside, most first."""
        return sorted(
            ((v, r, n) for (v, r), n in self.by.items() if v in verbs and r != LEASES),
            key=lambda item: (-item[2], item[0], item[1]),
        )

    def breakdown(self, verbs: tuple[str, ...]) -> str:
        return ", ".join(f"{v} {r} {n:,}" for v, r, n in self.rows(verbs)) or "none"


async def _api(proxy: ProxyControl, identity: str) -> ApiCount:
    count = ApiCount()
    for row in await proxy.count_rows(identity):
        count.by[(row.verb, row.resource)] += row.count
        if row.status == 409:
            count.conflicts[(row.verb, row.resource)] += row.count
    return count


@dataclass(slots=True)
class VsphereCount:
    """Requests vcsim received from the operator (the Assisted Installer's subtracted)."""

    requests: int = 0
    methods: Counter[str] = field(default_factory=Counter)
    http: Counter[str] = field(default_factory=Counter)
    logins: int = 0
    world_queries: int = 0

    def __sub__(self, other: VsphereCount) -> VsphereCount:
        methods = Counter(self.methods)
        methods.subtract(other.methods)
        http = Counter(self.http)
        http.subtract(other.http)
        return VsphereCount(
            requests=self.requests - other.requests,
            methods=Counter({k: v for k, v in methods.items() if v}),
            http=Counter({k: v for k, v in http.items() if v}),
            logins=self.logins - other.logins,
            world_queries=self.world_queries - other.world_queries,
        )

    def breakdown(self, limit: int = 12) -> str:
        rows = [f"{m} {n:,}" for m, n in self.methods.most_common(limit)]
        rest = sum(self.methods.values()) - sum(n for _, n in self.methods.most_common(limit))
        if rest:
            rows.append(f"others {rest:,}")
        soap = sum(self.methods.values())
        other_http = self.requests - soap
        if other_http:
            rows.append(
                "non-SOAP "
                + ", ".join(f"{k} {n:,}" for k, n in sorted(self.http.items()) if "/sdk" not in k)
            )
        return "; ".join(rows) or "none"


@dataclass(frozen=True, slots=True)
class QueryProfile:
    """What one query of the Assisted Installer's reader costs vcsim (measured at start)."""

    methods: Counter[str]
    http: Counter[str]
    requests: int


async def _calibrate(world: World, vcsim: Vcsim, *, queries: int = 4) -> QueryProfile:
    """The reader's per-query requests, measured while the operator is not running."""
    reader = world.vcenter
    async with reader._lock:
        await vcsim.control.reset_counters()
        first = reader.queries
    for _ in range(queries):
        await reader.vms()
    async with reader._lock:
        raw = await vcsim.control.counters()
        made = reader.queries - first
    return QueryProfile(
        methods=Counter({str(k): int(v) // made for k, v in (raw.get("methods") or {}).items()}),
        http=Counter({str(k): int(v) // made for k, v in (raw.get("http") or {}).items()}),
        requests=sum(int(v) for v in (raw.get("paths") or {}).values()) // made,
    )


async def _vsphere(world: World, vcsim: Vcsim, profile: QueryProfile) -> VsphereCount:
    """Cumulative counters, the Assisted Installer's queries taken out, read consistently."""
    reader = world.vcenter
    # Holding the reader's lock: none of its queries is in flight, so its count and the
    # simulator's agree exactly.
    async with reader._lock:
        raw = await vcsim.control.counters()
        queries = reader.queries
    methods = Counter({str(k): int(v) for k, v in (raw.get("methods") or {}).items()})
    http = Counter({str(k): int(v) for k, v in (raw.get("http") or {}).items()})
    for key, n in profile.methods.items():
        methods[key] -= n * queries
    for key, n in profile.http.items():
        http[key] -= n * queries
    requests = sum(int(v) for v in (raw.get("paths") or {}).values()) - profile.requests * queries
    return VsphereCount(
        requests=requests,
        methods=Counter({k: v for k, v in methods.items() if v}),
        http=Counter({k: v for k, v in http.items() if v}),
        logins=int(raw.get("logins") or 0),
        world_queries=queries,
    )


@dataclass(slots=True)
class Mark:
    at: float
    api: ApiCount
    vsphere: VsphereCount


async def _mark(
    proxy: ProxyControl, identity: str, world: World, vcsim: Vcsim, profile: QueryProfile
) -> Mark:
    api = await _api(proxy, identity)
    return Mark(at=time.monotonic(), api=api, vsphere=await _vsphere(world, vcsim, profile))


async def _quiet(
    proxy: ProxyControl, identity: str, *, quiet: float = QUIET_SECONDS, within: float
) -> bool:
    """Wait until the operator made no API request (watches, Lease aside) for `quiet` s;
    False when it was still busy after `within` s."""
    deadline = time.monotonic() + within
    last = (await _api(proxy, identity)).busy()
    changed = time.monotonic()
    while time.monotonic() - changed < quiet:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)
        now = (await _api(proxy, identity)).busy()
        if now != last:
            last, changed = now, time.monotonic()
    return True


# --- the world's state ------------------------------------------------------------------


def _true(obj: dict[str, Any], type_: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def _nodepool_of(am: dict[str, Any]) -> str:
    key = (am["metadata"].get("annotations") or {}).get(names.ANNOTATION_NODEPOOL, "")
    return str(key).rsplit("/", 1)[-1]


async def _prepared(world: World, am_pools: dict[str, str]) -> int:
    """AgentMachines with a prepared Agent: approved, the pool's labels, its selection label."""
    agents = (await world.client.list(kinds.AGENT, namespace=world.namespace)).items
    done = set()
    for agent in agents:
        labels = agent["metadata"].get("labels") or {}
        am = labels.get(names.LABEL_AGENT_MACHINE)
        if (
            am in am_pools
            and (agent.get("spec") or {}).get("approved") is True
            and labels.get(POOL_LABEL) == am_pools[am]
        ):
            done.add(am)
    return len(done)


async def _bound_installed(world: World) -> tuple[int, int, int]:
    """(AgentMachines Ready, Agents bound and installed, the pools' `boundAgents` summed)."""
    client = world.client
    ams, agents, vaps = await asyncio.gather(
        client.list(kinds.AGENT_MACHINE, namespace=world.control_plane_namespace),
        client.list(kinds.AGENT, namespace=world.namespace),
        client.list(kinds.VSPHERE_AGENT_POOL, namespace=world.namespace),
    )
    return (
        sum(_true(am, "Ready") for am in ams.items),
        sum(is_bound(a) and _true(a, "Installed") for a in agents.items),
        sum(int((p.get("status") or {}).get("boundAgents") or 0) for p in vaps.items),
    )


async def _all_bound(world: World, n: int) -> bool:
    """Every AgentMachine with a prepared Agent is Ready, that Agent bound and installed."""
    ready, installed, _ = await _bound_installed(world)
    return ready == installed == n


async def _wait_prepared(
    ctx: Context, world: World, am_pools: dict[str, str], proxy: ProxyControl, identity: str
) -> tuple[int, float]:
    """(AgentMachines with a prepared Agent, when that count last rose), once all are, or
    once none was prepared for `STALL_SECONDS` while the operator was quiet (stalled)."""
    total = len(am_pools)
    started = logged = time.monotonic()
    count, rose = 0, started
    busy, busy_changed = (await _api(proxy, identity)).busy(), started
    while True:
        now_count = await _prepared(world, am_pools)
        now = time.monotonic()
        if now_count != count:
            count, rose = now_count, now
        if count == total:
            return count, rose
        now_busy = (await _api(proxy, identity)).busy()
        if now_busy != busy:
            busy, busy_changed = now_busy, now
        stalled = now - rose >= STALL_SECONDS and now - busy_changed >= BUSY_QUIET_SECONDS
        if stalled or now - started > PREPARE_WITHIN:
            ctx.step(f"  stalled at {count}/{total} prepared")
            return count, rose
        if now - logged >= 30:
            logged = now
            ctx.step(f"  {count}/{total} prepared")
        await asyncio.sleep(1.0)


async def _stuck(world: World) -> list[str]:
    """Why AgentMachines lack a prepared Agent, as far as the world's state tells."""
    client = world.client
    vas = (await client.list(kinds.VSPHERE_AGENT, namespace=world.namespace)).items
    vaps = (await client.list(kinds.VSPHERE_AGENT_POOL, namespace=world.namespace)).items
    phases: Counter[str] = Counter()
    by_mac: dict[str, list[str]] = {}
    for va in vas:
        vm = (va.get("status") or {}).get("vm") or {}
        phases[f"{vm.get('phase')}/{vm.get('reason')}"] += 1
        mac = str(vm.get("macAddress") or "").lower().replace("-", ":")
        if mac:
            by_mac.setdefault(mac, []).append(f"{va['metadata']['name']} ({vm.get('phase')})")
    notes = [f"VsphereAgents by phase/reason: {dict(phases.most_common())}."]
    shared = {m: v for m, v in by_mac.items() if len(v) > 1}
    if shared:
        notes.append(
            f"{len(shared)} MAC address(es) shared by two VMs (vcsim derives a VM's MAC from "
            f"the last 3 hex digits of its BIOS UUID: 4,096 values): "
            + "; ".join(f"{m}: {', '.join(v)}" for m, v in sorted(shared.items()))
            + "."
        )
    for pool in vaps:
        infraenv = (pool.get("spec") or {}).get("infraEnvRef", {}).get("name", "")
        path = str(((pool.get("status") or {}).get("iso") or {}).get("path") or "")
        image = world.iso_server.image(world.namespace, infraenv)
        named = path.rsplit("/", 1)[-1].removesuffix(".iso")
        if image is not None and path and named != image.sha256:
            notes.append(
                f"Pool {pool['metadata']['name']} cached its ISO as {path}, but InfraEnv "
                f"{infraenv}'s image has sha256 {image.sha256[:16]}...: the Assisted "
                "Installer recognises the ISO by that content-addressed name, so its VMs "
                "never register."
            )
    return notes


async def _until(
    probe: Callable[[], Awaitable[bool]], *, within: float, every: float = 1.0
) -> float | None:
    """When `probe()` first held (None: not within `within` seconds)."""
    started = time.monotonic()
    while not await probe():
        if time.monotonic() - started > within:
            return None
        await asyncio.sleep(every)
    return time.monotonic()


async def _next_revalidation(world: World) -> tuple[datetime | None, str]:
    """The earliest `checkedAt + checkInterval` over the pools, and the interval as set."""
    pools = (await world.client.list(kinds.VSPHERE_AGENT_POOL, namespace=world.namespace)).items
    earliest: datetime | None = None
    interval_field = "unset"
    for pool in pools:
        iso_spec = (pool.get("spec") or {}).get("iso") or {}
        interval_field = str(iso_spec.get("checkInterval") or "unset")
        checked = ((pool.get("status") or {}).get("iso") or {}).get("checkedAt")
        if checked:
            due = datetime.fromisoformat(str(checked).replace("Z", "+00:00"))
            due += DEFAULT_CHECK_INTERVAL
            earliest = due if earliest is None or due < earliest else earliest
    return earliest, interval_field


# --- the run ----------------------------------------------------------------------------


def _per_min(n: float, seconds: float) -> float:
    return n * 60.0 / seconds if seconds > 0 else 0.0


async def _set_up(world: World, pools: list[str]) -> None:
    """What the user and HyperShift do: InfraEnvs, Secret, pools, then the NodePools' demand."""
    await asyncio.gather(
        world.create_credentials(),
        *(world.create_infraenv(f"discovery-{i}") for i in range(INFRAENVS)),
    )
    await asyncio.gather(
        *(
            world.create_pool(pool, infraenv=f"discovery-{i % INFRAENVS}", folder="bench-capacity")
            for i, pool in enumerate(pools)
        )
    )
    await asyncio.gather(*(world.nodepool(pool).scale(REPLICAS) for pool in pools))


@dataclass
class Staged:
    """A control plane, vcsim, the simulated world and the operator, ready to measure."""

    cp: ControlPlane
    vcsim: Vcsim
    world: World
    profile: QueryProfile
    op: OperatorProcess


async def stage(
    stack: contextlib.AsyncExitStack,
    ctx: Context,
    *,
    namespace: str,
    control_plane_namespace: str,
    lease_id: str,
    name: str,
    args: list[str],
    task_delays: dict[str, int] | None = None,
    metrics: bool = False,
) -> Staged:
    """A world of its own, CAPI's binding held back, the Assisted Installer's polls
    calibrated, and the operator leading (leader election on, watching both namespaces,
    `args` added to the shipped defaults)."""
    cp = await stack.enter_async_context(ControlPlane(quiet=True))
    vcsim = await stack.enter_async_context(
        Vcsim(workdir=ctx.workdir / f"vcsim-{name}", task_delays=task_delays)
    )
    kubeconfig = await asyncio.to_thread(install_operator, cp)
    world = await stack.enter_async_context(
        World(
            controlplane=cp,
            vcsim=vcsim,
            namespace=namespace,
            control_plane_namespace=control_plane_namespace,
            hosted_cluster=HOSTED_CLUSTER,
            timings=TIMINGS,
            iso_size=1024 * 1024,
        )
    )
    await asyncio.to_thread(grant_credentials, cp, namespace)  # its credentials namespace
    await world.capi.stop()  # binding waits until every Agent is prepared
    profile = await _calibrate(world, vcsim)
    op = await stack.enter_async_context(
        OperatorProcess(
            kubeconfig,
            "--leader-elect",
            "--leader-election-namespace",
            names.DEPLOYMENT_NAMESPACE,
            "--leader-election-id",
            lease_id,
            "--namespace",
            namespace,
            "--namespace",
            control_plane_namespace,
            *args,
            log_path=ctx.workdir / f"{name}.log",
            metrics=await asyncio.to_thread(metrics_reader, cp) if metrics else None,
        )
    )
    await op.wait_ready(within=120)
    await op.wait_log("became leader", within=60)
    return Staged(cp, vcsim, world, profile, op)


async def run(ctx: Context) -> Section:
    pools = [f"np{i:02d}" for i in range(POOLS)]
    vms = POOLS * REPLICAS
    section = Section(
        title=f"Capacity: {vms} AgentMachines over {POOLS} pools, to prepared Agents and at rest"
    )
    identity = operator_identity()
    async with contextlib.AsyncExitStack() as stack:
        ctx.step("starting a control plane and vcsim of its own")
        staged = await stage(
            stack,
            ctx,
            namespace=NAMESPACE,
            control_plane_namespace=CONTROL_PLANE_NAMESPACE,
            lease_id=LEASE_ID,
            name="capacity",
            args=["--max-concurrent-reconciles", WORKERS] if WORKERS else [],
        )
        cp, vcsim, world, profile, op = (
            staged.cp, staged.vcsim, staged.world, staged.profile, staged.op
        )  # fmt: skip
        await asyncio.sleep(2.0)  # controllers built, the replay of empty caches done
        proxy = cp.proxy

        async def mark() -> Mark:
            return await _mark(proxy, identity, world, vcsim, profile)

        await proxy.reset_counts()
        await vcsim.control.reset_counters()

        # 1. zero to prepared -------------------------------------------------------
        start = await mark()
        ctx.step(f"{POOLS} pools x {REPLICAS} replicas: creating the demand")
        await _set_up(world, pools)
        demand_at = time.monotonic()
        ams = (
            await world.client.list(kinds.AGENT_MACHINE, namespace=world.control_plane_namespace)
        ).items
        am_pools = {am["metadata"]["name"]: _nodepool_of(am) for am in ams}
        ctx.step(f"waiting for {len(am_pools)} prepared Agents")
        ready, prepared_at = await _wait_prepared(ctx, world, am_pools, proxy, identity)
        at_prepared = await mark()
        ctx.step("waiting for the operator to go quiet")
        busy_after = [] if await _quiet(proxy, identity, within=SETTLE_WITHIN) else ["prepared"]
        prepared = await mark()
        phase1 = prepared.api - start.api
        vs1 = prepared.vsphere - start.vsphere
        trailing = (prepared.api - at_prepared.api).writes
        stuck = await _stuck(world) if ready < vms else []
        events1 = await _events(world)

        # 2. bind and install ---------------------------------------------------------
        ctx.step("CAPI binds, the Assisted Installer installs")
        world.capi.start()
        installed_at = await _until(lambda: _all_bound(world, ready), within=SETTLE_WITHIN)
        bound_counts = await _bound_installed(world)
        if not await _quiet(proxy, identity, within=SETTLE_WITHIN):
            busy_after.append("bound and installed")
        installed = await mark()
        phase2 = installed.api - prepared.api
        vs2 = installed.vsphere - prepared.vsphere

        # 3. steady state -------------------------------------------------------------
        next_check, interval_field = await _next_revalidation(world)
        ctx.step(f"steady state: counting the operator's requests for {STEADY_SECONDS:g} s")
        window_start = datetime.now(UTC)
        before = await mark()
        log_lines_before = len(op.log_entries())
        await asyncio.sleep(STEADY_SECONDS)
        after = await mark()
        window_end = datetime.now(UTC)
        window = after.at - before.at
        steady = after.api - before.api
        vs_steady = after.vsphere - before.vsphere
        window_log = op.log_entries()[log_lines_before:]

        # 4. one ISO revalidation, forced ----------------------------------------------
        ctx.step("one ISO revalidation, forced on one pool")
        iso_before = world.iso_server.stats()
        reval_before = await mark()
        await world.client.patch_merge(
            kinds.VSPHERE_AGENT_POOL,
            namespace=NAMESPACE,
            name=pools[0],
            patch={
                "metadata": {
                    "annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: str(int(time.time()))}
                }
            },
        )
        await asyncio.sleep(1.0)
        if not await _quiet(proxy, identity, quiet=5.0, within=120):
            busy_after.append("the forced revalidation")
        reval_after = await mark()
        iso_after = world.iso_server.stats()
        reval = reval_after.api - reval_before.api
        vs_reval = reval_after.vsphere - reval_before.vsphere

        # 5. a second burst, on the pools that exist ----------------------------------
        ctx.step(f"a second burst: {MORE} more replicas on each of the {POOLS} pools")
        await world.capi.stop()  # binding held back again, as in 1.
        second_start = await mark()
        await asyncio.gather(*(world.nodepool(pool).scale(REPLICAS + MORE) for pool in pools))
        second_demand = time.monotonic()
        listed = (
            await world.client.list(kinds.AGENT_MACHINE, namespace=world.control_plane_namespace)
        ).items
        more_pools = {
            am["metadata"]["name"]: _nodepool_of(am)
            for am in listed
            if am["metadata"]["name"] not in am_pools
        }
        ready2, prepared2_at = await _wait_prepared(ctx, world, more_pools, proxy, identity)
        if not await _quiet(proxy, identity, within=SETTLE_WITHIN):
            busy_after.append("the second burst")
        second = await mark()
        phase5 = second.api - second_start.api
        vs5 = second.vsphere - second_start.vsphere
        events5 = await _events(world) - events1

        running = op.running()
        problems = [*world.violations, *world.failures()]

    # --- figures -----------------------------------------------------------------------
    complete = ready == vms
    section.add(
        f"zero to {vms} VMs on and Agents prepared",
        prepared_at - start.at if complete else None,
        "s",
    )
    section.add(
        "  of which after the demand was created",
        prepared_at - demand_at if complete else None,
        "s",
    )
    section.add("AgentMachines with a prepared Agent", ready, f"of {vms}")
    if not complete:
        section.add(f"  zero to the last of the {ready} prepared", prepared_at - start.at, "s")
    section.add("vSphere requests (operator)", vs1.requests, "requests")
    section.add("vSphere requests per VM", vs1.requests / vms, "requests", guard=COUNT)
    section.add("vSphere logins", vs1.logins, "logins")
    go_logins = GO_LOGINS_PER_VM * vms
    section.add(
        f"logins / Go operator's ({GO_LOGINS_PER_VM} logins per VM lifecycle = {go_logins:,})",
        vs1.logins / go_logins,
        "ratio",
    )
    section.add("  CreateVM_Task", vs1.methods["CreateVM_Task"], "tasks")
    section.add("  PowerOnVM_Task", vs1.methods["PowerOnVM_Task"], "tasks")
    section.add("API writes by the operator", phase1.writes, "writes")
    section.add("API writes per VM", phase1.writes / vms, "writes", guard=COUNT)
    for verb in WRITE_VERBS:
        n = phase1.total((verb,))
        if n or verb != "deletecollection":
            section.add(f"  {verb}", n, "writes")
    section.add("  of which answered 409 Conflict", sum(phase1.conflicts.values()), "writes")
    for verb, resource, n in phase1.rows(WRITE_VERBS):
        section.add(f"  per VM: {verb} {_short(resource)}", n / vms, "writes")
    section.add("API reads outside watches (get + list)", phase1.reads, "reads")
    section.add(
        "bind + install after prepared: wall",
        installed_at - prepared.at if installed_at is not None else None,
        "s",
    )
    section.add("bind + install: API writes by the operator", phase2.writes, "writes")
    section.add("bind + install: vSphere requests (operator)", vs2.requests, "requests")
    section.add(
        "steady state: API writes/min", _per_min(steady.writes, window), "writes/min", Goal.equal(0)
    )
    section.add(
        "steady state: vSphere calls/min",
        _per_min(vs_steady.requests, window),
        "calls/min",
        Goal.equal(0),
    )
    section.add(
        "steady state: API reads/min outside watches", _per_min(steady.reads, window), "reads/min"
    )
    section.add("steady state: Lease requests/min", _per_min(steady.lease, window), "req/min")
    section.add("steady state: window", window, "s")
    section.add("one ISO revalidation: API writes", reval.writes, "writes")
    section.add("one ISO revalidation: vSphere requests", vs_reval.requests, "requests")
    section.add(
        "one ISO revalidation: bytes downloaded",
        iso_after.bytes_served - iso_before.bytes_served,
        "bytes",
    )
    per_check_min = DEFAULT_CHECK_INTERVAL.total_seconds() / 60
    section.add(
        f"revalidation, {POOLS} pools every {per_check_min:g} min: API writes/min (estimate)",
        reval.writes * POOLS / per_check_min,
        "writes/min",
    )
    section.add(
        f"revalidation, {POOLS} pools every {per_check_min:g} min: vSphere calls/min (estimate)",
        vs_reval.requests * POOLS / per_check_min,
        "calls/min",
    )

    more = POOLS * MORE
    complete2 = ready2 == more
    section.add(
        f"second burst: {more} more AgentMachines on the existing pools, to prepared",
        prepared2_at - second_demand if complete2 else None,
        "s",
    )
    section.add("second burst: AgentMachines with a prepared Agent", ready2, f"of {more}")
    section.add("second burst: API writes per VM", phase5.writes / more, "writes", guard=COUNT)
    for verb, resource, n in phase5.rows(WRITE_VERBS):
        section.add(f"  per VM: {verb} {_short(resource)}", n / more, "writes")
    section.add("second burst: vSphere requests per VM", vs5.requests / more, "requests")

    # --- notes -------------------------------------------------------------------------
    window_has_check = next_check is not None and window_start <= next_check <= window_end
    section.notes += [
        f"Topology: {POOLS} NodePools x {REPLICAS} replicas in one hosted cluster, one "
        f"VsphereAgentPool each (cleanupPolicy Delete, 2 CPUs, 4 GiB, 20 GiB), sharing "
        f"{INFRAENVS} InfraEnvs ({POOLS // INFRAENVS} pools each) and one credentials Secret; "
        f"operator with --leader-elect and --max-concurrent-reconciles {WORKERS or SHIPPED_WORKERS}"
        f" (the shipped default is {SHIPPED_WORKERS}), watching the 2 namespaces; vCenter "
        f"tasks end at once (bench_speed has real task times); actor timings {TIMINGS}.",
        "Zero to prepared: clock from the first object created (InfraEnvs, Secret, pools, "
        f"then {vms} Machine + AgentMachine pairs) to every AgentMachine having an approved "
        "Agent with the pool's labels and its selection label (the Assisted Installer "
        "registers an Agent only for a powered-on VM booting the ISO). CAPI's binding was "
        "held back until then; counts include the writes after that moment until the "
        f"operator made no request for {QUIET_SECONDS:g} s ({trailing} trailing writes)"
        + (
            "."
            if complete
            else f"; the run stalled at {ready} of {vms} (no Agent prepared for "
            f"{STALL_SECONDS:g} s while the operator made no request), so per-VM figures "
            "divide by all VMs created but cover only the work that was possible."
        ),
        f"Zero to prepared, API writes by resource: {phase1.breakdown(WRITE_VERBS)}; "
        f"409 Conflicts: {_conflicts(phase1)}.",
        f"Zero to prepared, the Events the operator wrote by involved kind and reason "
        f"(objects; the summed count where repeats were counted): {events1.summary()}.",
        f"Zero to prepared, API reads outside watches: {phase1.breakdown(READ_VERBS)}; "
        f"watch requests opened: {phase1.watches}; Lease requests: {phase1.lease}.",
        f"Zero to prepared, vSphere requests: {vs1.breakdown()}. The Assisted Installer's "
        f"{vs1.world_queries:,} polls are subtracted ({profile.requests} requests each, "
        f"measured before the operator started: {dict(profile.methods)}).",
        f"Go yardstick: the Go operator, measured on itself, makes about "
        f"{GO_REQUESTS_PER_VM} vSphere requests and {GO_LOGINS_PER_VM} logins per VM "
        f"lifecycle (create + destroy: a govc process with a fresh login per step); this "
        f"operator made {vs1.logins} login(s) for {vms} VMs and no process (its requests "
        "per lifecycle, end to end: bench_speed).",
        f"Bind + install: API writes {phase2.breakdown(WRITE_VERBS)}; reads "
        f"{phase2.breakdown(READ_VERBS)}; vSphere {vs2.breakdown()}.",
        f"Bind + install ended with {bound_counts[0]} AgentMachines Ready, {bound_counts[1]} "
        f"Agents bound and installed, pools' boundAgents summing to {bound_counts[2]}"
        + ("." if installed_at is not None else f" (waited {SETTLE_WITHIN:g} s for {ready})."),
        f"Steady state window: {window:.0f} s (AGENT_FORGE_BENCH_STEADY_SECONDS), starting "
        f"once every prepared Agent was bound and installed and the operator had made "
        f"no request for {QUIET_SECONDS:g} s. Writes: {steady.breakdown(WRITE_VERBS)}; reads: "
        f"{steady.breakdown(READ_VERBS)}; vSphere: {vs_steady.breakdown()}; operator log "
        f"lines: {len(window_log)} ({_log_summary(window_log)}).",
        f"Periodic work that exists: ISO revalidation per pool every checkInterval (spec "
        f"value {interval_field}, i.e. the default {per_check_min:g} min): a conditional GET "
        "to the image service, a datastore existence check and a pool status write "
        "(checkedAt). The first pool's next check was due at "
        f"{next_check:%H:%M:%S} UTC, "
        f"{'inside' if window_has_check else 'outside'} the window "
        f"({window_start:%H:%M:%S}-{window_end:%H:%M:%S} UTC)."
        if next_check is not None
        else "Periodic work: ISO revalidation every checkInterval (no checkedAt recorded).",
        "The vCenter session's keep-alive (CurrentTime) only runs after 10 min without any "
        "vSphere call, so it cannot fall in a window shorter than that; with pools "
        f"revalidating every {per_check_min:g} min the session is rarely idle that long.",
        f"Forced revalidation of pool {pools[0]} (force-iso-refresh annotation, the same "
        f"check the interval triggers): writes {reval.breakdown(WRITE_VERBS)}; reads "
        f"{reval.breakdown(READ_VERBS)}; vSphere {vs_reval.breakdown()}; image service "
        f"{iso_after.requests - iso_before.requests} request(s), "
        f"{iso_after.not_modified - iso_before.not_modified} not modified. The per-minute "
        "estimates multiply it by the pools and divide by the interval.",
    ]
    section.notes.append(
        f"Second burst (after the revalidation): CAPI's binding held back again, each "
        f"NodePool scaled from {REPLICAS} to {REPLICAS + MORE}; clock from the scale to "
        f"every new AgentMachine having a prepared Agent; counts until the operator made no "
        f"request for {QUIET_SECONDS:g} s. What a scale-up of pools that exist costs, "
        f"without the pools' own set-up (finalizer, first status, ISO cached, "
        f"`ISOUploaded`) that zero to prepared includes. API writes "
        f"{phase5.breakdown(WRITE_VERBS)}; 409 Conflicts: {_conflicts(phase5)}; Events "
        f"{events5.summary()}; vSphere {vs5.breakdown()}."
    )
    if stuck:
        section.notes.append(
            f"Why {vms - ready} AgentMachine(s) got no prepared Agent: " + " ".join(stuck)
        )
    if busy_after:
        section.notes.append(
            f"The operator was still making requests {SETTLE_WITHIN:g} s after: "
            + ", ".join(busy_after)
            + "."
        )
    if not running:
        section.notes.append("The operator exited during the run: see capacity.log.")
    if problems:
        section.notes.append(f"The simulated world saw problems: {problems[:5]}.")
    return section


def _short(resource: str) -> str:
    """`vsphereagents.agent-forge.containeroo.ch/status` -> `vsphereagents/status`."""
    name, _, sub = resource.partition("/")
    return name.split(".", 1)[0] + (f"/{sub}" if sub else "")


@dataclass(slots=True)
class EventCensus:
    """The Events the operator wrote, by (involved kind, reason): objects and their counts."""

    objects: Counter[tuple[str, str]] = field(default_factory=Counter)
    occurrences: Counter[tuple[str, str]] = field(default_factory=Counter)

    def __sub__(self, other: EventCensus) -> EventCensus:
        """What was written since `other` (a new Event, or a count that rose)."""
        return EventCensus(self.objects - other.objects, self.occurrences - other.occurrences)

    def summary(self) -> str:
        rows = sorted(self.objects.items(), key=lambda item: (-item[1], item[0]))
        return (
            ", ".join(
                f"{kind} {reason} {n:,}"
                + (
                    f" (count {self.occurrences[(kind, reason)]:,})"
                    if self.occurrences[(kind, reason)] != n
                    else ""
                )
                for (kind, reason), n in rows
            )
            or "none"
        )


async def _events(world: World) -> EventCensus:
    census = EventCensus()
    for namespace in (world.namespace, world.control_plane_namespace):
        for event in (await world.client.list(kinds.EVENT, namespace=namespace)).items:
            if (event.get("source") or {}).get("component") != COMPONENT:
                continue
            key = (str((event.get("involvedObject") or {}).get("kind")), str(event.get("reason")))
            census.objects[key] += 1
            census.occurrences[key] += int(event.get("count") or 1)
    return census


def _conflicts(count: ApiCount) -> str:
    rows = sorted(count.conflicts.items(), key=lambda item: -item[1])
    return ", ".join(f"{v} {r} {n:,}" for (v, r), n in rows) or "none"


def _log_summary(entries: list[dict[str, Any]]) -> str:
    counts = Counter(str(e.get("msg")) for e in entries)
    return ", ".join(f"{m!r} x{n}" for m, n in counts.most_common(6)) or "none"
