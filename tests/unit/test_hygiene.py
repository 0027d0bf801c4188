"""The leftover-process check (sim/testing.py) knows a process by a start that never
moves: a wall-clock step must not make the session's control plane and simulator look
like a test's leftovers (they were killed so in a CI run)."""

from __future__ import annotations

import subprocess

import psutil
import psutil._pslinux as pslinux
import pytest

from sim import testing


def test_a_wall_clock_step_leaves_every_child_known(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        before = testing._children()
        wall = psutil.Process(child.pid).create_time()
        stepped = pslinux.boot_time() + 1.0  # the clock stepped by a second since
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
        assert psutil.Process(child.pid).create_time() == pytest.approx(wall + 1.0)
        after = testing._children()
        assert set(after) == set(before)
        assert any(pid == child.pid for pid, _ in after)
    finally:
        child.kill()
        child.wait()
