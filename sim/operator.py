"""The real operator as a child process, for integration tests, the demo and benchmarks.

`OperatorProcess(kubeconfig, *args)` runs `python -m agentforge run` (or, with
`probe=True`, the same operator plus the probe controller below) with JSON logs
appended to a file, metrics and probes bound to `127.0.0.1:0`. The kernel picks the
ports and the operator logs them ("serving"), so there is no free-port race:
`wait_serving()` reads them back from the log. The process runs in its own session
so `kill()` (SIGKILL) and `terminate()` (SIGTERM) reach it alone; leaving the
context manager SIGTERMs it and SIGKILLs it if it lingers. `uid=` runs it as that UID
in group 0 alone (through `setpriv`, which needs root), `python=` with another
interpreter than the harness' (one that UID can execute).

Waiting is always for a named condition with a deadline (`wait_ready`, `wait_log`,
`wait_exit`, `first_to_log`); a process that dies while waited for fails the wait at
once with the tail of its log.

`install_operator(controlplane)` installs what a deployment would, generated from
the code (our CRDs, the RBAC of `config/rbac`) and returns the kubeconfig of the
operator's ServiceAccount, so tests run the operator with exactly its permissions.
`grant_credentials(controlplane, namespace, ...)` adds what an installer adds for each
credentials namespace: the RoleBinding that lets the operator `get` Secrets there.

/metrics is served as in a cluster: HTTPS, only to bearer tokens the API server
authorises for `get /metrics`. `metrics_reader(controlplane)` (`sim.metrics_reader`,
re-exported here) sets up what Prometheus has: the shipped metrics-reader identity,
a token for it, and a serving certificate for the operator signed by the control
plane's CA. `OperatorProcess(..., metrics=reader)` starts the operator with that
certificate (`--metrics-cert-path`) and scrapes with the token, verifying the
certificate; without it the operator serves its self-signed certificate and
`metrics()` refuses to guess a token.

`python -m sim.operator <run flags>` is the probe mode: the operator with one extra
controller, "probe", that reconciles Agents and, for an Agent whose annotation
`PROBE_STAMP` holds a Unix time, logs "probe reconciled" with the seconds from that
stamp to the start of the reconcile (`latency_s`: API write, watch, informer, queue)
and from the informer's delivery of the event to the start of the reconcile
(`event_latency_s`: the operator's own share), as the benchmarks report them. It is
not part of the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sim import paths
from sim.controlplane import ControlPlane
from sim.metrics_reader import MetricsReader, metrics_reader

__all__ = [
    "PROBE_STAMP",
    "MetricsReader",
    "OperatorExited",
    "OperatorProcess",
    "Sample",
    "first_to_log",
    "grant_credentials",
    "install_operator",
    "metrics_reader",
    "operator_identity",
]

PROBE_STAMP = "bench.agent-forge.containeroo.ch/stamp"
_TAIL = 4000

Sample = tuple[str, dict[str, str], float]


def operator_identity(namespace: str | None = None) -> str:
    """The user name the operator's ServiceAccount has (the proxy counts by it)."""
    from agentforge.api import names  # noqa: PLC0415

    return (
        f"system:serviceaccount:{namespace or names.DEPLOYMENT_NAMESPACE}:{names.SERVICE_ACCOUNT}"
    )


def install_operator(controlplane: ControlPlane, *, namespace: str | None = None) -> Path:
    """Install what a deployment installs, as generated from the code; return its kubeconfig.

    Our CRDs (`crdgen`) and the RBAC of `config/rbac` (rendered from the code's
    `rbac.needs` declarations, so a missing permission fails here as it would in a
    cluster), then the kubeconfig of the operator's ServiceAccount. Idempotent.
    """
    import yaml  # noqa: PLC0415

    import agentforge.app  # noqa: F401, PLC0415 (its import declares every RBAC need)
    from agentforge.api import crdgen, names, rbac  # noqa: PLC0415

    namespace = namespace or names.DEPLOYMENT_NAMESPACE
    crd_dir = controlplane.workdir / "agentforge-crds"
    crd_dir.mkdir(exist_ok=True)
    for file_name, crd in crdgen.render_all().items():
        (crd_dir / file_name).write_text(yaml.safe_dump(crd))
    controlplane.install_crds([crd_dir])
    controlplane.create_namespace(namespace)
    client = controlplane.direct_client()
    for _, obj in rbac.render(rbac.REGISTRY, namespace=namespace).values():
        client.request(
            "PATCH",
            _object_path(obj) + "?fieldManager=agentforge-sim&force=true",
            body=obj,
            content_type="application/apply-patch+yaml",
        )
    return controlplane.serviceaccount_kubeconfig(namespace, names.SERVICE_ACCOUNT)


def grant_credentials(
    controlplane: ControlPlane, *namespaces: str, operator_namespace: str | None = None
) -> None:
    """Let the operator `get` Secrets in `namespaces`, as an installer does for its
    credentials namespaces (a RoleBinding to the credentials-reader ClusterRole in each,
    docs/installation.md); nothing in config/rbac grants Secrets by itself. Idempotent."""
    from agentforge.api import names, rbac  # noqa: PLC0415

    client = controlplane.direct_client()
    for namespace in namespaces:
        binding = rbac.credentials_binding(
            namespace, operator_namespace=operator_namespace or names.DEPLOYMENT_NAMESPACE
        )
        client.request(
            "PATCH",
            _object_path(binding) + "?fieldManager=agentforge-sim&force=true",
            body=binding,
            content_type="application/apply-patch+yaml",
        )


def _object_path(obj: Mapping[str, Any]) -> str:
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    meta = obj["metadata"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    plural = {"ServiceAccount": "serviceaccounts"}.get(kind, kind.lower() + "s")
    namespace = meta.get("namespace")
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{where}/{plural}/{meta['name']}"


class OperatorExited(RuntimeError):
    """The operator exited while a condition was awaited; the message has its log tail."""


class OperatorProcess:
    """One operator process: start, wait for conditions, signal it, read its output."""

    def __init__(
        self,
        kubeconfig: Path,
        *args: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        probe: bool = False,
        name: str = "operator",
        metrics: MetricsReader | None = None,
        uid: int | None = None,
        python: str = sys.executable,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.args = args
        self.log_path = log_path
        self.name = name
        self.metrics_reader = metrics
        self._env = env
        self._probe = probe
        self._uid = uid
        self._python = python
        self._process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.metrics_address: str | None = None
        self.metrics_scheme = "https"
        self.health_address: str | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        module = "sim.operator" if self._probe else "agentforge"
        argv = [self._python, "-m", module]
        if self._uid is not None:  # as OpenShift's restricted SCC runs a pod: group 0 alone
            setpriv = ["setpriv", f"--reuid={self._uid}", "--regid=0", "--clear-groups"]
            argv = [*setpriv, *argv]
        if not self._probe:
            argv.append("run")
        argv += [
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-probe-bind-address",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ]
        if self.metrics_reader is not None:
            argv += ["--metrics-cert-path", str(self.metrics_reader.cert_dir)]
        argv += self.args
        env = dict(os.environ if self._env is None else self._env)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(paths.REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.pop("KUBECONFIG", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=paths.REPO_ROOT,
                start_new_session=True,
            )
        self.metrics_address = self.health_address = None
        return self

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to release anything."""
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: the operator drains, releases its Lease and exits 0."""
        self._signal(signal.SIGTERM)

    def _signal(self, signum: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    async def wait_exit(self, *, within: float) -> int:
        """The exit code, once the process has exited (TimeoutError after `within` s)."""
        try:
            async with asyncio.timeout(within):
                while (code := self.returncode) is None:  # noqa: ASYNC110 (a child's exit)
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise TimeoutError(
                f"{self.name} still running after {within}s; log:\n{self._tail()}"
            ) from None
        return code

    async def stop(self, *, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; return the exit code."""
        if self._process is None:
            return None
        self.terminate()
        try:
            return await self.wait_exit(within=grace)
        except TimeoutError:
            self.kill()
            return await self.wait_exit(within=5.0)

    async def __aenter__(self) -> Self:
        return self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- output -------------------------------------------------------------------------

    def log_text(self) -> str:
        """Everything this run wrote (stdout and stderr)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_entries(self) -> list[dict[str, Any]]:
        """The JSON log lines of this run (other output, e.g. a crash, is skipped)."""
        entries = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    entries.append(json.loads(line))
        return entries

    def _tail(self) -> str:
        return self.log_text()[-_TAIL:]

    def _check_alive(self, what: str) -> None:
        code = self.returncode
        if code is not None:
            raise OperatorExited(
                f"{self.name} exited with {code} while waiting for {what}; "
                f"log {self.log_path}:\n{self._tail()}"
            )

    async def wait_log(
        self, msg: str, *, within: float, where: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The first JSON log entry with this `msg` (and these fields), once written."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            for entry in self.log_entries():
                if entry.get("msg") == msg and all(
                    entry.get(k) == v for k, v in (where or {}).items()
                ):
                    return entry
            if msg != "shut down":
                self._check_alive(f"log {msg!r}")
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{self.name} did not log {msg!r} within {within}s; log:\n{self._tail()}"
                )
            await asyncio.sleep(0.05)

    async def wait_serving(self, *, within: float = 30.0) -> None:
        """Learn the bound metrics and probe addresses from the "serving" log lines."""
        metrics = await self.wait_log("serving", within=within, where={"endpoint": "metrics"})
        health = await self.wait_log("serving", within=within, where={"endpoint": "health"})
        self.metrics_address = str(metrics["address"])
        self.metrics_scheme = str(metrics.get("scheme", "http"))
        self.health_address = str(health["address"])

    # --- HTTP endpoints -----------------------------------------------------------------

    async def _get(
        self,
        url: str,
        *,
        token: str | None = None,
        tls: ssl.SSLContext | bool | None = None,
    ) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers, ssl=True if tls is None else tls) as response,
        ):
            return response.status, await response.text()

    async def _health(self, path: str) -> int:
        if self.health_address is None:
            await self.wait_serving()
        return (await self._get(f"http://{self.health_address}{path}"))[0]

    async def readyz(self) -> int:
        return await self._health("/readyz")

    async def healthz(self) -> int:
        return await self._health("/healthz")

    @property
    def metrics_url(self) -> str:
        """Where /metrics is (the test certificate names 127.0.0.1, so it verifies)."""
        if self.metrics_address is None:
            raise RuntimeError(f"{self.name}: wait_serving() first")
        return f"{self.metrics_scheme}://{self.metrics_address}/metrics"

    async def get_metrics(self, *, token: str | None) -> tuple[int, str]:
        """GET /metrics with `token` (or none): the status and body, whatever they are.

        With a `MetricsReader` the certificate is verified against its CA; without one
        the operator serves a self-signed certificate, which is not verified.
        """
        if self.metrics_address is None:
            await self.wait_serving()
        reader = self.metrics_reader
        tls: ssl.SSLContext | bool | None = None
        if self.metrics_scheme == "https":
            tls = ssl.create_default_context(cafile=str(reader.ca_file)) if reader else False
        return await self._get(self.metrics_url, token=token, tls=tls)

    async def metrics_text(self) -> str:
        """/metrics as Prometheus reads it: with the metrics reader's token."""
        if self.metrics_reader is None and self.metrics_scheme == "https":
            raise RuntimeError(
                f"{self.name}: pass metrics=metrics_reader(controlplane) to read /metrics "
                "(HTTPS, bearer token allowed get /metrics)"
            )
        token = self.metrics_reader.token if self.metrics_reader else None
        status, text = await self.get_metrics(token=token)
        if status != 200:
            raise RuntimeError(f"{self.name} /metrics answered {status}: {text.strip()}")
        return text

    async def metrics(self) -> list[Sample]:
        """Every sample on /metrics as (name, labels, value)."""
        text = await self.metrics_text()
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    async def metric(self, metric: str, /, **labels: str) -> float | None:
        """The value of the first sample named `metric` with these labels (None: absent)."""
        for sample_name, sample_labels, value in await self.metrics():
            if sample_name == metric and all(sample_labels.get(k) == v for k, v in labels.items()):
                return value
        return None

    async def wait_ready(self, *, within: float = 60.0) -> float:
        """Wait for /readyz 200 (informer caches synced); return the seconds it took."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + within
        await self.wait_serving(within=within)
        while True:
            self._check_alive("/readyz 200")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if await self.readyz() == 200:
                    return loop.time() - started
            if loop.time() > deadline:
                raise TimeoutError(
                    f"{self.name} /readyz not 200 within {within}s; log:\n{self._tail()}"
                )
            await asyncio.sleep(0.1)


async def first_to_log(
    processes: Sequence[OperatorProcess], msg: str, *, within: float
) -> OperatorProcess:
    """The process that logs `msg` first (e.g. "became leader" of a pair)."""
    waits = {asyncio.ensure_future(p.wait_log(msg, within=within)): p for p in processes}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    winner = next(iter(done))
    winner.result()  # a timeout or an exit surfaces here
    return waits[winner]


# --- probe mode ---------------------------------------------------------------------------


def _probe_factory(deps: Any) -> Any:
    """A controller reconciling Agents that only measures how late it is called."""
    from agentforge.api import kinds  # noqa: PLC0415 (probe mode only)
    from agentforge.kube.controller import Controller, Watch  # noqa: PLC0415
    from agentforge.kube.informer import EventHandler  # noqa: PLC0415
    from agentforge.kube.store import object_key  # noqa: PLC0415

    informer = deps.informer(kinds.AGENT)
    log = logging.getLogger("sim.operator.probe")
    seen: dict[str, str] = {}
    delivered: dict[str, float] = {}  # key -> when the informer handed the event over

    def on_add(obj: dict[str, Any]) -> None:
        delivered.setdefault(object_key(obj), time.time())

    def on_update(_old: dict[str, Any], new: dict[str, Any]) -> None:
        on_add(new)

    # Added before the controller's own handler, so it runs first for each event.
    informer.add_handler(EventHandler(on_add=on_add, on_update=on_update))

    async def reconcile(key: Any) -> None:
        started = time.time()
        event_at = delivered.pop(key, None)
        obj = informer.get_by_key(key)
        if obj is None:
            seen.pop(key, None)
            return
        stamp = (obj["metadata"].get("annotations") or {}).get(PROBE_STAMP)
        if stamp is None or seen.get(key) == stamp:
            return
        seen[key] = stamp
        log.info(
            "probe reconciled",
            extra={
                "key": key,
                "latency_s": round(started - float(stamp), 6),
                "event_latency_s": None if event_at is None else round(started - event_at, 6),
            },
        )

    return Controller(
        name="probe",
        reconcile=reconcile,
        watches=[Watch(source=informer)],
        workers=deps.workers,
    )


def _probe_main(argv: Sequence[str]) -> int:
    import argparse  # noqa: PLC0415

    from agentforge import app, settings, wiring  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m sim.operator")
    settings.add_run_arguments(parser)
    try:
        config = settings.load(parser.parse_args(argv), environ=os.environ)
        settings.require_secret_namespaces(config)
    except settings.SettingsError as exc:
        print(f"sim.operator: error: {exc}", file=sys.stderr)
        return 2
    return app.main(
        config, controllers=lambda deps: [*wiring.build_controllers(deps), _probe_factory(deps)]
    )


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
