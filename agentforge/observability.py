"""What the process tells the outside: logs, metrics and probes.

* Logging: one handler on the root logger writing JSON lines (for collectors) or
  text (for people). Every record passes a redaction filter first, so a credential
  (a bearer token, an `Authorization` header, a `password=` value, a URL's password
  or API key, a JWT) that reaches a log message, an `extra` value or a traceback is
  replaced by `[REDACTED]`, and the formatted line is redacted once more (nested
  extras); credentials never leave the process through the logs, whoever logged
  them. The rules (docs/security.md#what-is-redacted) are
  `agentforge.redaction`'s; `redact` and `REDACTED` are re-exported here.
* Metrics: Prometheus' default registry, so metrics declared at module level by
  the runtime (work queues, leader election) are served without wiring.
* Probes: `/healthz` answers 200 while the process is alive and its event loop
  keeps a heartbeat (a loop that lags more than `max_lag` is reported unhealthy);
  `/readyz` answers 200 only when every registered readiness check passes (the app
  registers "informers synced"), 503 before. Each body lists the checks, as the
  apiserver's `?verbose` output does.
* Servers: `/metrics` on the metrics address and the probes on the health address
  (one server when both are the same and /metrics is plain HTTP); port 0 binds a free
  port, and the bound addresses are logged (`serving` with `endpoint`, `address` and
  `scheme`) so tests can find them. Given a TLS context and middlewares
  (`agentforge.secure_metrics`: HTTPS, bearer tokens checked with the API server)
  the metrics server uses them; the probes stay plain HTTP without authentication on
  their own port, because the kubelet probes them so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import ssl
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, Gauge
from prometheus_client.exposition import choose_encoder

from agentforge.redaction import REDACTED, redact
from agentforge.settings import BindAddress, LogFormat, LogLevel

__all__ = [
    "EVENT_LOOP_LAG",
    "REDACTED",
    "ObservabilityServer",
    "Probes",
    "RedactingFilter",
    "configure_logging",
    "redact",
]

log = logging.getLogger(__name__)

EVENT_LOOP_LAG = Gauge(
    "agent_forge_event_loop_lag_seconds",
    "How late the last event-loop heartbeat woke up (a busy or blocked loop lags).",
)

# --- logging -----------------------------------------------------------------------

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}


class RedactingFilter(logging.Filter):
    """Rewrites a record's message, string extras and traceback without credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_redacted", False):
            return True
        record.msg = redact(record.getMessage())
        record.args = None
        for key, value in _extras(record).items():
            if isinstance(value, str):
                setattr(record, key, redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        record.exc_info = None  # the redacted exc_text is what formatters print
        record._redacted = True
        return True


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the record's extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            if not key.startswith("_"):
                entry[key] = value
        if record.exc_text:
            entry["exc"] = record.exc_text
        # Redact the whole line too: nested extras (a dict of headers) are not strings.
        return redact(json.dumps(entry, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """`<ts> <LEVEL> <logger>: <msg> key=value ...` for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items() if not k.startswith("_"))
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extras:
            line += f" {extras}"
        if record.exc_text:
            line += "\n" + record.exc_text
        return redact(line)


def configure_logging(
    *, level: LogLevel, fmt: LogFormat, stream: TextIO | None = None
) -> logging.Handler:
    """Route every logger to one redacting handler on `stream` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.value.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler


# --- probes --------------------------------------------------------------------------


class Probes:
    """Liveness from an event-loop heartbeat; readiness from named checks."""

    def __init__(
        self,
        *,
        interval: float = 1.0,
        max_lag: float = 5.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._interval = interval
        self._max_lag = max_lag
        self._checks: dict[str, Callable[[], bool]] = {}
        self._last_beat: float | None = None
        self._lag = 0.0

    def add_readiness_check(self, name: str, check: Callable[[], bool]) -> None:
        self._checks[name] = check

    def readiness(self) -> dict[str, bool]:
        """Each check's verdict; no check registered means not ready."""
        results: dict[str, bool] = {}
        for name, check in self._checks.items():
            try:
                results[name] = bool(check())
            except Exception:  # a broken check is a failing check, never a crash
                log.exception("readiness check failed", extra={"check": name})
                results[name] = False
        return results

    def ready(self) -> bool:
        results = self.readiness()
        return bool(results) and all(results.values())

    def liveness(self) -> dict[str, bool]:
        now = self._clock()
        stalled = self._last_beat is not None and now - self._last_beat > (
            self._interval + self._max_lag
        )
        return {"ping": True, "event-loop": not stalled and self._lag <= self._max_lag}

    async def heartbeat(self) -> None:
        """Tick forever, measuring how late each tick wakes up."""
        self._last_beat = self._clock()
        while True:
            await asyncio.sleep(self._interval)
            now = self._clock()
            self._lag = max(0.0, now - self._last_beat - self._interval)
            self._last_beat = now
            EVENT_LOOP_LAG.set(self._lag)


def _probe_response(results: dict[str, bool]) -> web.Response:
    ok = bool(results) and all(results.values())
    lines = [
        f"[{'+' if passed else '-'}]{name} {'ok' if passed else 'failed'}"
        for name, passed in results.items()
    ]
    lines.append("ok" if ok else "not ok" if results else "no checks registered")
    return web.Response(status=200 if ok else 503, text="\n".join(lines) + "\n")


def _health_routes(probes: Probes) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return _probe_response(probes.liveness())

    async def readyz(_: web.Request) -> web.Response:
        return _probe_response(probes.readiness())

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]


def _metrics_routes(registry: CollectorRegistry) -> list[web.RouteDef]:
    async def metrics(request: web.Request) -> web.Response:
        # Negotiated as prometheus_client's own handler does (text 0.0.4 by default).
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(registry), headers={"Content-Type": content_type})

    return [web.get("/metrics", metrics)]


class ServingTls(Protocol):
    """A server's TLS context and the task that keeps its certificate current."""

    context: ssl.SSLContext

    async def watch(self) -> None: ...


class ObservabilityServer:
    """The HTTP servers for /metrics and the probes, plus the heartbeat they read."""

    def __init__(
        self,
        *,
        probes: Probes,
        metrics_address: BindAddress | None,
        health_address: BindAddress | None,
        registry: CollectorRegistry = REGISTRY,
        metrics_tls: ServingTls | None = None,
        metrics_middlewares: Iterable[Any] = (),
    ) -> None:
        self.probes = probes
        self._registry = registry
        self._metrics_address = metrics_address
        self._health_address = health_address
        self._metrics_tls = metrics_tls
        self._metrics_middlewares = tuple(metrics_middlewares)
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.bound: dict[str, BindAddress] = {}

    async def start(self) -> None:
        """Bind the servers (and start the heartbeat); `bound` then holds the addresses."""
        self._tasks.append(asyncio.create_task(self.probes.heartbeat(), name="heartbeat"))
        servers: list[_Server] = []
        if self._metrics_address is not None:
            routes = _metrics_routes(self._registry)
            tls, middlewares = self._metrics_tls, self._metrics_middlewares
            servers.append(_Server(self._metrics_address, ["metrics"], routes, tls, middlewares))
            if tls is not None:
                self._tasks.append(asyncio.create_task(tls.watch(), name="metrics-certificate"))
        if self._health_address is not None:
            routes = _health_routes(self.probes)
            shared = servers[0] if servers else None
            if (
                shared is not None
                and shared.address == self._health_address
                and shared.address.port
                and shared.tls is None
                and not shared.middlewares
            ):
                shared.endpoints.append("health")
                shared.routes.extend(routes)
            else:
                servers.append(_Server(self._health_address, ["health"], routes))
        try:
            for server in servers:
                await self._serve(server)
        except BaseException:
            await self.stop()
            raise

    async def _serve(self, server: _Server) -> None:
        app = web.Application(middlewares=list(server.middlewares))
        app.add_routes(server.routes)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        context = server.tls.context if server.tls is not None else None
        site = web.TCPSite(
            runner,
            host=server.address.host,
            port=server.address.port,
            reuse_address=True,
            ssl_context=context,
        )
        await site.start()
        bound = BindAddress(server.address.host, int(runner.addresses[0][1]))
        scheme = "http" if context is None else "https"
        for endpoint in server.endpoints:
            self.bound[endpoint] = bound
            log.info(
                "serving", extra={"endpoint": endpoint, "address": str(bound), "scheme": scheme}
            )

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


@dataclass(slots=True)
class _Server:
    """One listening socket: its routes, and TLS and middlewares (the metrics server's)."""

    address: BindAddress
    endpoints: list[str]
    routes: list[web.RouteDef]
    tls: ServingTls | None = None
    middlewares: tuple[Any, ...] = ()
