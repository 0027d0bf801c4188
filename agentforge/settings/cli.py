"""`agentforge run`'s flags and the loader: flags over `AGENT_FORGE_*` over defaults.

The flags are declared on an argparse parser from the fields of `Settings` (their
`Flag` and description); unset flags stay None so the environment can fill them.
The environment is read by pydantic-settings' `EnvSettingsSource` (its prefix,
case sensitivity and aliases are the model's), from the mapping `load` is handed
rather than the process environment, so a caller decides what counts. The parser
stays argparse rather than pydantic-settings' own CLI source because the command
line is a contract: `--leader-elect` alone means true, `--namespace` repeats, and
errors exit 2 like argparse's.

A bad value becomes a `SettingsError` whose message names the flag, where the value
came from (`--flag` or `--flag (from AGENT_FORGE_FLAG)`), the value and the fix; the
CLI prints it and exits 2 without a traceback, as argparse does for unknown flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource

from agentforge.api import names
from agentforge.settings.model import CrossFieldError, Flag, Settings

__all__ = [
    "IN_CLUSTER_NAMESPACE_FILE",
    "OPTIONS",
    "Option",
    "SettingsError",
    "add_run_arguments",
    "load",
    "require_secret_namespaces",
]

IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class SettingsError(Exception):
    """A setting is invalid; the message names the flag and says how to fix it."""


@dataclass(frozen=True, slots=True)
class Option:
    """One setting as the user sees it: field, flag, variable, help and fix."""

    field: str
    flag: str
    env: str
    help: str
    fix: str
    metavar: str = "VALUE"
    repeatable: bool = False
    switch: bool = False


def _options() -> tuple[Option, ...]:
    out: list[Option] = []
    for name, info in Settings.model_fields.items():
        flags = [m for m in info.metadata if isinstance(m, Flag)]
        if len(flags) != 1 or not info.description:
            raise TypeError(f"Settings.{name} needs one Flag(...) and a description")
        flag = flags[0]
        env = info.validation_alias
        if not isinstance(env, str):
            raise TypeError(f"Settings.{name} needs one environment variable")
        out.append(
            Option(
                field=name,
                flag=flag.flag,
                env=env,
                help=info.description,
                fix=flag.fix,
                metavar=flag.metavar,
                repeatable=flag.repeatable,
                switch=flag.switch,
            )
        )
    return tuple(out)


OPTIONS: tuple[Option, ...] = _options()
_BY_FIELD = {option.field: option for option in OPTIONS}
_BY_KEY = {**_BY_FIELD, **{option.env: option for option in OPTIONS}}


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags of `agentforge run`; unset flags stay None so env can fill them."""
    for option in OPTIONS:
        help_text = f"{option.help} [env {option.env}]"
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.field, nargs="?", const="true", default=None,
                metavar="BOOL", help=help_text,
            )  # fmt: skip
        elif option.repeatable:
            parser.add_argument(
                option.flag,
                dest=option.field,
                action="append",
                metavar=option.metavar,
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag, dest=option.field, default=None, metavar=option.metavar, help=help_text
            )


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping, not `os.environ`."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(Settings)
        self.env_vars = dict(environ)  # case-sensitive: the names are used as they are


def load(
    args: argparse.Namespace | Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    namespace_file: Path = IN_CLUSTER_NAMESPACE_FILE,
) -> Settings:
    """Merge flags over `AGENT_FORGE_*` variables over defaults and validate the result."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    from_env = {_BY_KEY[key].field: value for key, value in _Environment(environ)().items()}
    raw: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for option in OPTIONS:
        value = given.get(option.field)
        if value is not None:
            raw[option.field] = value
            origin[option.field] = option.flag
        elif option.field in from_env:
            raw[option.field] = from_env[option.field]
            origin[option.field] = option.env
    try:
        settings = Settings(**raw)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, raw=raw, origin=origin)) from None
    if settings.leader_elect and settings.leader_election_namespace is None:
        settings = settings.model_copy(
            update={"leader_election_namespace": _in_cluster_namespace(namespace_file)}
        )
    return settings


def require_secret_namespaces(settings: Settings) -> None:
    """Refuse to start with nowhere to read credentials: an empty list grants nothing.

    Checked when the operator starts (not in `load`, so settings can be inspected
    without it): the operator reads Secrets only in `settings.secret_namespaces`."""
    if not settings.secret_namespaces:
        option = _BY_FIELD["credential_namespaces"]
        raise SettingsError(
            f"{option.flag} is required when the operator watches all namespaces (no "
            "--namespace): name each namespace whose Secrets pools may use, and bind the "
            f"ClusterRole {names.CREDENTIALS_READER_ROLE} to the operator there with a "
            "RoleBinding. The operator reads no Secret outside these namespaces, and an empty "
            "list is no grant of all (docs/installation.md#credentials-namespaces) "
            f"[env {option.env}]"
        )


def _in_cluster_namespace(path: Path) -> str:
    try:
        namespace = path.read_text().strip()
    except OSError:
        namespace = ""
    if not namespace:
        option = _BY_FIELD["leader_election_namespace"]
        raise SettingsError(
            f"{option.flag} is required with --leader-elect outside a cluster "
            f"(no {path}): {option.fix} [env {option.env}]"
        )
    return namespace


def _describe(exc: ValidationError, *, raw: Mapping[str, Any], origin: Mapping[str, str]) -> str:
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        cause = error.get("ctx", {}).get("error")
        key = getattr(cause, "field", None) or (str(error["loc"][0]) if error["loc"] else "")
        option = _BY_KEY.get(key)
        message = str(cause) if cause is not None else str(error["msg"])
        if option is None:
            lines.append(message)
            continue
        field = option.field
        source = origin.get(field, option.flag)
        shown = (
            f" {raw[field]!r}" if field in raw and not isinstance(cause, CrossFieldError) else ""
        )
        names = option.flag if source == option.flag else f"{option.flag} (from {source})"
        lines.append(f"invalid {names}{shown}: {message}; {option.fix}")
    return "\n".join(lines)
