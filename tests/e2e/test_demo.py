"""`make demo` runs (`python -m sim.demo`): the README's first command, end to end.

The demo starts its own control plane and simulator, plays HyperShift, CAPI and the
Assisted Installer, scales 0 -> 3 -> 1 -> 0 with two operator replicas and a leader
hand-over, and checks its own rules; this test runs it as a user does and reads its
verdict, so a change that breaks the demo fails the suite.
"""

from __future__ import annotations

import re
import subprocess
import sys

from sim.paths import REPO_ROOT

DEMO_TIMEOUT_S = 900


def test_the_demo_scales_up_and_down_and_breaks_no_rule() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sim.demo"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert re.search(r"broken rules\s*\S\s*none", output), output[-4000:]
    for step in ("scale 0 -> 3", "leader hand-over", "scale 3 -> 1", "scale 1 -> 0"):
        assert step in output, f"the demo's summary has no {step!r}: {output[-4000:]}"
    assert "done: control plane and vcsim stopped" in output
