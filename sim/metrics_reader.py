"""What a Prometheus holds to scrape the operator, set up in the test control plane.

`metrics_reader(controlplane)` applies the shipped binding of Prometheus' own
ServiceAccount to the metrics-reader ClusterRole of `config/rbac`
(`config/prometheus/metrics_reader.yaml`), makes that ServiceAccount, requests a
bound, expiring token for it (TokenRequest, as the kubelet projects one into the
Prometheus pod), and issues a serving certificate for the operator signed by the
control plane's CA, so a scraper can verify the operator's TLS as it would a mounted
certificate in a cluster. `sim.operator.OperatorProcess(..., metrics=reader)` uses all three.

`servicemonitor_targets(monitor, services)` is what the Prometheus Operator would
make of a ServiceMonitor (the test control plane runs none): the Services it selects
and the port of each to scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim import paths
from sim.controlplane import ControlPlane, identities

__all__ = ["SHIPPED", "MetricsReader", "metrics_reader", "servicemonitor_targets"]

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


_OPERATORS: dict[str, Callable[[str | None, list[str]], bool]] = {
    "In": lambda value, values: value in values,
    "NotIn": lambda value, values: value not in values,
    "Exists": lambda value, _: value is not None,
    "DoesNotExist": lambda value, _: value is None,
}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions) evaluated on `labels`."""
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and all(
        _OPERATORS[e["operator"]](labels.get(e["key"]), e.get("values") or [])
        for e in selector.get("matchExpressions") or []
    )


def servicemonitor_targets(
    monitor: Mapping[str, Any], services: Iterable[Mapping[str, Any]]
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(Service, endpoint) for each endpoint of `monitor` and each of `services` it
    scrapes, as the Prometheus Operator picks them: Services in the `namespaceSelector`
    (`any`, or `matchNames`; without one, the ServiceMonitor's own namespace) whose
    labels match the `selector`, with a port named as the endpoint's `port`."""
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector") or {}
    names = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
    return [
        (service, endpoint)
        for service in services
        if (namespaces.get("any") or service["metadata"].get("namespace") in names)
        and _selects(spec["selector"], service["metadata"].get("labels") or {})
        for endpoint in spec["endpoints"]
        if endpoint["port"] in {port.get("name") for port in service["spec"]["ports"]}
    ]
