"""Latency: from an API write of an Agent to the start of its reconcile, 10,000 cached.

The operator runs in probe mode (`python -m sim.operator`): the product plus one
trivial controller, "probe", watching Agents. The benchmark writes a Unix time into
an Agent's `PROBE_STAMP` annotation (a merge patch straight to the apiserver); the
probe logs, at the start of the reconcile, the seconds since that stamp. So each
sample covers the API write, etcd, the watch, the informer (trim, cache, handler),
the work queue and the worker wake-up: what a reconciler waits for an event.

Samples are spread over distinct Agents at a steady rate after the probe has
finished the start-up replay of the whole cache. The controller's own histogram
(`agent_forge_event_to_reconcile_seconds`: informer event to reconcile start) is
read from /metrics before and after, as a cross-check of the in-process part.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from agentforge.api import kinds
from bench.fleet import AGENT_NAMESPACE, agent_name, fleet
from bench.harness import Context, Goal, Section
from sim.operator import PROBE_STAMP, OperatorProcess, Sample, metrics_reader

SAMPLES = 400
RATE_PER_SECOND = 25.0
HISTOGRAM = "agent_forge_event_to_reconcile_seconds"


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _buckets(samples: list[Sample]) -> dict[float, float]:
    return {
        float(labels["le"]): value
        for name, labels, value in samples
        if name == f"{HISTOGRAM}_bucket" and labels.get("controller") == "probe"
    }


def _bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Upper bound of the bucket holding quantile `q` of the observations in between."""
    bounds = sorted(after)
    total = after[float("inf")] - before.get(float("inf"), 0.0)
    for bound in bounds:
        if after[bound] - before.get(bound, 0.0) >= q * total:
            return bound
    return float("inf")


async def _drained(op: OperatorProcess, *, within: float) -> None:
    """Wait until the probe's queue is empty (the start-up replay is done)."""
    async with asyncio.timeout(within):
        while True:
            depth = await op.metric("workqueue_depth", name="probe")
            if depth == 0 and await op.metric("workqueue_adds_total", name="probe"):
                return
            await asyncio.sleep(0.5)


async def run(ctx: Context) -> Section:
    f = await fleet(ctx)
    section = Section(title=f"Latency: Agent change to reconcile, {f.scale:,} of each cached")
    async with OperatorProcess(
        f.operator_kubeconfig,
        "--leader-elect",
        "--leader-election-namespace",
        "agent-forge-system",
        "--leader-election-id",
        "bench-latency",
        "--credential-namespace",  # required when watching all; no pool reads one here
        "agent-forge-system",
        log_path=ctx.workdir / "latency.log",
        probe=True,
        metrics=await asyncio.to_thread(metrics_reader, f.controlplane),
    ) as op:
        await op.wait_ready(within=900)
        await op.wait_log("became leader", within=60)
        ctx.step("waiting for the probe to replay the cache")
        replay_started = time.monotonic()
        await _drained(op, within=600)
        replay_seconds = time.monotonic() - replay_started
        before = _buckets(await op.metrics())

        ctx.step(f"{SAMPLES} stamped Agent writes at {RATE_PER_SECOND:g}/s")
        rng = random.Random(42)
        chosen = [agent_name(i) for i in rng.sample(range(f.scale), min(SAMPLES, f.scale))]
        writes: list[float] = []
        for name in chosen:
            stamp = time.time()
            await f.admin.patch_merge(
                kinds.AGENT,
                namespace=AGENT_NAMESPACE,
                name=name,
                patch={"metadata": {"annotations": {PROBE_STAMP: repr(stamp)}}},
            )
            writes.append(time.time() - stamp)
            await asyncio.sleep(max(0.0, 1 / RATE_PER_SECOND - writes[-1]))
        wanted = {f"{AGENT_NAMESPACE}/{name}" for name in chosen}
        entries = await _collect(op, wanted, within=30)
        after = _buckets(await op.metrics())

    event_ms = [float(e["event_latency_s"]) * 1000 for e in entries if e["event_latency_s"]]
    total_ms = [float(e["latency_s"]) * 1000 for e in entries]
    section.add("event to reconcile, p50", _quantile(event_ms, 0.50) if event_ms else None, "ms")
    section.add(
        "event to reconcile, p99",
        _quantile(event_ms, 0.99) if event_ms else None,
        "ms",
        Goal.below(50),
    )
    section.add("event to reconcile, max", max(event_ms) if event_ms else None, "ms")
    section.add(
        "event to reconcile, p99 from /metrics (bucket bound)",
        _bucket_quantile(before, after, 0.99) * 1000 if after else None,
        "ms",
    )
    section.add("write to reconcile, p50", _quantile(total_ms, 0.5) if total_ms else None, "ms")
    section.add("write to reconcile, p99", _quantile(total_ms, 0.99) if total_ms else None, "ms")
    section.add("API write round trip, p50", _quantile(writes, 0.5) * 1000, "ms")
    section.add("samples received", len(entries), f"of {len(chosen)}")
    section.add("start-up replay of the cache by the probe", replay_seconds, "s")
    section.notes += [
        f"{f.scale:,} Agents, AgentMachines and Machines cached; {len(chosen)} distinct "
        f"Agents patched one at a time at {RATE_PER_SECOND:g}/s.",
        "Event to reconcile: from the informer handing the watch event (trimmed, cached) to "
        "the controller's handlers, to the start of the reconcile; measured in the probe "
        "and, as a cross-check, by the controller's histogram (a bucket's upper bound).",
        "Write to reconcile: from time.time() just before the PATCH in the benchmark to the "
        "reconcile start in the operator (same host, same clock); it adds the API server's "
        "write and the watch delivery, which the operator does not control.",
    ]
    return section


async def _collect(op: OperatorProcess, wanted: set[str], *, within: float) -> list[dict[str, Any]]:
    """The probe's log entries for `wanted` keys (waiting up to `within` for all)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        found = {
            e["key"]: e
            for e in op.log_entries()
            if e.get("msg") == "probe reconciled" and e.get("key") in wanted
        }
        if len(found) == len(wanted) or loop.time() > deadline:
            return list(found.values())
        await asyncio.sleep(0.2)
