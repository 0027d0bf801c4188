"""The bounded exit: a thread blocked on a socket does not keep the process alive, and a
shutdown that hangs is ended by its deadline. Each case runs in a child interpreter
(the exits are real)."""

from __future__ import annotations

import subprocess
import sys

BLOCKED_THREAD = """
import logging, socket, threading
from concurrent.futures import ThreadPoolExecutor
from agentforge import shutdown
logging.basicConfig(level=logging.INFO)
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())  # never answered, no timeout
pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vsphere-blackhole")
pool.submit(client.recv, 1)
pool.shutdown(wait=False)
raise SystemExit(shutdown.leave(0, grace=0.2))
"""

HANGING_SHUTDOWN = """
import threading
from agentforge import shutdown
deadline = shutdown.Deadline(0.5)
deadline.arm()
threading.Event().wait()  # a shutdown step that never ends
"""


def _run(code: str, *, within: float) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=within, check=False
    )
    return done.returncode, done.stderr


def test_a_thread_blocked_on_a_socket_does_not_keep_the_process_alive() -> None:
    code, err = _run(BLOCKED_THREAD, within=30)
    assert code == 0
    assert "threads still blocked" in err
    assert "vsphere-blackhole" in err


def test_the_deadline_ends_a_shutdown_that_hangs() -> None:
    code, err = _run(HANGING_SHUTDOWN, within=30)
    assert code == shutdown_incomplete()
    assert "shutdown did not finish within 0.5s" in err


def shutdown_incomplete() -> int:
    from agentforge import shutdown  # noqa: PLC0415

    return shutdown.EXIT_INCOMPLETE
