"""The lock files and what `make lint` does with them: offline checks, SBOM, audit verdicts.

The committed locks must pass the offline check as they are (every pyproject
requirement pinned within its specifier, every pin hashed, the dev lock agreeing with
the runtime and build locks, the runtime set closed under its dependencies, the SBOM
current). Copies of them, broken one way at a time, must fail with a message naming the
package and the command that fixes it. The audit's verdicts (vulnerable, unauditable,
no network) are pure decisions over pip-audit's and PyPI's answers, tested with those
answers given; the real audit runs in `make lint`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from scripts import audit_lock, lock

REPO = Path(__file__).resolve().parents[2]


def test_committed_locks_pass_the_offline_check() -> None:
    assert lock.check() == []


def test_every_runtime_dependency_is_locked_with_hashes() -> None:
    pins = lock.parse_lock(lock.RUNTIME)
    for name in ("kubernetes-asyncio", "aiohttp", "pyvmomi", "pydantic", "cryptography"):
        assert len(pins[name].hashes) >= 1
    assert "agentforge" not in pins, "the operator itself is built from the checkout"
    assert "pytest" not in pins, "test tools stay out of the image"


@pytest.fixture
def copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The locks, pyproject and SBOM copied, and the checker pointed at the copies."""
    for source in (*lock.LOCKS, lock.PYPROJECT, lock.SBOM):
        shutil.copy(source, tmp_path / source.name)
    for attr in ("RUNTIME", "BUILD", "DEV", "PYPROJECT", "SBOM"):
        monkeypatch.setattr(lock, attr, tmp_path / getattr(lock, attr).name)
    monkeypatch.setattr(lock, "LOCKS", (lock.RUNTIME, lock.BUILD, lock.DEV))
    return tmp_path


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text()
    changed = re.sub(pattern, replacement, text, count=1, flags=re.MULTILINE)
    assert changed != text, pattern
    path.write_text(changed)


def test_a_pin_outside_pyprojects_specifier_is_refused(copies: Path) -> None:
    _edit(copies / "pyproject.toml", r'"pyyaml>=6,<7"', '"pyyaml>=7"')
    problems = lock.check()
    assert any(
        "requirements.lock" in p and "pyyaml==" in p and "make lock-upgrade PACKAGE=pyyaml" in p
        for p in problems
    ), problems


def test_a_requirement_missing_from_the_lock_is_refused(copies: Path) -> None:
    _edit(copies / "pyproject.toml", r'^  "pyyaml>=6,<7",$', '  "pyyaml>=6,<7",\n  "left-pad>=1",')
    assert any("left-pad" in p and "make lock" in p for p in lock.check())


def test_a_pin_without_hash_is_refused(copies: Path) -> None:
    _edit(
        copies / "requirements.lock",
        r"^(tenacity==\S+) \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+$",
        r"\1",
    )
    assert any("tenacity" in p and "no sha256 hash" in p for p in lock.check())


def test_dev_lock_disagreeing_with_the_runtime_lock_is_refused(copies: Path) -> None:
    _edit(copies / "requirements-dev.lock", r"^tenacity==(\S+)", "tenacity==0.0.1")
    assert any("tenacity==0.0.1" in p and "requirements.lock pins" in p for p in lock.check())


def test_a_runtime_lock_missing_a_dependency_of_a_locked_package_is_refused(
    copies: Path,
) -> None:
    # aiohttp needs yarl; drop yarl's entry (and its hash lines) from the runtime lock.
    _edit(copies / "requirements.lock", r"^yarl==\S+ \\\n(\s+--hash=\S+( \\)?\n)+(\s+#.*\n)*", "")
    assert any("needs yarl, which is not locked" in p for p in lock.check())


def test_a_stale_sbom_is_refused(copies: Path) -> None:
    sbom = json.loads((copies / "requirements.cdx.json").read_text())
    sbom["components"] = sbom["components"][1:]  # the first package missing
    (copies / "requirements.cdx.json").write_text(json.dumps(sbom))
    assert any("requirements.cdx.json" in p and "make sbom" in p for p in lock.check())


def test_sbom_lists_exactly_the_runtime_pins() -> None:
    sbom = json.loads(lock.SBOM.read_text())
    listed = {(c["name"].lower(), c["version"]) for c in sbom["components"]}
    pinned = {(p.name, p.version) for p in lock.parse_lock(lock.RUNTIME).values()}
    assert listed == pinned
    assert sbom["bomFormat"] == "CycloneDX"
    assert sbom["metadata"]["component"]["name"] == "agentforge"
    assert "timestamp" not in sbom["metadata"], "reproducible: same lock, same file"


# --- the audit's verdicts ------------------------------------------------------------


def _runtime_pins() -> dict[str, lock.Pin]:
    return lock.parse_lock(lock.RUNTIME)


def _fake_pypi(
    monkeypatch: pytest.MonkeyPatch,
    pip_audit: list[dict[str, Any]] | Exception,
    projects: dict[str, dict[str, Any]] | None = None,
) -> None:
    def run(lock_path: Path, flags: Any) -> list[dict[str, Any]]:
        if isinstance(pip_audit, Exception):
            raise pip_audit
        return pip_audit

    monkeypatch.setattr(audit_lock, "_pip_audit", run)
    monkeypatch.setattr(audit_lock, "_project_json", lambda name: (projects or {})[name])


def test_audit_reports_each_vulnerability_with_its_fix_and_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _runtime_pins()
    answer: list[dict[str, Any]] = [
        {"name": name, "version": pin.version, "vulns": []} for name, pin in pins.items()
    ]
    aiohttp = next(d for d in answer if d["name"] == "aiohttp")
    aiohttp["vulns"] = [
        {"id": "GHSA-xxxx", "aliases": ["CVE-2099-1"], "fix_versions": ["99.0.0"]},
    ]
    _fake_pypi(monkeypatch, answer)
    assert audit_lock.main([]) == 1
    err = capsys.readouterr().err
    assert f"aiohttp=={pins['aiohttp'].version}: GHSA-xxxx (CVE-2099-1); fixed in: 99.0.0" in err
    assert "make lock-upgrade PACKAGE=aiohttp" in err


def test_audit_passes_when_every_package_was_audited_clean(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _runtime_pins()
    _fake_pypi(
        monkeypatch, [{"name": n, "version": p.version, "vulns": []} for n, p in pins.items()]
    )
    assert audit_lock.main([]) == 0
    assert f"{len(pins)} packages audited, no known vulnerabilities" in capsys.readouterr().out


def test_a_package_pip_audit_skipped_is_audited_from_the_project_json_when_latest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _runtime_pins()
    skipped = [{"name": n, "skip_reason": "Dependency not found on PyPI"} for n in pins]
    projects: dict[str, dict[str, Any]] = {
        n: {"info": {"version": p.version}, "vulnerabilities": []} for n, p in pins.items()
    }
    projects["yarl"]["vulnerabilities"] = [
        {"id": "PYSEC-1", "aliases": [], "fixed_in": [], "withdrawn": None},
        {"id": "PYSEC-0", "aliases": [], "fixed_in": ["1"], "withdrawn": "2020-01-01"},
    ]
    _fake_pypi(monkeypatch, skipped, projects)
    assert audit_lock.main([]) == 1
    err = capsys.readouterr().err
    assert f"yarl=={pins['yarl'].version}: PYSEC-1; fixed in: no fixed release yet" in err
    assert "PYSEC-0" not in err, "a withdrawn advisory is no finding"


def test_a_package_neither_source_can_audit_is_named_and_fails_only_a_strict_audit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _runtime_pins()
    skipped = [{"name": n, "skip_reason": "Dependency not found on PyPI"} for n in pins]
    projects: dict[str, dict[str, Any]] = {
        n: {"info": {"version": p.version}, "vulnerabilities": []} for n, p in pins.items()
    }
    projects["rich"]["info"]["version"] = "999.0"
    _fake_pypi(monkeypatch, skipped, projects)
    assert audit_lock.main([]) == 0, "a new upstream release alone never fails make lint"
    captured = capsys.readouterr()
    assert f"warning: unaudited: rich=={pins['rich'].version}: not auditable" in captured.err
    assert "latest release 999.0" in captured.err
    assert "make lock-upgrade PACKAGE=rich" in captured.err
    assert "1 could not be audited" in captured.out

    assert audit_lock.main(["--strict"]) == 1
    err = capsys.readouterr().err
    assert f"error: unaudited: rich=={pins['rich'].version}: not auditable" in err


def test_without_network_the_audit_fails_saying_nothing_was_audited(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    down = audit_lock.AuditUnavailable("pip-audit could not query PyPI: ConnectionError")
    _fake_pypi(monkeypatch, down)
    assert audit_lock.main([]) == 1
    err = capsys.readouterr().err
    assert "could not run" in err
    assert "Nothing was audited" in err
