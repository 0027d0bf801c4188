"""Every flag and environment variable of `agentforge run`, validated once at start.

`Settings` (model.py, on top of its `ProcessSettings`) is a pydantic-settings
model whose fields are the settings:
each declares its flag, its default, its help and how to fix a bad value; the
environment variable is `AGENT_FORGE_<FLAG>` (dashes become underscores). The
argparse flags (cli.py), the environment reader (pydantic-settings') and the table
in docs/configuration.md are all derived from those fields, so they cannot drift
apart. Values are taken from the flag, else from the variable, else the default,
then validated; the result is frozen and passed to the composition root. A bad
value becomes a `SettingsError` naming the flag, the variable and the fix.

The value types and their text syntax (Go durations, `host:port`, quantities) are
in values.py.
"""

from agentforge.settings.cli import (
    IN_CLUSTER_NAMESPACE_FILE,
    OPTIONS,
    Option,
    SettingsError,
    add_run_arguments,
    load,
    require_secret_namespaces,
)
from agentforge.settings.model import ENV_PREFIX, JITTER_FACTOR, Flag, ProcessSettings, Settings
from agentforge.settings.values import (
    BindAddress,
    LogFormat,
    LogLevel,
    parse_bind_address,
    parse_byte_size,
    parse_duration,
)

__all__ = [
    "ENV_PREFIX",
    "IN_CLUSTER_NAMESPACE_FILE",
    "JITTER_FACTOR",
    "OPTIONS",
    "BindAddress",
    "Flag",
    "LogFormat",
    "LogLevel",
    "Option",
    "ProcessSettings",
    "Settings",
    "SettingsError",
    "add_run_arguments",
    "load",
    "parse_bind_address",
    "parse_byte_size",
    "parse_duration",
    "require_secret_namespaces",
]
