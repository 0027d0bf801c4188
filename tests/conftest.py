"""Shared pytest wiring: each simulator contributes its fixtures as a plugin, and each
test folder has its own time limit.

A hang costs what the folder's tests can honestly take, not one limit for all: unit and
packaging tests run in seconds (the slowest unit test, a property test, took 20 s on 2
cores at a load of 8), the integration folders start real processes and wait on them, so
they get minutes. A test's own `pytest.mark.timeout` (or its module's
`pytestmark`) wins, and so does `--timeout` on the command line (or PYTEST_TIMEOUT);
pyproject's `timeout` is the limit of anything outside these folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = [
    "sim.testing",
    "sim.controlplane.pytest_plugin",
    "sim.vcsim.pytest_plugin",
]

TESTS = Path(__file__).resolve().parent

# seconds per test (set-up, call and tear-down together), by folder under tests/
TIMEOUT_S = {
    "unit": 60,
    "packaging": 60,
    "sim": 300,
    "kube": 300,
    "vcsim": 300,
    "e2e": 600,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return  # chosen for this run: the limit of every test
    for item in items:
        path = item.path.resolve()
        if item.get_closest_marker("timeout") is not None or not path.is_relative_to(TESTS):
            continue
        folder = path.relative_to(TESTS).parts[0]
        if folder in TIMEOUT_S:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S[folder]))
