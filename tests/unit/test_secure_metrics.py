"""/metrics over HTTPS behind the API server's review; the probes stay plain HTTP.

Real sockets and real TLS handshakes on 127.0.0.1; only the API server is scripted
(`fakes.ReviewApi`). The same server answers a real API server's reviews in
tests/kube/test_metrics_access.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry, Counter

from agentforge import observability, secure_metrics
from agentforge.kube import errors
from agentforge.kube.access_review import AccessReviewer
from agentforge.kube.client import KubeClient
from agentforge.settings import BindAddress
from sim.actors.waiting import eventually
from sim.controlplane import pki
from tests.unit.kube.fakes import ReviewApi

PROMETHEUS: dict[str, Any] = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "groups": [],
}
INTRUDER: dict[str, Any] = {"username": "system:serviceaccount:tenant:app", "groups": []}
LOCAL = BindAddress("127.0.0.1", 0)


@pytest.fixture
def api() -> ReviewApi:
    return ReviewApi(
        users={"prom-token": PROMETHEUS, "intruder-token": INTRUDER},
        grants={(PROMETHEUS["username"], "get", "/metrics")},
    )


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("secure_demo_total", "A sample.", registry=registry).inc()
    return registry


async def _serve(
    api: ReviewApi, tls: secure_metrics.MetricsTls, reviewer: AccessReviewer | None = None
) -> observability.ObservabilityServer:
    probes = observability.Probes()
    probes.add_readiness_check("always", lambda: True)
    reviewer = reviewer or AccessReviewer(cast(KubeClient, api))
    server = observability.ObservabilityServer(
        probes=probes,
        metrics_address=LOCAL,
        health_address=LOCAL,
        registry=_registry(),
        metrics_tls=tls,
        metrics_middlewares=[secure_metrics.authorization_middleware(reviewer)],
    )
    await server.start()
    return server


@pytest.fixture
async def self_signed(
    api: ReviewApi, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[observability.ObservabilityServer]:
    with caplog.at_level(logging.INFO, logger="agentforge.observability"):
        server = await _serve(api, secure_metrics.MetricsTls.self_signed())
    try:
        yield server
    finally:
        await server.stop()


async def _get(
    url: str, *, token: str | None = None, ssl_context: ssl.SSLContext | bool = False
) -> tuple[int, str, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=ssl_context) as response,
    ):
        return response.status, await response.text(), dict(response.headers)


# --- who gets in --------------------------------------------------------------------------


async def test_no_token_or_a_rejected_one_is_401_with_a_bearer_challenge(
    self_signed: observability.ObservabilityServer, api: ReviewApi
) -> None:
    url = f"https://{self_signed.bound['metrics']}/metrics"
    for token in (None, "forged"):
        status, body, headers = await _get(url, token=token)
        assert (status, body, headers["WWW-Authenticate"]) == (401, "Unauthorized\n", "Bearer")
    assert api.count("TokenReview") == 1  # no token: nothing to ask


async def test_unknown_tokens_beyond_the_review_budget_are_429_without_a_review(
    api: ReviewApi,
) -> None:
    # A clock that never moves: the bucket holds its burst of 2 and never refills.
    reviewer = AccessReviewer(cast(KubeClient, api), clock=lambda: 0.0, review_burst=2)
    server = await _serve(api, secure_metrics.MetricsTls.self_signed(), reviewer)
    try:
        url = f"https://{server.bound['metrics']}/metrics"
        answers = [await _get(url, token=f"forged-{i}") for i in range(5)]
        assert [status for status, _, _ in answers] == [401, 401, 429, 429, 429]
        assert {(body, headers["Retry-After"]) for _, body, headers in answers[2:]} == {
            ("Too many requests\n", "1")
        }
        assert api.count("TokenReview") == 2
        assert (await _get(url, token="forged-0"))[0] == 401  # refused, and remembered
        assert api.count("TokenReview") == 2
    finally:
        await server.stop()


async def test_a_known_user_without_the_role_is_403(
    self_signed: observability.ObservabilityServer,
) -> None:
    url = f"https://{self_signed.bound['metrics']}/metrics"
    status, body, _ = await _get(url, token="intruder-token")
    assert status == 403
    assert body == f"Authorization denied for user {INTRUDER['username']}\n"


async def test_a_user_allowed_get_metrics_reads_them(
    self_signed: observability.ObservabilityServer, api: ReviewApi
) -> None:
    url = f"https://{self_signed.bound['metrics']}/metrics"
    status, body, _ = await _get(url, token="prom-token")
    assert status == 200
    assert "secure_demo_total 1.0" in body
    (_, _), (_, access) = api.posted
    assert access["nonResourceAttributes"] == {"verb": "get", "path": "/metrics"}


async def test_other_paths_and_verbs_are_reviewed_as_such(
    self_signed: observability.ObservabilityServer, api: ReviewApi
) -> None:
    base = f"https://{self_signed.bound['metrics']}"
    assert (await _get(f"{base}/debug", token="prom-token"))[0] == 403
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": "Bearer prom-token"}
        async with session.post(f"{base}/metrics", headers=headers, ssl=False) as response:
            assert response.status == 403
    asked = [spec["nonResourceAttributes"] for kind, spec in api.posted if kind != "TokenReview"]
    assert asked == [{"verb": "get", "path": "/debug"}, {"verb": "post", "path": "/metrics"}]


async def test_an_api_server_that_does_not_answer_is_500_not_a_denial(
    self_signed: observability.ObservabilityServer, api: ReviewApi
) -> None:
    api.failure = errors.TransportError("connection refused")
    url = f"https://{self_signed.bound['metrics']}/metrics"
    status, body, _ = await _get(url, token="prom-token")
    assert status == 500
    assert "prom-token" not in body


async def test_plain_http_to_the_metrics_port_gets_nothing(
    self_signed: observability.ObservabilityServer,
) -> None:
    with pytest.raises(aiohttp.ClientError):
        await _get(f"http://{self_signed.bound['metrics']}/metrics", token="prom-token")


async def test_probes_stay_plain_http_without_a_token_on_their_own_port(
    self_signed: observability.ObservabilityServer, caplog: pytest.LogCaptureFixture
) -> None:
    metrics, health = self_signed.bound["metrics"], self_signed.bound["health"]
    assert metrics.port != health.port
    assert (await _get(f"http://{health}/healthz"))[0] == 200
    assert (await _get(f"http://{health}/readyz"))[0] == 200
    records = caplog.get_records("setup")  # the fixture started the servers
    logged = {(r.endpoint, r.scheme) for r in records if r.msg == "serving"}  # type: ignore[attr-defined]
    assert logged == {("metrics", "https"), ("health", "http")}


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer   abc", "abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer ", None),
        ("", None),
        ("abc", None),
    ],
)
def test_bearer_token_parsing(header: str, token: str | None) -> None:
    from aiohttp.test_utils import make_mocked_request  # noqa: PLC0415

    headers = {"Authorization": header} if header else {}
    assert secure_metrics.bearer_token(make_mocked_request("GET", "/", headers=headers)) == token


# --- certificates -------------------------------------------------------------------------


async def _served_certificate(address: BindAddress) -> x509.Certificate:
    pem = await asyncio.to_thread(ssl.get_server_certificate, (address.host, address.port))
    return x509.load_pem_x509_certificate(pem.encode())


async def test_the_generated_certificate_is_self_signed_ec_for_local_names(
    self_signed: observability.ObservabilityServer,
) -> None:
    cert = await _served_certificate(self_signed.bound["metrics"])
    assert cert.issuer == cert.subject
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 365 <= lifetime.days <= 366


def _secret_volume(directory: Path, version: Path) -> None:
    """Point `directory/..data` at `version` the way the kubelet updates a Secret volume:
    a new symlink renamed over the old one; tls.crt and tls.key resolve through it."""
    tmp = directory / "..data_tmp"
    tmp.symlink_to(version.name)
    os.replace(tmp, directory / "..data")
    for name in ("tls.crt", "tls.key"):
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


async def test_a_mounted_pair_is_served_verified_and_reloaded_when_rotated(
    api: ReviewApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    authority = pki.generate(tmp_path / "ca")
    mount = tmp_path / "mount"
    mount.mkdir()
    first = pki.issue_serving_pair(authority.ca, mount / "..v1", common_name="first")
    _secret_volume(mount, first.cert.parent)
    tls = secure_metrics.MetricsTls.from_files(mount / "tls.crt", mount / "tls.key", interval=0.05)
    server = await _serve(api, tls)
    try:
        address = server.bound["metrics"]
        trust = ssl.create_default_context(cafile=str(authority.ca.cert))
        url = f"https://localhost:{address.port}/metrics"
        assert (await _get(url, token="prom-token", ssl_context=trust))[0] == 200

        second = pki.issue_serving_pair(authority.ca, mount / "..v2", common_name="second")
        _secret_volume(mount, second.cert.parent)
        await eventually(  # the watcher checks every 0.05 s
            lambda: _served_certificate(address),
            lambda cert: "CN=second" in cert.subject.rfc4514_string(),
            within=10,
            interval=0.05,
            what="the rotated certificate served",
        )
        assert (await _get(url, token="prom-token", ssl_context=trust))[0] == 200

        broken = mount / "..v3"
        broken.mkdir()
        (broken / "tls.crt").write_text("not a certificate")
        (broken / "tls.key").write_bytes(second.key.read_bytes())
        _secret_volume(mount, broken)
        with caplog.at_level(logging.WARNING, logger="agentforge.secure_metrics"):
            assert tls.reload_if_changed() is False
        assert "still serving the previous one" in caplog.text
        assert "CN=second" in (await _served_certificate(address)).subject.rfc4514_string()
    finally:
        await server.stop()


def test_a_mounted_pair_that_does_not_match_is_refused_at_start(tmp_path: Path) -> None:
    authority = pki.generate(tmp_path / "ca")
    one = pki.issue_serving_pair(authority.ca, tmp_path / "one", common_name="one")
    two = pki.issue_serving_pair(authority.ca, tmp_path / "two", common_name="two")
    with pytest.raises(ssl.SSLError):
        secure_metrics.MetricsTls.from_files(one.cert, two.key)


def test_for_settings_turns_security_off_only_when_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agentforge.settings import Settings  # noqa: PLC0415

    client = cast(KubeClient, object())
    tls, middlewares = secure_metrics.for_settings(Settings(), client)
    assert tls is not None
    assert tls.generated
    assert len(middlewares) == 1
    with caplog.at_level(logging.WARNING, logger="agentforge.secure_metrics"):
        tls, middlewares = secure_metrics.for_settings(Settings(metrics_secure=False), client)
    assert (tls, middlewares) == (None, [])
    assert "plain HTTP without authentication" in caplog.text
    authority = pki.generate(tmp_path / "ca")
    pair = pki.issue_serving_pair(authority.ca, tmp_path / "pair", common_name="mounted")
    settings: Any = Settings(metrics_cert_path=pair.cert.parent)
    tls, _ = secure_metrics.for_settings(settings, client)
    assert tls is not None
    assert tls.cert_file == pair.cert
