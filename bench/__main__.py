"""`python -m bench [--only NAME ...] [--list]`: measure, print, update results/latest.md.

Exit status 1 only when a benchmark crashed; figures that miss their goal are
reported, not failed. A guarded figure (start-up, memory, writes per VM, ...) that got
worse than in the previous `results/latest.md` by more than its noise band prints a
`regression:` line before the file is rewritten.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from bench import harness


async def _main(only: list[str], keep: bool) -> int:
    console = Console()
    modules = harness.discover()
    unknown = sorted(set(only) - set(modules))
    if unknown:
        console.print(f"[red]unknown benchmark(s) {', '.join(unknown)}; have {', '.join(modules)}")
        return 2
    chosen = {name: modules[name] for name in (only or modules)}
    workdir = Path(tempfile.mkdtemp(prefix="agentforge-bench-"))
    ctx = harness.Context(workdir=workdir, console=console)
    sections: list[harness.Section] = []
    try:
        for name, module in chosen.items():
            section = await harness.run_one(name, module, ctx)
            sections.append(section)
            console.print(harness.table(section))
            for note in section.notes:
                console.print(f"  - {note}", markup=False, highlight=False)
    finally:
        ctx.step("tearing down")
        await ctx.close()
    existing = harness.RESULTS.read_text() if harness.RESULTS.exists() else ""
    for line in harness.regressions(existing, sections):
        console.print(f"[bold red]{line}", markup=True, highlight=False)
    harness.RESULTS.parent.mkdir(parents=True, exist_ok=True)
    harness.RESULTS.write_text(harness.merge(existing, sections, order=list(modules)))
    console.print(f"wrote {harness.RESULTS}" + (f"; logs in {workdir}" if keep else ""))
    if not keep:
        import shutil  # noqa: PLC0415

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(s.failed for s in sections) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME", help="run only this benchmark"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the work directory (operator logs)"
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, module in harness.discover().items():
            print(f"{name:12} {(module.__doc__ or '').strip().splitlines()[0]}")
        return 0
    return asyncio.run(_main(args.only, args.keep_logs))


if __name__ == "__main__":
    sys.exit(main())
