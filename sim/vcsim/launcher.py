"""`Vcsim`: starts and stops one vcsim-af (govmomi's vSphere simulator with our faults).

What it promises:
- `start()` returns once the SDK endpoint and the control API answer; it raises
  `VcsimStartError` with the tail of the simulator's log when the process dies or stays
  silent past the deadline, and `sim.paths.MissingBinaryError` (naming `make vcsim`)
  when the binary was never built.
- TLS is verifiable: `ca_file` is the PEM of the CA that signed the server's
  certificate for 127.0.0.1, so no client needs an "insecure" switch.
- `stop()` ends the simulator's whole process group (SIGTERM, then SIGKILL after a
  grace period) and removes the work directory it created. The simulator also exits
  by itself when the Python process that started it goes away, so a crashed test run
  leaves no stray simulator behind.

Inventory keywords mirror vcsim-af's flags (see `sim/vcsim/README.md`); the defaults
give the inventory the tests and the demo rely on: datacenter `dc1`, cluster `cluster`
with two hosts, datastores `ds1`/`ds2` in datastore cluster `dsc1` (Storage DRS on),
ISO datastore `iso-ds`, port groups `VM Network` and `dvpg1`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from sim.paths import binary
from sim.vcsim.control import VcsimControl

_START_TIMEOUT_S = 60.0
_STOP_GRACE_S = 10.0
_LOG_TAIL_BYTES = 4000


class VcsimStartError(RuntimeError):
    """vcsim-af did not come up; the message carries the tail of its log."""


class Vcsim:
    """One simulator process. Sync `start()`/`stop()`, or `with`/`async with`."""

    def __init__(
        self,
        *,
        workdir: Path | None = None,
        datacenters: int = 1,
        clusters: int = 1,
        hosts: int = 2,
        datastores: int = 2,
        loose_datastores: int = 0,
        datastore_cluster: str = "dsc1",
        sdrs: bool = True,
        iso_datastore: str = "iso-ds",
        portgroups: int = 1,
        dvportgroups: int = 1,
        folders: int = 0,
        vms: int = 0,
        delays: Mapping[str, int] | None = None,
        task_delays: Mapping[str, int] | None = None,
        username: str | None = None,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = _START_TIMEOUT_S,
    ) -> None:
        self._requested_workdir = workdir
        self._args: list[str] = [
            f"-datacenters={datacenters}",
            f"-clusters={clusters}",
            f"-hosts={hosts}",
            f"-datastores={datastores}",
            f"-loose-datastores={loose_datastores}",
            f"-datastore-cluster={datastore_cluster}",
            f"-sdrs={'true' if sdrs else 'false'}",
            f"-iso-datastore={iso_datastore}",
            f"-portgroups={portgroups}",
            f"-dvportgroups={dvportgroups}",
            f"-folders={folders}",
            f"-vms={vms}",
        ]
        for method, ms in (delays or {}).items():
            self._args.append(f"-delay={method}={int(ms)}")
        for method, ms in (task_delays or {}).items():
            self._args.append(f"-task-delay={method}={int(ms)}")
        if username is not None:
            self._args.append(f"-username={username}")
        if password is not None:
            self._args.append(f"-password={password}")
        self._args.extend(extra_args)
        self._single_datacenter = datacenters == 1
        self._start_timeout = start_timeout

        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._owns_workdir = False
        self._ready: dict[str, Any] | None = None
        self.workdir: Path | None = None
        self.startup_seconds = 0.0

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError("vcsim already started")
        exe = binary("vcsim-af")
        if self._requested_workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="vcsim-af-"))
            self._owns_workdir = True
        else:
            self.workdir = self._requested_workdir.resolve()
            self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / "vcsim-af.log"
        self._log = log_path.open("ab")
        env = dict(os.environ)
        # The simulator's own scratch space (govcsim-*) then lives, and dies, with workdir.
        env["TMPDIR"] = str(self.workdir)
        began = time.monotonic()
        self._process = subprocess.Popen(
            [str(exe), "-exit-with-parent", f"-dir={self.workdir}", *self._args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        try:
            self._ready = json.loads(self._read_ready_line(log_path))
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _read_ready_line(self, log_path: Path) -> str:
        process = self._process
        if process is None or process.stdout is None:
            raise RuntimeError("vcsim-af was not started with a stdout pipe")
        stdout = process.stdout
        deadline = time.monotonic() + self._start_timeout
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise VcsimStartError(
                        f"vcsim-af printed no ready line within {self._start_timeout:.0f}s; "
                        f"log {log_path}:\n{_tail(log_path)}"
                    )
                if not selector.select(timeout=min(remaining, 0.5)):
                    continue
                chunk = os.read(stdout.fileno(), 65536)
                if not chunk:
                    process.wait(timeout=_STOP_GRACE_S)
                    raise VcsimStartError(
                        f"vcsim-af exited with status {process.returncode} before it was "
                        f"ready; log {log_path}:\n{_tail(log_path)}"
                    )
                buffer += chunk
        return buffer.split(b"\n", 1)[0].decode()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _stop_group(process)
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._owns_workdir = False

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _started_workdir(self) -> Path:
        if self.workdir is None:
            raise RuntimeError("vcsim is not started")
        return self.workdir

    def exit_report(self) -> str:
        """How a simulator that should be running ended: its exit status and log tail."""
        process = self._process
        status = "not started" if process is None else f"exit status {process.poll()}"
        log = self.workdir / "vcsim-af.log" if self.workdir is not None else None
        return f"vcsim-af ended ({status}); log {log}:\n{_tail(log) if log else '(none)'}"

    def restart(self) -> Self:
        """A fresh simulator with the same inventory (a new port and certificate)."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # --- what clients need -------------------------------------------------------------
    @property
    def _info(self) -> dict[str, Any]:
        if self._ready is None:
            raise RuntimeError("vcsim is not started")
        return self._ready

    @property
    def url(self) -> str:
        """The SDK endpoint, `https://127.0.0.1:<port>/sdk`."""
        return str(self._info["url"])

    @property
    def server(self) -> str:
        """`127.0.0.1:<port>`: what a vCenter address looks like to clients."""
        return str(self._info["server"])

    @property
    def host(self) -> str:
        return self.server.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    @property
    def username(self) -> str:
        return str(self._info["username"])

    @property
    def password(self) -> str:
        return str(self._info["password"])

    @property
    def ca_file(self) -> Path:
        """PEM of the CA that signed the server certificate (valid for 127.0.0.1)."""
        return Path(self._info["ca_file"])

    @property
    def control_url(self) -> str:
        return str(self._info["control_url"])

    @property
    def control(self) -> VcsimControl:
        return VcsimControl(self.control_url)

    @property
    def pid(self) -> int:
        return int(self._info["pid"])

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise RuntimeError("vcsim is not started")
        return self.workdir / "vcsim-af.log"

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts exactly the simulator's CA, hostname checked."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def govc_env(self) -> dict[str, str]:
        """Environment for `.build/bin/govc` against this simulator (TLS verified).

        With a single datacenter, GOVC_DATACENTER names it, so paths may be relative.
        """
        env = {
            "GOVC_URL": self.url,
            "GOVC_USERNAME": self.username,
            "GOVC_PASSWORD": self.password,
            "GOVC_TLS_CA_CERTS": str(self.ca_file),
            "GOVC_INSECURE": "false",
            # No session reuse across runs: a cached cookie from an earlier simulator on
            # the same port would hide logins from the counters tests read.
            "GOVC_PERSIST_SESSION": "false",
            "GOVMOMI_HOME": str(self._started_workdir() / "govmomi"),
        }
        if self._single_datacenter:
            env["GOVC_DATACENTER"] = "dc1"
        return env

    def govc(self, *args: str, timeout: float = 60.0) -> str:
        """Run `.build/bin/govc` with `govc_env()`; returns stdout, raises on failure."""
        env = {**os.environ, **self.govc_env()}
        result = subprocess.run(
            [str(binary("govc")), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"govc {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout

    def __repr__(self) -> str:
        where = self._ready["url"] if self._ready else "not started"
        return f"<Vcsim {where}>"


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created, then SIGKILL it if it lingers."""
    pgid = process.pid  # start_new_session=True: the group id is the child's pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(pgid, signal.SIGKILL)
        process.wait(timeout=_STOP_GRACE_S)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"(no log: {e})"
    return data[-limit:].decode(errors="replace")
