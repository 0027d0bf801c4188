"""The flag and environment-variable table of docs/configuration.md, generated from the code.

`agentforge.settings.OPTIONS` lists the operator's settings as the fields of the
pydantic-settings model `Settings` declare them (the CLI and the environment reader
are built from the same fields); this script renders it, with each setting's
default read from the model, between the markers below in
`docs/configuration.md`. `make docs` rewrites the table; `--check` (run by
`make lint` and a unit test) fails when the committed table differs from the code.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import timedelta
from pathlib import Path

from agentforge import settings

__all__ = ["BEGIN", "END", "TARGET", "main", "render", "update"]

TARGET = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: settings (make docs) -->"
END = "<!-- END GENERATED: settings -->"


_DEFAULT_NOTE = re.compile(r"\s*\(default\b[^)]*\)")


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _quantity(value: int) -> str:
    """Bytes as the largest binary unit that divides them (`8Gi`), else a number."""
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def _default(option: settings.Option) -> str:
    value = settings.Settings.model_fields[option.field].default
    if option.field == "namespaces":
        return "all namespaces"
    if option.field == "credential_namespaces":
        return "the `--namespace` list; required when all namespaces are watched"
    if option.field == "kubeconfig":
        return "`$KUBECONFIG`, else the in-cluster service account, else `~/.kube/config`"
    if option.field == "leader_election_namespace":
        return "the pod's namespace"
    if option.field == "metrics_cert_path":
        return "unset: a self-signed certificate generated at start"
    if option.field == "iso_ca_bundle":
        return "unset: the system trust store only"
    if option.field == "iso_max_size":
        return f"`{_quantity(value)}`"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, timedelta):
        return f"`{_duration(value)}`"
    if isinstance(value, settings.BindAddress):
        host = "" if value.host in {"0.0.0.0", "::"} else value.host  # noqa: S104
        return f"`{host}:{value.port}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The Markdown table (with its markers) for the current code."""
    lines = [
        BEGIN,
        "",
        "| flag | environment variable | default | meaning |",
        "|---|---|---|---|",
    ]
    for option in settings.OPTIONS:
        flag = f"`{option.flag}`" if option.switch else f"`{option.flag} {option.metavar}`"
        meaning = _DEFAULT_NOTE.sub("", option.help)  # the default has its own column
        if option.repeatable:
            meaning += " (in the environment variable: comma-separated)"
        if option.switch:
            meaning += f" (`{option.flag}` alone means true)"
        lines.append(
            f"| {flag} | `{option.env}` | {_default(option)} | {_cell(meaning)}. "
            f"Invalid value: {_cell(option.fix)}. |"
        )
    lines += ["", END]
    return "\n".join(lines)


def update(text: str) -> str:
    """`text` with the generated block replaced by the current one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{TARGET}: markers {BEGIN!r} ... {END!r} not found")
    return text[:start] + render() + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.settings_reference")
    parser.add_argument("--check", action="store_true", help="fail when the docs are stale")
    args = parser.parse_args(argv)
    current = TARGET.read_text(encoding="utf-8")
    wanted = update(current)
    if args.check:
        if current != wanted:
            print(
                f"{TARGET.relative_to(TARGET.parent.parent)}: the settings table is out of "
                "date with agentforge/settings/: run `make docs`",
                file=sys.stderr,
            )
            return 1
        return 0
    if current != wanted:
        TARGET.write_text(wanted, encoding="utf-8")
        print(f"updated {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
