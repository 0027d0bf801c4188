"""Drift of a generated tree (bundle/, charts/agent-forge) from what its script makes.

One report for `make bundle-check` and the chart check: files no longer generated,
then a unified diff per file that differs, paths relative to the repository.
"""

from __future__ import annotations

import difflib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tree_drift(root: Path, files: dict[Path, str], *, target: str) -> str:
    """The drift of `root` on disk from `files` (empty when none); `target` is the make
    target that regenerates it."""
    chunks: list[str] = []
    present = {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()
    for path in sorted(present - set(files)):
        chunks.append(f"{path.relative_to(REPO)}: not generated any more (run `make {target}`)\n")
    for path, wanted in sorted(files.items()):
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != wanted:
            rel = path.relative_to(REPO)
            chunks.extend(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    fromfile=f"{rel} (committed)",
                    tofile=f"{rel} (generated)",
                )
            )
    return "".join(chunks)
