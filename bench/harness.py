"""The benchmark harness: find `bench/bench_*.py`, run them, print and record figures.

A benchmark module exposes `async def run(ctx: Context) -> Section`. A section has a
title, figures (a measured value, its unit and, where the project set one, the goal
it is compared with) and notes saying how it was measured. Figures are printed and
recorded, never asserted: a slow figure is information, and only a benchmark that
crashes makes the run fail.

`bench/results/latest.md` holds one block per benchmark module, delimited by HTML
comments, so `--only NAME` re-measures one benchmark and replaces only its block.

Benchmarks share expensive set-up through `Context.shared`: a control plane with
30,000 objects is built once per run, whichever benchmark asks first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import pkgutil
import platform
import re
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

import bench

RESULTS = Path(bench.__file__).resolve().parent / "results" / "latest.md"
_BEGIN = "<!-- bench:{name} -->"
_END = "<!-- /bench:{name} -->"
_BLOCK = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n.*?<!-- /bench:(?P=name) -->\n?", re.S)
_HEADER = (
    "# Benchmark results\n\n"
    "Written by `make bench` (`python -m bench`); `python -m bench --only NAME` "
    "re-measures one section. Figures are measurements, not pass/fail checks; the goal "
    "column is the project's target for each.\n\n"
)

T = TypeVar("T")
_SYMBOL = {"<=": "≤", "<": "<", "=": "="}


@dataclass(frozen=True, slots=True)
class Goal:
    """A target a figure is compared with (`at_most 150` MB, `below 50` ms, `equal 0`)."""

    op: str
    value: float

    @classmethod
    def at_most(cls, value: float) -> Goal:
        return cls("<=", value)

    @classmethod
    def below(cls, value: float) -> Goal:
        return cls("<", value)

    @classmethod
    def equal(cls, value: float) -> Goal:
        return cls("=", value)

    def met(self, measured: float) -> bool:
        return {
            "<=": measured <= self.value,
            "<": measured < self.value,
            "=": measured == self.value,
        }[self.op]

    def __str__(self) -> str:
        return f"{_SYMBOL[self.op]} {self.value:g}"


@dataclass(frozen=True, slots=True)
class Guard:
    """A figure `make bench` compares with the previous run's (in `latest.md`): one worse
    by more than `noise` (a fraction of the previous value: the run-to-run spread seen on
    this machine) prints a regression line."""

    noise: float
    higher_is_better: bool = False

    def regressed(self, before: float, now: float) -> bool:
        worse = before - now if self.higher_is_better else now - before
        return worse > self.noise * abs(before)


WALL = Guard(0.20)
"""Wall-clock figures: the same run on this machine's kind spread by up to ~20% (the
speed benchmark's scale-up ratio read 1.26x to 1.55x across runs and machines)."""
MEMORY = Guard(0.05)
"""RSS: a few MB of allocator and import noise on 60-150 MB."""
COUNT = Guard(0.05)
"""Counts per VM (API writes, vSphere requests): timing moves them by a few percent."""


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    value: float | None  # None: could not be measured (say why in the notes)
    unit: str
    goal: Goal | None = None
    guard: Guard | None = None

    def formatted(self) -> str:
        if self.value is None:
            return "n/a"
        if abs(self.value) >= 100 or float(self.value).is_integer():
            return f"{self.value:,.0f}"
        return f"{self.value:,.3g}" if abs(self.value) < 1 else f"{self.value:,.2f}"

    def verdict(self) -> str:
        if self.goal is None or self.value is None:
            return ""
        return "yes" if self.goal.met(self.value) else "no"


@dataclass(slots=True)
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    name: str = ""  # the module's short name; set by the runner
    seconds: float = 0.0
    failed: bool = False

    def add(
        self,
        name: str,
        value: float | None,
        unit: str,
        goal: Goal | None = None,
        *,
        guard: Guard | None = None,
    ) -> None:
        self.figures.append(Figure(name, value, unit, goal, guard))


class Context:
    """What benchmarks share: a work directory, a console and memoised set-up."""

    def __init__(self, *, workdir: Path, console: Console) -> None:
        self.workdir = workdir
        self.console = console
        self._shared: dict[str, Any] = {}
        self._cleanups = contextlib.AsyncExitStack()

    async def shared(self, key: str, make: Callable[[Context], Awaitable[T]]) -> T:
        """`make(ctx)` the first time `key` is asked for, the same value afterwards."""
        if key not in self._shared:
            self._shared[key] = await make(self)
        return self._shared[key]  # type: ignore[no-any-return]

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` when the whole run ends (in reverse order of registration)."""
        self._cleanups.push_async_callback(callback)

    def step(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")

    async def close(self) -> None:
        await self._cleanups.aclose()


def discover() -> dict[str, ModuleType]:
    """`{short name: module}` of every `bench/bench_*.py`, sorted by name."""
    found = {}
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda i: i.name):
        if info.name.startswith("bench_"):
            found[info.name.removeprefix("bench_")] = importlib.import_module(f"bench.{info.name}")
    return found


async def run_one(name: str, module: ModuleType, ctx: Context) -> Section:
    ctx.console.rule(f"[bold]{name}")
    started = time.monotonic()
    try:
        section: Section = await module.run(ctx)
    except Exception as exc:
        section = Section(title=name, failed=True)
        section.notes.append(f"failed: {type(exc).__name__}: {exc}")
        ctx.console.print(traceback.format_exc(), markup=False, highlight=False)
    section.name = name
    section.seconds = time.monotonic() - started
    return section


def table(section: Section) -> Table:
    out = Table(title=section.title, title_justify="left")
    out.add_column("figure")
    out.add_column("value", justify="right")
    out.add_column("unit")
    out.add_column("goal", justify="right")
    out.add_column("meets goal")
    for figure in section.figures:
        verdict = figure.verdict()
        style = {"yes": "green", "no": "red"}.get(verdict, "")
        out.add_row(
            figure.name,
            figure.formatted(),
            figure.unit,
            str(figure.goal or ""),
            f"[{style}]{verdict}[/{style}]" if style else "",
        )
    return out


def markdown(section: Section, *, when: dt.datetime) -> str:
    lines = [
        _BEGIN.format(name=section.name),
        f"## {section.title}",
        "",
        f"`bench/bench_{section.name}.py`, measured {when:%Y-%m-%d %H:%M} UTC on "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"in {section.seconds:.0f} s (with any shared set-up it started).",
        "",
    ]
    if section.figures:
        lines += ["| figure | value | unit | goal | meets goal |", "|---|---:|---|---:|---|"]
        for f in section.figures:
            goal = str(f.goal or "").replace("≤", "<=")
            lines.append(f"| {f.name} | {f.formatted()} | {f.unit} | {goal} | {f.verdict()} |")
        lines.append("")
    lines += [f"- {note}" for note in section.notes]
    lines += ["", _END.format(name=section.name), ""]
    return "\n".join(lines)


_ROW = re.compile(r"^\| (?P<name>.+?) \| (?P<value>-?[\d,]*\.?\d+(?:e[-+]?\d+)?) \| ", re.M)


def recorded(existing: str) -> dict[tuple[str, str], float]:
    """`{(benchmark, figure name): value}` of every measured figure in a results file."""
    found = {}
    for block in _BLOCK.finditer(existing):
        for row in _ROW.finditer(block[0]):
            found[block["name"], row["name"]] = float(row["value"].replace(",", ""))
    return found


def regressions(existing: str, sections: list[Section]) -> list[str]:
    """One line per guarded figure that got worse than the previous run's by more than
    its noise band (figures new to this run, or not measured, are not compared)."""
    before = recorded(existing)
    lines = []
    for section in sections:
        for f in section.figures:
            was = before.get((section.name, f.name))
            if f.guard is None or f.value is None or was is None:
                continue
            if f.guard.regressed(was, f.value):
                change = f"{(f.value - was) / abs(was):+.0%}" if was else "from 0"
                lines.append(
                    f"regression: {section.name}: {f.name.strip()} {was:g} -> "
                    f"{f.formatted()} {f.unit} ({change}; noise band {f.guard.noise:.0%})"
                )
    return lines


def merge(existing: str, sections: list[Section], *, order: list[str]) -> str:
    """The results file with these sections' blocks replaced or added, in `order`."""
    blocks = {m["name"]: m[0].rstrip("\n") + "\n" for m in _BLOCK.finditer(existing)}
    when = dt.datetime.now(dt.UTC)
    for section in sections:
        blocks[section.name] = markdown(section, when=when)
    ranked = sorted(blocks, key=lambda n: (order.index(n) if n in order else len(order), n))
    return _HEADER + "\n".join(blocks[n] for n in ranked)
