"""Logs without credentials, /metrics, and probes that tell alive from ready."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from agentforge import observability
from agentforge.settings import BindAddress, LogFormat, LogLevel


@contextlib.asynccontextmanager
async def _serving(
    probes: observability.Probes | None = None, registry: CollectorRegistry | None = None
) -> AsyncIterator[aiohttp.ClientSession]:
    """The operator's server on a free port, /metrics of `registry` if given, else the
    probes; a session to it."""
    address = BindAddress("127.0.0.1", 0)
    server = observability.ObservabilityServer(
        probes=probes or observability.Probes(),
        metrics_address=address if registry is not None else None,
        health_address=address if registry is None else None,
        registry=registry or REGISTRY,
    )
    await server.start()
    try:
        (bound,) = server.bound.values()
        async with aiohttp.ClientSession(base_url=f"http://{bound}") as session:
            yield session
    finally:
        await server.stop()


# --- redaction ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("request headers: Authorization: Bearer eyJhbGciOi.abc.def", "eyJhbGciOi.abc.def"),
        ('{"authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
        ("retrying with bearer sha256~Zm9vYmFy", "sha256~Zm9vYmFy"),
        ("login password=hunter2&user=admin", "hunter2"),
        ('{"username": "admin", "password": "p@ss w"}', "p@ss"),
        ("vcenter https://admin:s3cr3t@vc.example/sdk refused", "s3cr3t"),
        ("token: abc123def", "abc123def"),
    ],
)
def test_credentials_in_messages_are_redacted(text: str, secret: str) -> None:
    redacted = observability.redact(text)
    assert secret not in redacted
    assert observability.REDACTED in redacted


def test_ordinary_words_near_secret_names_survive_redaction() -> None:
    text = "tokenFile=/var/run/token and passwordless login for user admin"
    assert observability.redact(text) == text


def _capture(fmt: LogFormat) -> tuple[io.StringIO, logging.Logger]:
    stream = io.StringIO()
    observability.configure_logging(level=LogLevel.DEBUG, fmt=fmt, stream=stream)
    return stream, logging.getLogger("agentforge.test")


def test_json_lines_carry_message_level_and_extras_without_credentials() -> None:
    stream, log = _capture(LogFormat.JSON)
    log.info(
        "calling %s with Authorization: Bearer %s",
        "vcenter",
        "tok-123",
        extra={"pool": "ns/pool", "headers": {"Authorization": "Bearer tok-456"}},
    )
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "info"
    assert entry["logger"] == "agentforge.test"
    assert entry["msg"] == f"calling vcenter with Authorization: Bearer {observability.REDACTED}"
    assert entry["pool"] == "ns/pool"
    assert "tok-123" not in stream.getvalue()
    assert "tok-456" not in stream.getvalue()


def test_tracebacks_are_redacted_too() -> None:
    stream, log = _capture(LogFormat.TEXT)
    try:
        raise RuntimeError("login failed for password=swordfish")
    except RuntimeError:
        log.exception("vSphere login failed")
    output = stream.getvalue()
    assert "RuntimeError" in output
    assert "swordfish" not in output


def test_text_format_is_one_readable_line_with_extras() -> None:
    stream, log = _capture(LogFormat.TEXT)
    log.warning("lease request failed", extra={"lease": "ns/x"})
    line = stream.getvalue().strip()
    assert " WARNING agentforge.test: lease request failed lease=ns/x" in line


# --- /metrics -------------------------------------------------------------------------


async def test_metrics_endpoint_serves_the_registry_in_prometheus_text_format() -> None:
    registry = CollectorRegistry()
    things = Counter("agent_forge_things_total", "Things.", ["kind"], registry=registry)
    things.labels(kind="vm").inc(3)
    async with _serving(registry=registry) as client, client.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = families["agent_forge_things"].samples
    assert [(s.labels, s.value) for s in samples if s.name.endswith("_total")] == [
        ({"kind": "vm"}, 3.0)
    ]


# --- probes ---------------------------------------------------------------------------


async def test_readyz_is_503_until_every_check_passes_then_200() -> None:
    probes = observability.Probes()
    synced = {"agents": False, "machines": False}
    probes.add_readiness_check("informers-synced", lambda: all(synced.values()))
    probes.add_readiness_check("agents", lambda: synced["agents"])
    async with _serving(probes) as client:
        response = await client.get("/readyz")
        assert response.status == 503
        assert "[-]informers-synced failed" in await response.text()
        synced["agents"] = True
        assert (await client.get("/readyz")).status == 503
        synced["machines"] = True
        response = await client.get("/readyz")
        assert response.status == 200
        assert (await response.text()).splitlines() == [
            "[+]informers-synced ok",
            "[+]agents ok",
            "ok",
        ]


async def test_readyz_without_any_check_is_not_ready() -> None:
    async with _serving() as client, client.get("/readyz") as response:
        assert response.status == 503
        assert "no checks registered" in await response.text()


async def test_a_readiness_check_that_raises_counts_as_failing() -> None:
    probes = observability.Probes()

    def broken() -> bool:
        raise KeyError("boom")

    probes.add_readiness_check("broken", broken)
    probes.add_readiness_check("fine", lambda: True)
    assert probes.readiness() == {"broken": False, "fine": True}
    assert not probes.ready()


@pytest.mark.looptime
async def test_healthz_fails_while_the_event_loop_lags_and_recovers_after() -> None:
    loop = asyncio.get_running_loop()
    stall = 0.0
    probes = observability.Probes(interval=1.0, max_lag=5.0, clock=lambda: loop.time() + stall)
    heartbeat = asyncio.create_task(probes.heartbeat())
    try:
        await asyncio.sleep(3.5)
        assert probes.liveness() == {"ping": True, "event-loop": True}
        stall = 30.0  # the loop was blocked for 30 s between two ticks
        await asyncio.sleep(1.0)
        assert probes.liveness()["event-loop"] is False
        assert observability.EVENT_LOOP_LAG._value.get() >= 29.0
        await asyncio.sleep(1.0)  # the next tick is on time again
        assert probes.liveness()["event-loop"] is True
    finally:
        heartbeat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await heartbeat


async def test_healthz_is_200_while_the_process_is_alive() -> None:
    async with _serving() as client, client.get("/healthz") as response:
        assert response.status == 200
        assert (await response.text()).splitlines()[-1] == "ok"


# --- servers -----------------------------------------------------------------------------


async def test_servers_bind_port_zero_and_log_the_bound_addresses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probes = observability.Probes()
    probes.add_readiness_check("always", lambda: True)
    server = observability.ObservabilityServer(
        probes=probes,
        metrics_address=BindAddress("127.0.0.1", 0),
        health_address=BindAddress("127.0.0.1", 0),
    )
    with caplog.at_level(logging.INFO, logger="agentforge.observability"):
        await server.start()
    try:
        metrics, health = server.bound["metrics"], server.bound["health"]
        assert metrics.port != 0
        assert health.port not in (0, metrics.port)
        logged = {(r.endpoint, r.address) for r in caplog.records if r.msg == "serving"}  # type: ignore[attr-defined]
        assert logged == {("metrics", str(metrics)), ("health", str(health))}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{metrics}/metrics") as response:
                assert response.status == 200
                assert "agent_forge_event_loop_lag_seconds" in await response.text()
            async with session.get(f"http://{health}/readyz") as response:
                assert response.status == 200
            async with session.get(f"http://{metrics}/readyz") as response:
                assert response.status == 404
    finally:
        await server.stop()


async def test_a_server_turned_off_with_zero_is_not_started() -> None:
    server = observability.ObservabilityServer(
        probes=observability.Probes(),
        metrics_address=None,
        health_address=BindAddress("127.0.0.1", 0),
    )
    await server.start()
    try:
        assert set(server.bound) == {"health"}
    finally:
        await server.stop()
