"""A bounded exit: once asked to stop, the process is gone within `SHUTDOWN_TIMEOUT_S`.

Every step of the orderly shutdown is bounded on its own (the drain, the Lease
release, the vCenter logouts), but two things are outside asyncio's reach:

* a thread blocked in a socket call (a vCenter that stopped answering mid-request)
  ends only at its socket timeout, and `concurrent.futures` joins every worker
  thread at interpreter exit, so the process would linger after "shut down";
* a step that hangs against all expectations.

So `leave(code)` gives worker threads a moment (`THREAD_GRACE_S`) and then ends the
process with `os._exit` (logs flushed first) if any is still blocked, and a
`Deadline` armed at SIGTERM ends it unconditionally when `SHUTDOWN_TIMEOUT_S` has
passed. Kubernetes' default termination grace period is 30 s, above both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

__all__ = ["SHUTDOWN_TIMEOUT_S", "THREAD_GRACE_S", "Deadline", "leave"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 20.0
"""From SIGTERM to the end of the process, at the most."""
THREAD_GRACE_S = 1.0
"""How long worker threads may take to finish after the event loop has stopped."""
EXIT_INCOMPLETE = 1


def _hard_exit(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


class Deadline:
    """Ends the process `seconds` after `arm()` unless it has ended by then."""

    def __init__(self, seconds: float = SHUTDOWN_TIMEOUT_S) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        log.error(
            "shutdown did not finish within %ss; exiting now (threads: %s)",
            self.seconds,
            ", ".join(sorted(t.name for t in threading.enumerate())),
        )
        _hard_exit(EXIT_INCOMPLETE)


def leave(code: int, *, grace: float = THREAD_GRACE_S) -> int:
    """Return `code` if every other thread ends within `grace`; else exit with it now
    (a thread blocked on a socket would otherwise keep the interpreter alive)."""
    deadline = time.monotonic() + grace
    stuck: list[str] = []
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stuck.append(thread.name)
    if stuck:
        log.warning(
            "exiting with threads still blocked (a vCenter that stopped answering): %s",
            ", ".join(sorted(stuck)),
            extra={"exit_code": code},
        )
        _hard_exit(code)
    return code
