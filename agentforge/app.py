"""The composition root: settings -> clients -> informers -> leader election -> controllers.

What each setting makes of a part (informers, vSphere options, ISO access, the
elector) is `agentforge.wiring`; this module opens, runs and closes them.

What one operator process promises:

* Informers for every kind the reconcilers read start at once, leader or not, each
  object trimmed by `agentforge.api.trim` before it is cached, so a standby is warm
  and takes over without a cold LIST. `/readyz` turns 200 when all have synced
  ("caches synced" is logged once).
* Controllers (`agentforge.wiring.build_controllers`, from the one `Deps`
  this module assembles) are built and run only while this process leads. Building
  them after the Lease is won replays every cached object to them, so each is
  reconciled once by the new leader. With `--leader-elect=false` they run at once.
* SIGTERM / SIGINT: stop handing out work, let reconciles in flight finish (at most
  `DRAIN_TIMEOUT`), write the event counts held for a batched write (at most
  `EVENT_FLUSH_TIMEOUT`), release the Lease so a standby takes over at its next retry,
  stop informers and servers, close the clients (vCenter logouts bounded), exit 0.
  Whatever vCenter does, the process is gone within `shutdown.SHUTDOWN_TIMEOUT_S`
  of the signal: worker threads still blocked on a vCenter socket are not waited
  for, and a deadline armed at the signal ends the process if a step hangs.
* Losing the Lease (renewal failed for the renew deadline) cancels reconciles at
  once, writes nothing more (held event counts are dropped), does not touch the
  Lease, and exits 1 so the pod restarts as a standby; a
  crashed informer or controller also exits 1. A configuration that cannot be
  loaded (no kubeconfig, unusable credentials) exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import Info

from agentforge import __version__, observability, secure_metrics, shutdown, vsphere, wiring
from agentforge.api import kinds
from agentforge.kube import condition_log, leader
from agentforge.kube import config as kube_config
from agentforge.kube.client import KubeClient, RetryPolicy
from agentforge.kube.controller import Controller
from agentforge.kube.events import EventRecorder
from agentforge.kube.informer import Informer
from agentforge.reconcilers.common import event_groups
from agentforge.reconcilers.common.deps import Deps
from agentforge.secret_credentials import SecretCredentials
from agentforge.settings import Settings
from agentforge.wiring import (
    CACHED_KINDS,
    cache_transform,
    iso_access,
    login_policy,
    vsphere_options,
)

__all__ = [
    "CACHED_KINDS",
    "DRAIN_TIMEOUT",
    "BuildControllers",
    "cache_transform",
    "iso_access",
    "login_policy",
    "main",
    "run",
    "vsphere_options",
]

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FATAL, EXIT_CONFIG = 0, 1, 2
DRAIN_TIMEOUT = 5.0  # seconds reconciles in flight get to finish at shutdown
EVENT_FLUSH_TIMEOUT = 3.0  # seconds the batched event counts get to be written at shutdown
COMPONENT = "agent-forge"

BUILD_INFO = Info("agent_forge_build", "Version of the running operator.")


BuildControllers = Callable[[Deps], Sequence[Controller]]
"""What a leader runs, in start order, built from the app's one `Deps` (by default every
reconciler: `agentforge.wiring.build_controllers`); the process also runs
(caches, probes, leader election) with none."""


def main(settings: Settings, *, controllers: BuildControllers = wiring.build_controllers) -> int:
    """Configure logging and run the operator until it stops; return the exit code
    (without waiting for threads still blocked on a vCenter socket)."""
    observability.configure_logging(level=settings.log_level, fmt=settings.log_format)
    return shutdown.leave(asyncio.run(run(settings, controllers=controllers)))


async def run(
    settings: Settings, *, controllers: BuildControllers = wiring.build_controllers
) -> int:
    """The whole life of the process; returns the exit code (see module doc)."""
    BUILD_INFO.info({"version": __version__})
    stop = asyncio.Event()
    deadline = shutdown.Deadline()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, signum, stop, deadline)
    try:
        cluster = await kube_config.load_config(kubeconfig=settings.kubeconfig)
    except kube_config.ConfigError as exc:
        log.error("cannot load the cluster configuration: %s", exc)  # noqa: TRY400
        return EXIT_CONFIG
    try:
        iso = iso_access(settings, os.environ)
    except ValueError as exc:
        log.error("cannot use the proxy settings for ISO downloads: %s", exc)  # noqa: TRY400
        return EXIT_CONFIG
    log.info(
        "starting",
        extra={
            "version": __version__,
            "cluster": cluster.server,
            "source": cluster.source,
            "namespaces": list(settings.namespaces) or "all",
            "credential_namespaces": sorted(settings.secret_namespaces),
            "leader_elect": settings.leader_elect,
            "iso_downloads": iso.proxies.describe(),
            "iso_ca_bundle": str(settings.iso_ca_bundle or "system store only"),
        },
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            code = await _start(
                settings=settings,
                iso=iso,
                cluster=cluster,
                controllers=controllers,
                stop=stop,
                stack=stack,
            )
    finally:
        deadline.arm()  # whatever ended the run: the rest of the exit is bounded too
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    log.info("shut down", extra={"exit_code": code})
    return code


async def _start(
    *,
    settings: Settings,
    iso: vsphere.IsoAccess,
    cluster: kube_config.ClusterConfig,
    controllers: BuildControllers,
    stop: asyncio.Event,
    stack: contextlib.AsyncExitStack,
) -> int:
    """Open clients, servers and informers (closed by `stack` in reverse), then lead."""
    user_agent = f"{COMPONENT}/{__version__}"
    client = await stack.enter_async_context(
        KubeClient(
            config=cluster,
            user_agent=user_agent,
            status_observer=condition_log.ConditionLog().observe,  # logs that tell
        )
    )
    informers = wiring.informers(settings, client)
    probes = observability.Probes()
    probes.add_readiness_check(
        "informers-synced", lambda: all(i.has_synced for i in informers.values())
    )
    try:
        tls, middlewares = secure_metrics.for_settings(settings, client)
    except OSError as exc:  # ssl.SSLError included: a mounted pair that does not load
        log.error("cannot load the metrics serving certificate: %s", exc)  # noqa: TRY400
        return EXIT_CONFIG
    server = observability.ObservabilityServer(
        probes=probes,
        metrics_address=settings.metrics_bind_address,
        health_address=settings.health_probe_bind_address,
        metrics_tls=tls,
        metrics_middlewares=middlewares,
    )
    try:
        await server.start()
    except OSError as exc:
        log.error("cannot bind the metrics or probe server: %s", exc)  # noqa: TRY400
        return EXIT_FATAL
    stack.push_async_callback(server.stop)

    background: dict[asyncio.Future[None], str] = {}
    stack.push_async_callback(_cancel_all, background)
    for kind, informer in informers.items():
        task = asyncio.create_task(informer.run(), name=f"informer:{kind.plural}")
        background[task] = f"informer {kind.plural}"
    background[asyncio.create_task(_log_when_synced(informers))] = "sync logger"

    elector: leader.LeaderElector | None = None
    if settings.leader_elect:
        lease_client = await stack.enter_async_context(
            KubeClient(
                config=cluster,
                user_agent=user_agent,
                retry=RetryPolicy(attempts=1),  # the elector retries on its own clock
                request_timeout=max(1.0, settings.retry_period.total_seconds()),
            )
        )
        elector = wiring.elector(settings, lease_client)
    sessions = vsphere.SessionRegistry(
        options=vsphere_options(settings), policy=login_policy(settings)
    )
    stack.push_async_callback(sessions.close)
    credentials = SecretCredentials(
        client=client,
        namespaces=settings.secret_namespaces,
        refresh_interval=settings.credentials_refresh_interval.total_seconds(),
    )
    stack.push_async_callback(credentials.close)
    events = EventRecorder(
        client=client,
        component=COMPONENT,
        host=socket.gethostname(),
        group_of=event_groups.pool_of,
    )
    events.start()
    stack.push_async_callback(events.close)  # what a clean shutdown did not flush is dropped
    deps = Deps(
        client=client,
        informers=informers,
        events=events,
        vsphere=sessions,
        credentials=credentials,
        workers=settings.max_concurrent_reconciles,
        iso=iso,
    )
    return await _lead_and_work(
        deps=deps, build=controllers, elector=elector, background=background, stop=stop
    )


def _on_signal(signum: int, stop: asyncio.Event, deadline: shutdown.Deadline) -> None:
    name = signal.Signals(signum).name
    if stop.is_set():
        log.warning("received %s while shutting down; still draining", name)
        return
    log.info("received %s, shutting down", name, extra={"deadline_s": shutdown.SHUTDOWN_TIMEOUT_S})
    deadline.arm()
    stop.set()


async def _log_when_synced(informers: Mapping[kinds.Kind, Informer]) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(i.synced() for i in informers.values()))
    log.info(
        "caches synced",
        extra={
            "seconds": round(loop.time() - started, 3),
            "objects": {kind.plural: len(i.list()) for kind, i in informers.items()},
        },
    )
    _return_freed_heap()
    await asyncio.Event().wait()  # background tasks end only when cancelled


def _return_freed_heap() -> None:
    """Give the heap the sync freed back to the system (glibc's `malloc_trim`): the
    LIST pages' buffers and what parsing them allocated are freed, but glibc keeps
    free heap pages mapped, about 3 MB of the RSS of 30,000 objects cached. Nothing
    happens where the C library has no `malloc_trim` (musl)."""
    import ctypes  # noqa: PLC0415 (used once, here)

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


async def _cancel_all(tasks: Mapping[asyncio.Future[None], str]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _wait(event: asyncio.Event) -> None:
    await event.wait()


async def _renew(elector: leader.LeaderElector) -> None:
    await elector.renew_until_lost()


async def _first(
    *, stop: asyncio.Event, watched: Mapping[asyncio.Future[None], str]
) -> set[asyncio.Future[None]]:
    """Wait until `stop` is set or a watched task ends; return the ended tasks."""
    stopping = asyncio.ensure_future(_wait(stop))
    try:
        done, _ = await asyncio.wait({*watched, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopping
    return {task for task in done if task is not stopping}


def _report_failures(
    ended: set[asyncio.Future[None]], names: Mapping[asyncio.Future[None], str]
) -> None:
    for task in ended:
        exc = None if task.cancelled() else task.exception()
        log.error("%s stopped unexpectedly", names[task], exc_info=exc)


async def _lead_and_work(
    *,
    deps: Deps,
    build: BuildControllers,
    elector: leader.LeaderElector | None,
    background: dict[asyncio.Future[None], str],
    stop: asyncio.Event,
) -> int:
    renewing: asyncio.Future[None] | None = None
    if elector is None:
        log.info("leader election disabled: running controllers")
    else:
        acquiring = asyncio.ensure_future(elector.acquire())
        ended = await _first(stop=stop, watched={**background, acquiring: "leader election"})
        if acquiring not in ended:
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquiring
            if ended:
                _report_failures(ended, background)
                return EXIT_FATAL
            log.info("stopped before becoming leader")
            return EXIT_OK
        acquiring.result()
        renewing = asyncio.ensure_future(_renew(elector))
        background[renewing] = "leader election"

    controllers = list(build(deps))
    work: dict[asyncio.Future[None], str] = {
        asyncio.ensure_future(c.run()): f"controller {c.name}" for c in controllers
    }
    log.info("controllers started", extra={"controllers": [c.name for c in controllers]})
    ended = await _first(stop=stop, watched={**background, **work})
    if not ended:
        await _drain(controllers)  # SIGTERM: finish what is in flight first
        await _flush_events(deps.events)
    await _cancel_all(work)
    if ended:
        await deps.events.close()  # no write after the Lease is lost
        if elector is not None and not elector.is_leader:
            log.error("lost the leader lease: stopped all work, exiting")
        else:
            _report_failures(ended, {**background, **work})
        return EXIT_FATAL
    if elector is not None and renewing is not None:
        await _cancel_all({renewing: "leader election"})
        await elector.release()
    return EXIT_OK


async def _flush_events(events: EventRecorder) -> None:
    """Write the event counts still held for a batched write (bounded: best effort)."""
    try:
        async with asyncio.timeout(EVENT_FLUSH_TIMEOUT):
            await events.flush()
    except TimeoutError:
        log.warning("could not write %d pending event count(s) in time", events.pending)


async def _drain(controllers: Sequence[Controller]) -> None:
    if not controllers:
        return
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT):
            await asyncio.gather(*(c.stop() for c in controllers))
    except TimeoutError:
        log.warning("reconciles still running after %ss; cancelling them", DRAIN_TIMEOUT)
