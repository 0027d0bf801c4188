"""The value types of the settings and the parsers that read them from text.

Durations use Go's syntax (`15s`, `1m30s`, `500ms`) because the flags mirror
controller-runtime's; plain numbers are seconds. Bind addresses are `host:port`,
`:port` or `[::1]:port`, and `0` turns a server off. Sizes are Kubernetes
quantities (`8Gi`). Each parser raises `ValueError` with a short reason, which the
settings loader turns into a message naming the flag and the fix.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator

__all__ = [
    "BindAddress",
    "ByteSize",
    "Duration",
    "Format",
    "Level",
    "LogFormat",
    "LogLevel",
    "Names",
    "OptionalBind",
    "Switch",
    "parse_bind_address",
    "parse_byte_size",
    "parse_duration",
]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(enum.StrEnum):
    JSON = "json"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where a server listens; port 0 asks the kernel for a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_duration(value: object) -> timedelta:
    """A Go duration (`1m30s`, `500ms`) or a number of seconds, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError("not a duration")  # noqa: TRY004
    text = value.strip()
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError("not a duration")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


def parse_bind_address(value: object) -> BindAddress | None:
    """`host:port`, `:port` (all interfaces), `[::1]:port`; `0` turns the server off."""
    if value is None or isinstance(value, BindAddress):
        return value
    text = str(value).strip()
    if text == "0":
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError("not host:port")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"  # noqa: S104 (probes)
    return BindAddress(host=host, port=port)


_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_QUANTITY_FACTOR = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def parse_byte_size(value: object) -> object:
    """A byte count as a Kubernetes quantity (`8Gi`, `500M`) or a plain number."""
    if isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise ValueError("not a size (a whole number of bytes, or e.g. 512Mi, 8Gi)")
        return int(match.group(1)) * _QUANTITY_FACTOR[match.group(2)]
    return value


def _parse_bool(value: object) -> object:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off", ""}:
            return False
    return value


def _split_namespaces(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        out: list[str] = []
        for item in value:
            out.extend(part.strip() for part in str(item).split(",") if part.strip())
        return tuple(out)
    return value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _lower_level(value: object) -> object:
    lowered = _lower(value)
    return "warning" if lowered == "warn" else lowered


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
OptionalBind = Annotated[BindAddress | None, BeforeValidator(parse_bind_address)]
Switch = Annotated[bool, BeforeValidator(_parse_bool)]
"""`true/false`, `1/0`, `yes/no`, `on/off` (any case); empty is false."""
Names = Annotated[tuple[str, ...], BeforeValidator(_split_namespaces)]
"""Repeated values or one comma-separated string, as a tuple."""
ByteSize = Annotated[int, BeforeValidator(parse_byte_size)]
Level = Annotated[LogLevel, BeforeValidator(_lower_level)]
Format = Annotated[LogFormat, BeforeValidator(_lower)]
