"""What a Prometheus holds to scrape the operator, set up in the test control plane.

`metrics_reader(controlplane)` applies the shipped binding of Prometheus' own
ServiceAccount to the metrics-reader ClusterRole of `config/rbac`
(`config/prometheus/metrics_reader.yaml`), makes that ServiceAccount, requests a
bound, expiring token for it (TokenRequest, as the kubelet projects one into the
Prometheus pod), and issues a serving certificate for the operator signed by the
control plane's CA, so a scraper can verify the operator's TLS as it would a mounted
certificate in a cluster. `sim.operator.OperatorProcess(..., metrics=reader)` uses all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim import paths
from sim.controlplane import ControlPlane, identities

__all__ = ["SHIPPED", "MetricsReader", "metrics_reader"]

SHIPPED = paths.REPO_ROOT / "config" / "prometheus" / "metrics_reader.yaml"
_PLURALS = {"ClusterRoleBinding": "clusterrolebindings"}


@dataclass(frozen=True, slots=True)
class MetricsReader:
    """What a Prometheus holds to scrape the operator, and the operator's certificate."""

    identity: str
    token: str
    ca_file: Path
    cert_dir: Path


def metrics_reader(controlplane: ControlPlane) -> MetricsReader:
    """The shipped metrics-reader binding (config/prometheus/metrics_reader.yaml) applied,
    a token of the Prometheus ServiceAccount it names, and a serving certificate for the
    operator signed by the CA.

    The ClusterRole it binds comes with the operator's RBAC (`install_operator` or
    `config/rbac`).
    """
    client = controlplane.direct_client()
    account: Mapping[str, Any] | None = None
    for obj in yaml.safe_load_all(SHIPPED.read_text()):
        (account,) = [s for s in obj["subjects"] if s["kind"] == "ServiceAccount"]
        client.request(
            "PATCH",
            _path(obj) + "?fieldManager=agentforge-sim&force=true",
            body=obj,
            content_type="application/apply-patch+yaml",
        )
    assert account is not None, f"{SHIPPED} binds no ServiceAccount"
    namespace, name = account["namespace"], account["name"]
    token = identities.serviceaccount_token(client, namespace=namespace, name=name)
    cert_dir = controlplane.workdir / "operator-metrics-tls"
    controlplane.issue_serving_pair(cert_dir, common_name="agent-forge-metrics")
    return MetricsReader(
        identity=identities.serviceaccount_username(namespace, name),
        token=token,
        ca_file=controlplane.ca_file,
        cert_dir=cert_dir,
    )


def _path(obj: Mapping[str, Any]) -> str:
    api_version, meta = str(obj["apiVersion"]), obj["metadata"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    namespace = meta.get("namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{_PLURALS[obj['kind']]}/{meta['name']}"
