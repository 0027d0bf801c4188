"""Fixtures shared by the API model tests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.api.support import read_fixture


@pytest.fixture
def fixture() -> Callable[[str], dict[str, Any]]:
    """Load `fixtures/<name>` as a fresh dict (tests may change it)."""
    return lambda name: copy.deepcopy(read_fixture(name))
