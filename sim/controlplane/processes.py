"""Child processes that can always be torn down, and waiting for named conditions.

Each component runs in its own session (so its own process group): a stop signals
the whole group, first SIGTERM, then SIGKILL after a grace period, so nothing a
component forked survives it. Output goes to a log file in the workdir; a startup
failure quotes the tail of that log, because that is where the reason is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

_LOG_TAIL_BYTES = 4000


class StartupError(RuntimeError):
    """A component did not become ready; the message says which and why."""


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1, each kept from the OS's own picks for a
    minute so the component that is handed it can still bind it.

    A port merely found free and released can be handed out again at once: to another
    pytest worker, a parallel test run or any process binding port 0 or connecting out
    between this call and the component's bind (seconds later for kube-apiserver,
    which starts once etcd is healthy). Each port is left in TIME_WAIT instead (a
    connection to it is accepted and closed from the listening side first): the kernel
    then picks it neither for a bind to port 0 nor for an outgoing connection, while a
    server that sets SO_REUSEADDR, as Go's listeners (etcd, kube-apiserver) and
    asyncio's (the fault proxy) do, binds it at once.
    """
    ports: list[int] = []
    while len(ports) < count:
        port = _reserve_port()
        if port not in ports:
            ports.append(port)
    return ports


def _reserve_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.create_connection(address):
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first: its end waits in TIME_WAIT
        return int(address[1])


def log_tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode("utf-8", errors="replace")


class ManagedProcess:
    """One component process in its own process group, logging to a file."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = env
        self._cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            cwd=self._cwd,
            start_new_session=True,  # own session => own process group, signalled as one
        )

    def exit_code(self) -> int | None:
        """None while running (or never started), else the exit status."""
        return self._popen.poll() if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_running(self) -> None:
        """Raise StartupError with the log tail when the process already exited."""
        code = self.exit_code()
        if code is not None:
            raise StartupError(
                f"{self.name} exited with status {code} during startup; "
                f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            )

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, reap the leader."""
        popen = self._popen
        if popen is None:
            return
        pgid = popen.pid  # leader of its own session, so pgid == pid
        if popen.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                popen.wait(timeout=grace)
        # Members of the group that outlived the leader (forked helpers) go too.
        _signal_group(pgid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_for(
    condition: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    interval: float = 0.05,
    alive: Sequence[ManagedProcess] = (),
) -> None:
    """Poll `condition` until it holds; fail after `timeout` naming `what`.

    Each process in `alive` must keep running meanwhile: if one exits, fail at once
    with its log instead of waiting out the deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        for process in alive:
            process.check_running()
        try:
            if condition():
                return
            last_error = None
        except Exception as exc:  # the condition probes a server that may not be up yet
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
