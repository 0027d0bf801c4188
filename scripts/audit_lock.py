"""`make audit` (part of `make lint`): known vulnerabilities in the locked runtime set.

pip-audit checks `requirements.lock` as it is (`-r requirements.lock --require-hashes
--disable-pip`: no resolution, no install; each pinned version is looked up in PyPI's
vulnerability data, which the Python Packaging Advisory Database and OSV feed). What
happens then:

* a vulnerability: the audit fails, naming each one (id, aliases, package, locked
  version, the versions that fix it) and the command that moves the pin:
  `make lock-upgrade PACKAGE=<name>`, then `make lint` again. There is no ignore list:
  a vulnerability without a fix is a decision for a reviewer, recorded by adding
  `--ignore-vuln <id>` to AUDIT_FLAGS in the Makefile with the reason next to it;
* the network is down or PyPI does not answer: the audit fails and says so (nothing was
  audited); it needs PyPI, which CI and developer machines reach;
* a package pip-audit could not look up: some PyPI mirrors serve a project's JSON
  (`/pypi/<name>/json`) but not a release's (`/pypi/<name>/<version>/json`, which
  pip-audit asks for). The project JSON lists the vulnerabilities of the latest release,
  so for a package locked at its latest release that list is the answer and is used;
  a package locked at an older release cannot be audited there: it is named with its
  latest release (`make lock-upgrade PACKAGE=<name>` moves it there) as a warning in
  `make lint` (a new upstream release must not turn a green commit red on its own), and
  as an error with `--strict` (`make audit`). Nothing is skipped silently.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.lock import RUNTIME, parse_lock

__all__ = ["Finding", "audit", "main"]

PYPI = "https://pypi.org/pypi"
TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Finding:
    """One known vulnerability of a locked package."""

    package: str
    version: str
    id: str
    aliases: tuple[str, ...] = ()
    fixed_in: tuple[str, ...] = ()

    def __str__(self) -> str:
        also = f" ({', '.join(self.aliases)})" if self.aliases else ""
        fix = ", ".join(self.fixed_in) or "no fixed release yet"
        return f"{self.package}=={self.version}: {self.id}{also}; fixed in: {fix}"


@dataclass(slots=True)
class Report:
    audited: int = 0
    findings: list[Finding] = field(default_factory=list)
    unaudited: list[str] = field(default_factory=list)


class AuditUnavailable(Exception):
    """PyPI could not be asked (network down, PyPI refusing): nothing was audited."""


def _pip_audit(lock: Path, flags: Sequence[str]) -> list[dict[str, Any]]:
    tool = Path(sys.executable).with_name("pip-audit")
    if not tool.exists():
        raise SystemExit("error: pip-audit is not in this virtualenv; run `make venv` first")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        argv = [str(tool), "-r", str(lock), "--require-hashes", "--disable-pip"]
        argv += ["--format", "json", "--progress-spinner", "off", "-o", str(out), *flags]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if not out.exists():
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise AuditUnavailable(f"pip-audit could not query PyPI: {last}")
        data = json.loads(out.read_text(encoding="utf-8"))
    dependencies: list[dict[str, Any]] = data["dependencies"]
    return dependencies


def _project_json(name: str) -> dict[str, Any]:
    url = f"{PYPI}/{name}/json"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (https constant)
            data: dict[str, Any] = json.load(response)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise AuditUnavailable(f"GET {url}: {exc}") from exc
    return data


def _from_project(name: str, version: str, ignored: set[str]) -> tuple[list[Finding], str | None]:
    """Findings from the project JSON when `version` is its latest release, else why not."""
    data = _project_json(name)
    latest = str(data["info"]["version"])
    if latest != version:
        return [], (
            f"{name}=={version}: not auditable through this index (latest release {latest}); "
            f"run `make lock-upgrade PACKAGE={name}`"
        )
    findings = [
        Finding(
            name,
            version,
            str(vuln["id"]),
            tuple(vuln.get("aliases") or ()),
            tuple(vuln.get("fixed_in") or ()),
        )
        for vuln in data.get("vulnerabilities") or []
        if not vuln.get("withdrawn") and vuln["id"] not in ignored
    ]
    return findings, None


def audit(lock: Path = RUNTIME, flags: Sequence[str] = ()) -> Report:
    """Audit every pin of `lock` (raises AuditUnavailable when PyPI cannot be asked)."""
    ignored = {flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--ignore-vuln"}
    report = Report()
    skipped: list[tuple[str, str]] = []
    pins = parse_lock(lock)
    for dep in _pip_audit(lock, flags):
        if "skip_reason" in dep:
            pin = pins.get(str(dep["name"]))
            skipped.append((str(dep["name"]), pin.version if pin else str(dep.get("version"))))
            continue
        report.audited += 1
        report.findings.extend(
            Finding(
                str(dep["name"]),
                str(dep["version"]),
                str(vuln["id"]),
                tuple(vuln.get("aliases") or ()),
                tuple(vuln.get("fix_versions") or ()),
            )
            for vuln in dep.get("vulns") or []
        )
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda nv: _from_project(nv[0], nv[1], ignored), skipped))
    for findings, unaudited in results:
        if unaudited:
            report.unaudited.append(unaudited)
        else:
            report.audited += 1
            report.findings.extend(findings)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.audit_lock", description=__doc__)
    parser.add_argument("lock", nargs="?", type=Path, default=RUNTIME)
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail when a locked package could not be audited (default: warn)",
    )
    parser.add_argument("pip_audit_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    flags = [f for f in args.pip_audit_flags if f != "--"]
    try:
        report = audit(args.lock, flags)
    except AuditUnavailable as exc:
        print(
            f"error: the vulnerability audit of {args.lock.name} could not run: {exc}\n"
            "       It asks PyPI about every locked package; run it with network access "
            "(CI has it). Nothing was audited.",
            file=sys.stderr,
        )
        return 1
    for finding in report.findings:
        print(f"error: vulnerable: {finding}", file=sys.stderr)
    level = "error" if args.strict else "warning"
    for line in report.unaudited:
        print(f"{level}: unaudited: {line}", file=sys.stderr)
    if report.findings:
        names = sorted({f.package for f in report.findings})
        print(
            f"{len(report.findings)} known vulnerabilit(y/ies) in {args.lock.name}. Move the "
            f"pins: {'; '.join(f'make lock-upgrade PACKAGE={n}' for n in names)}; "
            "then make lint.",
            file=sys.stderr,
        )
    if report.findings or (args.strict and report.unaudited):
        return 1
    print(
        f"{args.lock.name}: {report.audited} packages audited, no known vulnerabilities"
        + (f"; {len(report.unaudited)} could not be audited (above)" if report.unaudited else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
