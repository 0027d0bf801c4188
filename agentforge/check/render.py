"""What `python -m agentforge check` found, and how it is shown: rich lines or JSON.

A check produces `Item`s: one verdict about one object (the subject), what was
found and, when something is wrong, how to fix it. Items are grouped per pool
(`PoolReport`) into a `Report`, whose exit code is the command's: 0 when no item
failed, 1 otherwise. Warnings (`!`) and skipped items (`-`, not checked because
what they depend on failed) do not change the exit code. A manifest that cannot be
checked at all (bad YAML, another kind, schema errors) is a list of `UsageError`s
and exit code 2.

Nothing here reads credentials: the check code never puts a secret value into an
item, and an item's texts pass `agentforge.redaction.redact` when it is made (an
API key in an ISO URL, a password quoted in an error), so rendering cannot leak one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from agentforge.redaction import redact

__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_USAGE",
    "Item",
    "PoolReport",
    "Report",
    "Status",
    "UsageError",
    "render_json",
    "render_text",
    "render_usage_json",
    "render_usage_text",
]

EXIT_OK: Final = 0
EXIT_FAIL: Final = 1
EXIT_USAGE: Final = 2


class Status(StrEnum):
    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


_SYMBOL: Final = {
    Status.PASS: ("✓", "green"),
    Status.FAIL: ("✗", "bold red"),
    Status.WARN: ("!", "yellow"),
    Status.SKIP: ("-", "dim"),
}


@dataclass(frozen=True, slots=True)
class Item:
    """One verdict: `check` is a stable id (spec, infraenv, iso-url, secret, vsphere,
    namespace, agentmachines, nodepool, rbac), `subject` names the object."""

    check: str
    status: Status
    subject: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        for name in ("subject", "message", "fix"):
            object.__setattr__(self, name, redact(getattr(self, name)))

    def to_json(self) -> dict[str, str]:
        out = {
            "check": self.check,
            "status": self.status.value,
            "subject": self.subject,
            "message": self.message,
        }
        if self.fix:
            out["fix"] = self.fix
        return out


@dataclass(slots=True)
class PoolReport:
    pool: str
    """`namespace/name`."""
    source: str
    """Where the pool came from: `<file> document <n>` or `cluster`."""
    items: list[Item] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(i.status is Status.FAIL for i in self.items)

    def count(self, status: Status) -> int:
        return sum(1 for i in self.items if i.status is status)


@dataclass(slots=True)
class Report:
    pools: list[PoolReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.pools)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAIL


@dataclass(frozen=True, slots=True)
class UsageError:
    """Why a manifest (or an argument) cannot be checked; `field` is a dotted path."""

    source: str
    message: str
    field: str = ""

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.message}"


# --- text -----------------------------------------------------------------------------


def _line(item: Item) -> Text:
    symbol, style = _SYMBOL[item.status]
    text = Text("  ")
    text.append(symbol, style=style)
    text.append(" ")
    text.append(item.subject, style="bold")
    text.append(f": {item.message}")
    if item.fix and item.status in (Status.FAIL, Status.WARN):
        text.append(" → ", style="dim")
        text.append(item.fix, style="cyan")
    return text


def render_text(report: Report, console: Console) -> None:
    """One header per pool, one line per item, then a summary line."""
    for pool in report.pools:
        console.print(
            Text.assemble(
                ("VsphereAgentPool ", "bold"), (pool.pool, "bold"), (f"  ({pool.source})", "dim")
            ),
            soft_wrap=True,
        )
        for item in pool.items:
            console.print(_line(item), soft_wrap=True)
        console.print()
    failed = sum(p.count(Status.FAIL) for p in report.pools)
    warned = sum(p.count(Status.WARN) for p in report.pools)
    bad_pools = sum(1 for p in report.pools if not p.ok)
    noun = "pool" if len(report.pools) == 1 else "pools"
    summary = Text(f"{len(report.pools)} {noun} checked: ")
    if report.ok:
        summary.append("all checks passed", style="bold green")
    else:
        summary.append(
            f"{bad_pools} failed ({failed} problem{'s' * (failed != 1)})", style="bold red"
        )
    if warned:
        summary.append(f", {warned} warning{'s' * (warned != 1)}", style="yellow")
    console.print(summary, soft_wrap=True)


def render_usage_text(errors: Sequence[UsageError], console: Console) -> None:
    for error in errors:
        line = Text("✗ ", style="bold red")
        line.append(str(error), style="")
        console.print(line, soft_wrap=True)


# --- JSON -----------------------------------------------------------------------------


def report_json(report: Report) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "exitCode": report.exit_code,
        "pools": [
            {
                "pool": p.pool,
                "source": p.source,
                "ok": p.ok,
                "items": [i.to_json() for i in p.items],
            }
            for p in report.pools
        ],
    }


def render_json(report: Report) -> str:
    return json.dumps(report_json(report), indent=2, ensure_ascii=False)


def render_usage_json(errors: Sequence[UsageError]) -> str:
    body = {
        "ok": False,
        "exitCode": EXIT_USAGE,
        "errors": [{"source": e.source, "field": e.field, "message": e.message} for e in errors],
    }
    return json.dumps(body, indent=2, ensure_ascii=False)
