"""Idle API traffic: requests per minute from a synced operator with nothing to do.

An informer-based operator should cost the API server nothing at rest: it lists
once, then only watches. The fault proxy counts every request by identity, verb
and resource; the benchmark starts the operator (as its ServiceAccount, with
leader election) on the 10,000-of-each fleet, waits until it is ready and its
watches are open, resets the counters, waits one minute and reads them.

Lease renewals (get + update every retry period), watch streams and reads of
credentials Secrets are reported apart from the figure with the goal, as the goal
excludes them. Secrets are never watched: each one a pool names is read by name
once per `--credentials-refresh-interval` (default 1 minute). The fleet has no
pools, so the figure is 0 here; with pools it is the number of Secrets in use per
interval.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from bench.fleet import fleet
from bench.harness import Context, Goal, Section
from sim.operator import OperatorProcess, operator_identity

WINDOW_SECONDS = 60.0
WATCHED_KINDS = 6
LEASES = "leases.coordination.k8s.io"
SECRETS = "secrets"


async def run(ctx: Context) -> Section:
    f = await fleet(ctx)
    section = Section(title="Idle API traffic: requests per minute from a synced operator")
    proxy = f.controlplane.proxy
    identity = operator_identity()
    async with OperatorProcess(
        f.operator_kubeconfig,
        "--leader-elect",
        "--leader-election-namespace",
        "agent-forge-system",
        "--leader-election-id",
        "bench-idle",
        "--credential-namespace",  # required when watching all; no pool reads one here
        "agent-forge-system",
        log_path=ctx.workdir / "idle.log",
    ) as op:
        await op.wait_ready(within=900)
        await op.wait_log("became leader", within=60)
        await proxy.wait_open_watches(WATCHED_KINDS, within=60)
        await proxy.reset_counts()
        ctx.step(f"counting the operator's requests for {WINDOW_SECONDS:g} s")
        await asyncio.sleep(WINDOW_SECONDS)
        rows = await proxy.count_rows(identity)
        open_watches = await proxy.open_watches()
        running = op.running()

    per_minute = 60.0 / WINDOW_SECONDS
    by_kind: Counter[str] = Counter()
    other = lease = watches = secret_reads = 0
    for row in rows:
        if row.verb == "watch":
            watches += row.count
        elif row.resource == LEASES:
            lease += row.count
        elif (row.verb, row.resource) == ("get", SECRETS):
            secret_reads += row.count
        else:
            other += row.count
            by_kind[f"{row.verb} {row.resource} -> {row.status}"] += row.count
    section.add(
        "requests/min, watches, lease renewals and Secret reads aside",
        other * per_minute,
        "req/min",
        Goal.equal(0),
    )
    section.add("lease requests/min (get + update per renewal)", lease * per_minute, "req/min")
    section.add("watch requests opened/min (reconnects)", watches * per_minute, "req/min")
    section.add(
        "credentials Secret reads/min (one per Secret in use per refresh interval)",
        secret_reads * per_minute,
        "req/min",
    )
    section.add("watch streams open at the end (all identities)", open_watches, "streams")
    section.notes += [
        f"{f.scale:,} Agents, AgentMachines and Machines cached; counted by the fault proxy "
        f"for identity {identity} over {WINDOW_SECONDS:g} s, after /readyz 200, the Lease "
        f"won and {WATCHED_KINDS} watches open.",
        "Default timings: retry period 2 s, so about 30 renewals a minute; credentials "
        "refresh interval 1 m (the fleet has no pools, so no Secret is in use).",
    ]
    if by_kind:
        section.notes.append(f"Other requests: {dict(by_kind)}.")
    if not running:
        section.notes.append("The operator exited during the window: see idle.log.")
    return section
