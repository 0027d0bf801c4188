"""`ControlPlane`: a real etcd + kube-apiserver + fault proxy on loopback, for tests.

What it promises:
- `start()` returns only when etcd is healthy, the apiserver is ready (`/readyz`
  200 and the `default` namespace exists), the proxy answers, and every CRD is
  Established and served. `startup_seconds` says how long that took.
- Each process runs in its own process group; `stop()` SIGTERMs each group, SIGKILLs
  what is left after a grace period, and removes what it created in the workdir (the
  whole workdir when it made it). `stop()` is idempotent and also runs at exit.
- Every identity is a bearer token in a kubeconfig that verifies TLS with `ca_file`;
  kubeconfigs point at the proxy (`server`) unless they say "direct". The proxy is
  told each token's identity (by digest) so it can count requests per identity.
- Its own set-up requests (namespaces, ServiceAccounts, TokenRequests, CRDs) go
  straight to the apiserver, so the proxy's counters hold only the code under test.

Synchronous on purpose: session fixtures, the CLI and the demo call it; `async with`
runs start/stop in a worker thread so an event loop is never blocked by it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from sim import paths
from sim.controlplane import components, crds, identities, kubeconfig, pki
from sim.controlplane.control import ProxyControl
from sim.controlplane.identities import ADMIN_IDENTITY
from sim.controlplane.processes import ManagedProcess, free_ports, wait_for
from sim.controlplane.rest import RestClient, RestError

_LIVE: set[ControlPlane] = set()  # strong refs: a running one is never collected unstopped


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()


def default_crd_paths() -> list[Path]:
    """The external CRDs, plus ours from `config/crd/` when that folder exists."""
    found = [paths.EXTERNAL_CRDS_DIR]
    if paths.OUR_CRDS_DIR.is_dir():
        found.append(paths.OUR_CRDS_DIR)
    return found


class ControlPlane:
    """etcd, kube-apiserver and the fault proxy as three process groups."""

    def __init__(
        self,
        workdir: Path | None = None,
        crd_paths: Sequence[Path] | _Default = DEFAULT,
        *,
        startup_timeout: float = 120.0,
        quiet: bool = False,
    ) -> None:
        self._requested_workdir = workdir
        self._crd_paths = default_crd_paths() if isinstance(crd_paths, _Default) else crd_paths
        self._startup_timeout = startup_timeout
        self._quiet = quiet
        self._lock = threading.RLock()
        self._processes: list[ManagedProcess] = []
        self._created: list[Path] = []
        self._owns_workdir = False
        self._workdir: Path | None = None
        self._pki: pki.Pki | None = None
        self._ports: components.Ports | None = None
        self._admin_token = ""
        self._admin_kubeconfig: Path | None = None
        self._direct_admin_kubeconfig: Path | None = None
        self._kubeconfigs: dict[tuple[str, ...], Path] = {}
        self.startup_seconds: float | None = None

    # --- lifecycle -----------------------------------------------------------------
    def start(self) -> Self:
        with self._lock:
            if self._processes:
                raise RuntimeError("this ControlPlane is already started")
            started = time.monotonic()
            _LIVE.add(self)  # from here on, interpreter exit stops it too
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - started
        if not self._quiet:
            print(
                f"control plane ready in {self.startup_seconds:.1f}s: server {self.server} "
                f"(apiserver {self.apiserver_url}), workdir {self.workdir}",
                file=sys.stderr,
                flush=True,
            )
        return self

    def _start(self) -> None:
        etcd_bin, apiserver_bin = paths.binary("etcd"), paths.binary("kube-apiserver")
        del etcd_bin, apiserver_bin  # resolved first: a missing binary fails before any work
        workdir = self._prepare_workdir()
        self._pki = the_pki = pki.generate(self._own(workdir / "pki"))
        ports = self._ports = components.Ports(*free_ports(5))
        logs = self._own(workdir / "logs")
        logs.mkdir(exist_ok=True)
        auth = self._own(workdir / "auth")
        auth.mkdir(exist_ok=True)

        self._admin_token = identities.user_token()
        token_file = auth / "tokens.csv"
        token_file.write_text(
            components.token_file_line(
                token=self._admin_token, user="admin", uid="admin", groups=("system:masters",)
            )
        )
        token_file.chmod(0o600)
        webhook = auth / "webhook.kubeconfig"
        webhook.write_text(components.webhook_kubeconfig_text(control_port=ports.proxy_control))

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(paths.REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        etcd = ManagedProcess(
            name="etcd",
            argv=components.etcd_argv(ports=ports, data_dir=self._own(workdir / "etcd")),
            log_path=logs / "etcd.log",
        )
        proxy = ManagedProcess(
            name="proxy",
            argv=components.proxy_argv(ports=ports, pki=the_pki),
            log_path=logs / "proxy.log",
            env=env,
            cwd=paths.REPO_ROOT,
        )
        apiserver = ManagedProcess(
            name="kube-apiserver",
            argv=components.apiserver_argv(
                ports=ports, pki=the_pki, token_file=token_file, webhook_kubeconfig=webhook
            ),
            log_path=logs / "kube-apiserver.log",
        )
        # Stopped in reverse order: proxy first (cuts clients), etcd last.
        self._processes = [etcd, apiserver, proxy]
        timeout = self._startup_timeout

        etcd.start()
        proxy.start()
        etcd_client = RestClient(f"http://127.0.0.1:{ports.etcd_client}")
        wait_for(
            lambda: etcd_client.status_of("/health") == 200,
            what=f"etcd on 127.0.0.1:{ports.etcd_client} to be healthy",
            timeout=timeout,
            alive=[etcd],
        )
        apiserver.start()
        control = RestClient(self.proxy_control_url)
        wait_for(
            lambda: control.status_of("/healthz") == 200,
            what="the fault proxy's control port",
            timeout=timeout,
            alive=[proxy],
        )
        self.proxy.register_blocking(
            token=self._admin_token,
            name=ADMIN_IDENTITY,
            username="admin",
            uid="admin",
            groups=("system:masters",),
        )
        direct = self._direct_client()
        wait_for(
            lambda: (
                direct.status_of("/readyz") == 200
                and direct.status_of("/api/v1/namespaces/default") == 200
            ),
            what="kube-apiserver /readyz and the default namespace",
            timeout=timeout,
            alive=[etcd, apiserver, proxy],
        )
        self._admin_kubeconfig = self._write_kubeconfig(
            "admin.kubeconfig", user="admin", token=self._admin_token, via_proxy=True
        )
        self._direct_admin_kubeconfig = self._write_kubeconfig(
            "direct-admin.kubeconfig", user="admin", token=self._admin_token, via_proxy=False
        )
        if self._crd_paths:
            self.install_crds(self._crd_paths)

    def stop(self) -> None:
        """Stop every process group and remove what this control plane created."""
        with self._lock:
            for process in reversed(self._processes):
                process.stop()
            self._processes = []
            for path in reversed(self._created):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            self._created = []
            if self._owns_workdir and self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
            self._owns_workdir = False
            self._kubeconfigs.clear()
            _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    def pids(self) -> list[int]:
        """Process ids of the running components (each leads its own process group)."""
        return [p.pid for p in self._processes if p.pid is not None and p.running()]

    def running(self) -> bool:
        return bool(self._processes) and all(p.running() for p in self._processes)

    # --- where things are ----------------------------------------------------------
    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("ControlPlane is not started")
        return self._workdir

    @property
    def ca_file(self) -> Path:
        return self._started_pki().ca.cert

    def issue_serving_pair(
        self, directory: Path, *, common_name: str, hosts: tuple[str, ...] = ()
    ) -> pki.KeyPair:
        """`tls.crt` + `tls.key` in `directory` for localhost (and the DNS names `hosts`),
        signed by `ca_file`'s CA."""
        return pki.issue_serving_pair(
            self._started_pki().ca, directory, common_name=common_name, hosts=hosts
        )

    @property
    def server(self) -> str:
        """URL of the fault proxy: what clients under test should use."""
        return f"https://127.0.0.1:{self._started_ports().proxy}"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self._started_ports().apiserver}"

    @property
    def proxy_control_url(self) -> str:
        return f"http://127.0.0.1:{self._started_ports().proxy_control}"

    @property
    def proxy(self) -> ProxyControl:
        return ProxyControl(self.proxy_control_url)

    @property
    def admin_token(self) -> str:
        """The admin bearer token (system:masters), for raw HTTP clients in tests."""
        if not self._admin_token:
            raise RuntimeError("ControlPlane is not started")
        return self._admin_token

    @property
    def admin_kubeconfig(self) -> Path:
        """Admin (system:masters) through the proxy."""
        if self._admin_kubeconfig is None:
            raise RuntimeError("ControlPlane is not started")
        return self._admin_kubeconfig

    @property
    def direct_admin_kubeconfig(self) -> Path:
        """Admin straight to the apiserver (not counted, no faults)."""
        if self._direct_admin_kubeconfig is None:
            raise RuntimeError("ControlPlane is not started")
        return self._direct_admin_kubeconfig

    # --- identities ----------------------------------------------------------------
    def serviceaccount_kubeconfig(
        self, namespace: str, name: str, *, via_proxy: bool = True
    ) -> Path:
        """Kubeconfig of a ServiceAccount (created with its namespace when missing).

        The token comes from the TokenRequest API, valid for 30 days; the account
        has no permissions until a (Cluster)RoleBinding grants them.
        """
        key = ("sa", namespace, name, str(via_proxy))
        with self._lock:
            if key not in self._kubeconfigs:
                token = identities.serviceaccount_token(
                    self._direct_client(), namespace=namespace, name=name
                )
                username = identities.serviceaccount_username(namespace, name)
                self.proxy.register_blocking(
                    token=token, name=username, username=username, uid=username
                )
                self._kubeconfigs[key] = self._write_kubeconfig(
                    identities.serviceaccount_filename(namespace, name, via_proxy=via_proxy),
                    user=username,
                    token=token,
                    via_proxy=via_proxy,
                    namespace=namespace,
                )
            return self._kubeconfigs[key]

    def user_kubeconfig(
        self, name: str, groups: Iterable[str] = (), *, via_proxy: bool = True
    ) -> Path:
        """Kubeconfig of a plain user `name` in `groups` (no permissions until bound).

        The apiserver learns the user from the proxy's token webhook, so users can be
        minted at any time after start.
        """
        group_tuple = tuple(groups)
        key = ("user", name, *group_tuple, "|", str(via_proxy))
        with self._lock:
            if key not in self._kubeconfigs:
                token = identities.user_token()
                self.proxy.register_blocking(
                    token=token,
                    name=name,
                    username=name,
                    uid=f"user-{name}",
                    groups=group_tuple,
                    authenticate=True,
                )
                self._kubeconfigs[key] = self._write_kubeconfig(
                    identities.user_filename(name, group_tuple, via_proxy=via_proxy),
                    user=name,
                    token=token,
                    via_proxy=via_proxy,
                )
            return self._kubeconfigs[key]

    # --- set-up helpers --------------------------------------------------------------
    def install_crds(self, crd_paths: Iterable[Path]) -> None:
        """Apply the CRDs in these files/folders and wait until each is usable."""
        crds.install(self._direct_client(), crds.load(crd_paths), timeout=self._startup_timeout)

    def create_namespace(self, name: str) -> str:
        """Create a namespace if it does not exist yet; return its name."""
        return identities.create_namespace(self._direct_client(), name)

    def direct_client(self) -> RestClient:
        """A blocking admin client straight to the apiserver (for set-up in tests)."""
        return self._direct_client()

    # --- internals ---------------------------------------------------------------------
    def _direct_client(self) -> RestClient:
        return RestClient(self.apiserver_url, ca_file=self.ca_file, token=self.admin_token)

    def _started_pki(self) -> pki.Pki:
        if self._pki is None:
            raise RuntimeError("ControlPlane is not started")
        return self._pki

    def _started_ports(self) -> components.Ports:
        if self._ports is None:
            raise RuntimeError("ControlPlane is not started")
        return self._ports

    def _prepare_workdir(self) -> Path:
        requested = self._requested_workdir
        if requested is None:
            workdir = Path(tempfile.mkdtemp(prefix="agentforge-controlplane-"))
            self._owns_workdir = True
        else:
            workdir = requested.resolve()
            self._owns_workdir = not workdir.exists()
            workdir.mkdir(parents=True, exist_ok=True)
        self._workdir = workdir
        return workdir

    def _own(self, path: Path) -> Path:
        """Note a path this control plane creates in the workdir (removed by stop)."""
        if path.is_dir():
            shutil.rmtree(path)  # left over from an earlier run in the same workdir
        self._created.append(path)
        return path

    def _write_kubeconfig(
        self, filename: str, *, user: str, token: str, via_proxy: bool, namespace: str = "default"
    ) -> Path:
        server = self.server if via_proxy else self.apiserver_url
        path = self._own(self.workdir / filename)
        return kubeconfig.write(
            path, server=server, ca_file=self.ca_file, user=user, token=token, namespace=namespace
        )


@atexit.register
def _stop_leftovers() -> None:
    """Never leave etcd/apiserver/proxy behind when the interpreter exits."""
    for control_plane in list(_LIVE):
        with contextlib.suppress(Exception):
            control_plane.stop()


__all__ = ["ADMIN_IDENTITY", "DEFAULT", "ControlPlane", "RestError", "default_crd_paths"]
