"""Who may read /metrics, decided by the real API server: 401 without a token, 403 for
an identity without the metrics-reader role, 200 with it; probes need no token.

The operator runs as a deployment runs it (`install_operator`: its generated RBAC,
including `create` on tokenreviews and subjectaccessreviews), the reader is the
shipped `config/prometheus/metrics_reader.yaml` identity bound to the shipped
metrics-reader ClusterRole, and every token comes from the TokenRequest API. The
operator's reviews go through the counting proxy, so their cost is measured: also
under a flood of made-up tokens, which costs the review budget, not a review each.
A certificate for the Service's name, mounted as config/openshift and
config/cert-manager mount theirs, is verified for the serverName their ServiceMonitors
name, and refused for another.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from agentforge.kube.access_review import REVIEW_BURST, REVIEW_RATE
from scripts import kustomize
from sim.controlplane import identities
from sim.controlplane.control import ProxyControl
from sim.controlplane.controlplane import ControlPlane
from sim.operator import MetricsReader, OperatorProcess, install_operator, metrics_reader
from sim.operator import operator_identity as operator_user

REPO = Path(__file__).resolve().parents[2]
TOKEN_REVIEWS = ("create", "tokenreviews.authentication.k8s.io")
ACCESS_REVIEWS = ("create", "subjectaccessreviews.authorization.k8s.io")


@pytest.fixture(scope="module")
def operator_kubeconfig(controlplane: ControlPlane) -> Path:
    return install_operator(controlplane)


@pytest.fixture(scope="module")
def reader(controlplane: ControlPlane, operator_kubeconfig: Path) -> MetricsReader:
    return metrics_reader(controlplane)


@pytest.fixture
async def operator(
    operator_kubeconfig: Path, reader: MetricsReader, namespace: str, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        "--namespace",
        namespace,
        log_path=tmp_path / "operator.log",
        metrics=reader,  # --metrics-cert-path: a certificate the reader verifies
    )
    async with process:
        await process.wait_serving(within=60)
        yield process


def _stranger_token(controlplane: ControlPlane, namespace: str) -> str:
    """A valid token of a ServiceAccount no role grants `get /metrics`."""
    return identities.serviceaccount_token(
        controlplane.direct_client(), namespace=namespace, name=f"app-{secrets.token_hex(3)}"
    )


async def test_no_token_401_a_stranger_403_the_metrics_reader_200(
    operator: OperatorProcess, reader: MetricsReader, controlplane: ControlPlane, namespace: str
) -> None:
    assert operator.metrics_scheme == "https"
    status, body = await operator.get_metrics(token=None)
    assert (status, body) == (401, "Unauthorized\n")
    status, _ = await operator.get_metrics(token="not-a-token")
    assert status == 401

    stranger = await asyncio.to_thread(_stranger_token, controlplane, namespace)
    status, body = await operator.get_metrics(token=stranger)
    assert status == 403
    assert f"system:serviceaccount:{namespace}:app-" in body

    status, body = await operator.get_metrics(token=reader.token)
    assert status == 200
    assert "agent_forge_build_info" in body
    assert reader.token not in await asyncio.to_thread(operator.log_text)


async def test_probes_answer_plain_http_without_a_token(operator: OperatorProcess) -> None:
    assert await operator.healthz() == 200
    await operator.wait_ready(within=60)
    assert operator.health_address != operator.metrics_address
    assert operator.metrics_address is not None
    with pytest.raises(aiohttp.ClientError):  # the metrics port speaks only TLS
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{operator.metrics_address}/metrics") as response,
        ):
            await response.read()


async def test_repeated_scrapes_are_answered_from_the_review_caches(
    operator: OperatorProcess, reader: MetricsReader, proxy: ProxyControl
) -> None:
    await proxy.reset_counts()
    for _ in range(10):
        assert (await operator.get_metrics(token=reader.token))[0] == 200
    counts = await proxy.counts(operator_user())
    # One TokenReview and one SubjectAccessReview for ten scrapes (a minute's worth at
    # Prometheus' usual 15 s would cost the same): the rest came from the caches.
    assert counts.get(TOKEN_REVIEWS) == 1
    assert counts.get(ACCESS_REVIEWS) == 1


async def test_a_flood_of_made_up_tokens_costs_the_api_server_the_review_budget_only(
    operator: OperatorProcess, reader: MetricsReader, proxy: ProxyControl
) -> None:
    assert (await operator.get_metrics(token=reader.token))[0] == 200  # known from now on
    await proxy.reset_counts()
    statuses: Counter[int] = Counter()
    flood = 300
    started = time.monotonic()
    for _ in range(flood):
        statuses[(await operator.get_metrics(token=secrets.token_urlsafe(24)))[0]] += 1
    elapsed = time.monotonic() - started
    reviews = (await proxy.counts(operator_user())).get(TOKEN_REVIEWS, 0)
    # Refused (401) after a review, or turned away (429) without one: each made-up
    # token is one or the other, and the reviews are the bucket's burst (less the one
    # the reader spent) plus its refill while the flood lasted, not one per token.
    assert set(statuses) <= {401, 429}
    assert statuses[401] == reviews
    assert statuses[429] == flood - reviews
    assert REVIEW_BURST - 1 <= reviews <= REVIEW_BURST + math.ceil(REVIEW_RATE * elapsed)
    # The reader's token stayed cached through the flood: still answered, no review.
    assert (await operator.get_metrics(token=reader.token))[0] == 200
    counts = await proxy.counts(operator_user())
    assert counts.get(TOKEN_REVIEWS, 0) == reviews
    assert ACCESS_REVIEWS not in counts


def _service_server_name(overlay: str) -> str:
    """The serverName the overlay's ServiceMonitor verifies the operator's certificate for."""
    objects = kustomize.build(REPO / "config" / overlay)
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    return str(monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"])


@pytest.mark.parametrize("overlay", ["openshift", "cert-manager"])
async def test_a_mounted_service_certificate_is_verified_as_the_overlays_service_monitor_does(
    overlay: str,
    operator_kubeconfig: Path,
    reader: MetricsReader,
    controlplane: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    # The Secret the service CA or cert-manager writes: a pair for the Service's name,
    # signed by a CA Prometheus trusts (here the control plane's), in a directory.
    server_name = _service_server_name(overlay)
    cert_dir = tmp_path / "metrics-tls"
    controlplane.issue_serving_pair(
        cert_dir, common_name="agent-forge-metrics", hosts=(server_name,)
    )
    process = OperatorProcess(
        operator_kubeconfig,
        "--namespace",
        namespace,
        log_path=tmp_path / "operator.log",
        metrics=dataclasses.replace(reader, cert_dir=cert_dir),
    )
    async with process:
        await process.wait_serving(within=60)
        verify = ssl.create_default_context(cafile=str(reader.ca_file))
        headers = {"Authorization": f"Bearer {reader.token}"}

        async def scrape(name: str) -> int:
            async with (
                aiohttp.ClientSession() as session,
                session.get(
                    process.metrics_url, headers=headers, ssl=verify, server_hostname=name
                ) as response,
            ):
                return response.status

        assert await scrape(server_name) == 200  # verified for the name, token accepted
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await scrape(server_name.replace("metrics-service", "other-service"))


async def test_without_a_mounted_certificate_a_self_signed_one_is_served_with_the_same_checks(
    operator_kubeconfig: Path, reader: MetricsReader, namespace: str, tmp_path: Path
) -> None:
    process = OperatorProcess(
        operator_kubeconfig, "--namespace", namespace, log_path=tmp_path / "operator.log"
    )
    async with process:
        await process.wait_serving(within=60)
        assert (await process.get_metrics(token=None))[0] == 401
        assert (await process.get_metrics(token=reader.token))[0] == 200
        assert process.metrics_address is not None
        host, _, port = process.metrics_address.rpartition(":")
        pem = await asyncio.to_thread(ssl.get_server_certificate, (host, int(port)))
        cert = x509.load_pem_x509_certificate(pem.encode())
        assert cert.issuer == cert.subject  # generated at start, signed by itself
        with pytest.raises(RuntimeError, match="metrics_reader"):
            await process.metrics_text()  # no reader given: no token to guess
