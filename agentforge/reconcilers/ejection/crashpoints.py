"""TEST ONLY: stop the process dead at a chosen ISO ejection step boundary.

The e2e suite proves that an ejection survives `kill -9` at every step boundary. Some
boundaries (between a status checkpoint and the next vSphere call) are microseconds
wide and cannot be hit from outside, so the operator offers one opt-in hook:
`AGENT_FORGE_TEST_CRASH_AT=<point>` makes `reached(point)` end the process with
`os._exit(137)` (what SIGKILL leaves behind: no drain, no Lease release, no cleanup)
right after that step.

Off by default: the variable is read from the environment only, is not a setting, is
never set by `config/` manifests or the container image, and an unknown value does
nothing. Nothing else in the operator reads it.
"""

from __future__ import annotations

import logging
import os
import sys
from enum import StrEnum
from typing import Final

__all__ = ["ENV", "CrashPoint", "reached"]

ENV: Final = "AGENT_FORGE_TEST_CRASH_AT"
EXIT_CODE: Final = 137

log = logging.getLogger(__name__)


class CrashPoint(StrEnum):
    """Step boundaries of one ejection, in the order they are passed."""

    RECORDED = "recorded"
    """`status.isoEjection` written and read back; nothing issued in vSphere."""
    DISCONNECT_RECORDED = "disconnect-recorded"
    """Phase DisconnectIssued checkpointed; the reconfigure is not sent yet."""
    DISCONNECT_ISSUED = "disconnect-issued"
    """The reconfigure was sent and the guest's lock question seen, not yet recorded."""
    QUESTION_RECORDED = "question-recorded"
    """The lock question's id checkpointed; not answered yet."""
    ANSWERED = "answered"
    """AnswerVM returned; phase Answered not checkpointed yet."""
    EJECTED = "ejected"
    """The medium is gone; the record is not cleared yet."""


def reached(point: CrashPoint) -> None:
    """Exit the process at once when the test hook names this point; else nothing."""
    if os.environ.get(ENV) != point.value:
        return
    log.critical("test crash point reached, exiting", extra={"crash_point": point.value})
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EXIT_CODE)
