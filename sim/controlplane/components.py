"""Command lines of the three processes, with the flags envtest uses and why we differ.

- etcd: loopback only, `--unsafe-no-fsync` (a test cluster never needs durability).
- kube-apiserver: envtest's flags (CONTROLPLANE.md), RBAC, ServiceAccount issuer and
  keys so TokenRequest works; authentication by bearer tokens only, because the
  HTTPS fault proxy terminates TLS and can forward a token but not a client
  certificate. The admin token sits in `--token-auth-file` (read once at start);
  users minted later are vouched for by the proxy's token webhook.
- the proxy: `python -m sim.controlplane.proxy` with this interpreter.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sim import paths
from sim.controlplane.pki import Pki


@dataclass(frozen=True, slots=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    proxy: int
    proxy_control: int


def etcd_argv(*, ports: Ports, data_dir: Path) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(paths.binary("etcd")),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(
    *, ports: Ports, pki: Pki, token_file: Path, webhook_kubeconfig: Path
) -> list[str]:
    return [
        str(paths.binary("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        "--authorization-mode=RBAC",
        "--disable-admission-plugins=ServiceAccount",
        f"--service-account-issuer=https://127.0.0.1:{ports.apiserver}/",
        f"--service-account-key-file={pki.service_account.cert}",
        f"--service-account-signing-key-file={pki.service_account.key}",
        f"--token-auth-file={token_file}",
        f"--authentication-token-webhook-config-file={webhook_kubeconfig}",
        "--authentication-token-webhook-version=v1",
        "--authentication-token-webhook-cache-ttl=10s",
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--v=1",
    ]


def proxy_argv(*, ports: Ports, pki: Pki) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sim.controlplane.proxy",
        f"--upstream=https://127.0.0.1:{ports.apiserver}",
        f"--ca-file={pki.ca.cert}",
        f"--cert-file={pki.proxy.cert}",
        f"--key-file={pki.proxy.key}",
        f"--port={ports.proxy}",
        f"--control-port={ports.proxy_control}",
    ]


def token_file_line(*, token: str, user: str, uid: str, groups: tuple[str, ...]) -> str:
    """One line of `--token-auth-file`: token,user,uid,"group1,group2"."""
    return f'{token},{user},{uid},"{",".join(groups)}"\n'


def webhook_kubeconfig_text(*, control_port: int) -> str:
    """Kubeconfig the apiserver uses to call the proxy's token webhook (plain HTTP, loopback)."""
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- name: proxy-webhook\n"
        "  cluster:\n"
        f"    server: http://127.0.0.1:{control_port}/authenticate\n"
        "users:\n"
        "- name: apiserver\n"
        "  user: {}\n"
        "contexts:\n"
        "- name: webhook\n"
        "  context: {cluster: proxy-webhook, user: apiserver}\n"
        "current-context: webhook\n"
    )
