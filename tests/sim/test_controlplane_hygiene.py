"""`sim.testing` fails tests that leave asyncio tasks or child processes running.

Each case runs a small inner pytest session (pytester, in-process) with only the
hygiene plugin and pytest-asyncio, and checks its outcome.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


def _run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makeini(_INI)
    pytester.makepyfile(source)
    return pytester.runpytest_inprocess("-p", "sim.testing", "-p", "no:cacheprovider")


def test_an_async_test_that_leaves_a_task_running_fails_and_the_task_is_cancelled(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
import asyncio

cancelled = []

async def forever():
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.append(True)
        raise

async def test_leaks():
    asyncio.create_task(forever(), name="the-leak")

def test_the_leak_was_cancelled():
    assert cancelled == [True]
""",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*left 1 asyncio task(s) running: the-leak*forever*"])


def test_an_async_test_that_awaits_its_tasks_passes(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import asyncio

async def test_clean():
    task = asyncio.create_task(asyncio.sleep(0))
    await task
    other = asyncio.create_task(asyncio.Event().wait())
    other.cancel()  # cancelled but not awaited: finishes within the settling turns
""",
    )
    result.assert_outcomes(passed=1)


def test_a_test_that_leaves_a_child_process_running_fails_and_the_process_is_killed(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
import subprocess, sys

def test_leaks_a_process():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
""",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*left 1 child process(es) running (killed now)*time.sleep(600)*"])


def test_processes_of_fixtures_and_stopped_processes_are_not_leaks(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        """
import subprocess, sys
import pytest

@pytest.fixture(scope="session")
def server():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()

def test_uses_a_session_process(server):
    assert server.poll() is None

def test_stops_what_it_starts():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
""",
    )
    result.assert_outcomes(passed=2)
