"""The declared dependency floors are the ones `make floors` tests.

`constraints-floors.txt` pins each runtime dependency of pyproject.toml at the
oldest release its specifier allows; `make floors` installs the operator with those
pins and runs the unit tests and a few control-plane tests. This test keeps the two
files in step: a floor raised or lowered in pyproject.toml without the constraints
file (or the reverse) fails here, offline.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _floors() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors: dict[str, Version] = {}
    for text in project["dependencies"]:
        requirement = Requirement(text)
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{text}: declare one `>=` floor"
        floors[canonicalize_name(requirement.name)] = Version(lower[0])
    return floors


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in (ROOT / "constraints-floors.txt").read_text().splitlines():
        line = raw.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_runtime_dependency_is_pinned_at_its_declared_floor() -> None:
    floors, pins = _floors(), _pins()
    assert sorted(pins) == sorted(floors)
    for name, floor in floors.items():
        # The pin is the oldest release the specifier allows: the floor itself, or its
        # first release when the floor names a series (kubernetes-asyncio>=31: 31.1.0).
        assert pins[name] >= floor, f"{name}: pinned {pins[name]} below the floor {floor}"
        assert pins[name].release[: len(floor.release)] == floor.release, (
            f"{name}: pinned {pins[name]}, not the first release of the floor {floor}; "
            "raise the floor in pyproject.toml or lower the pin"
        )
