"""Field types shared by the API models, each carrying the validation the CRD enforces.

One rule holds for every type here: the pydantic model accepts exactly what the API
server accepts. The CRD schema is generated from these annotations (see `crdgen`),
so a bound is written once and both sides agree; an object the server stored can
always be parsed, and an object the model builds is never rejected by the server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Final, TypeVar

from annotated_types import Ge
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

# --- model bases ---------------------------------------------------------------------


class KubeModel(BaseModel):
    """Base of our own CRD shapes: camelCase on the wire, unknown fields ignored.

    Unknown fields are ignored rather than rejected so that an object written by a
    newer operator (or the Go operator) still parses; the API server prunes what the
    CRD does not declare, so nothing unexpected survives a round trip anyway.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="ignore",
        defer_build=True,  # validators built on first use: an idle operator parses none
    )


class View(BaseModel):
    """Base of the read-only views of kinds other projects own: frozen and lenient."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="ignore",
        defer_build=True,  # validators built on first use: an idle operator parses none
        frozen=True,
    )


# --- JSON-schema annotations (read by crdgen) -----------------------------------------


@dataclass(frozen=True, slots=True)
class KubeSchema:
    """Adds keys to a type's JSON schema: `format`, `x-kubernetes-*` extensions."""

    extra: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **extra: Any) -> KubeSchema:
        return cls(tuple(sorted(extra.items())))

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema.update(dict(self.extra))
        return schema


def immutable(field: str) -> dict[str, Any]:
    """`json_schema_extra` for a field the API server refuses to change once set."""
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": f"{field} is immutable"}
        ]
    }


# --- integers ------------------------------------------------------------------------

Int32 = Annotated[int, KubeSchema.of(format="int32")]
"""An integer the Go operator holds in an int32."""
Int64 = Annotated[int, KubeSchema.of(format="int64")]
"""An integer the Go operator holds in an int64 (generations, sizes)."""
Count = Annotated[int, Ge(0), KubeSchema.of(format="int32")]
"""A non-negative int32 count in status."""

# --- status enumerations -------------------------------------------------------------

_E = TypeVar("_E", bound=StrEnum)

OpenEnum = Annotated[
    _E | str, Field(union_mode="left_to_right"), WithJsonSchema({"type": "string"})
]
"""A status field holding a value of the enum `E`, or any string another version wrote.

Status is written by whichever operator runs: this one, an older or newer release of
it, or the Go operator. A value this release does not know must not make the whole
object unparseable (that stalls every reconcile of it), so a known value parses to
its `E` member and any other string is kept as written (and written back unchanged).
Read it with `known(E, value)`, or compare with `is`: an unknown value equals no
member. The CRD schema is a plain string, without `enum`, so the API server accepts
every version's status writes (docs/design/0003). Spec fields use `E` itself: user
input stays closed, checked by the CRD and by the model alike.
"""


def known(enum: type[_E], value: object) -> _E | None:
    """`value` as a member of `enum`; None when it is absent or a value `enum` lacks."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str):
        try:
            return enum(value)
        except ValueError:
            return None
    return None


# --- names ---------------------------------------------------------------------------

DNS1123_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_VALUE_PATTERN: Final = r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"
VSPHERE_IDENT_PATTERN: Final = r"^[A-Za-z0-9_.-]+$"

DNS1123Subdomain = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)
]
"""An object name: lower-case alphanumerics, '-' and '.', 1..253 characters."""

DNS1123Label = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=DNS1123_LABEL_PATTERN)
]
"""A namespace name: lower-case alphanumerics and '-', 1..63 characters."""

OptionalDNS1123Label = Annotated[
    str, StringConstraints(max_length=63, pattern=f"^$|{DNS1123_LABEL_PATTERN}")
]
"""A DNS-1123 label, or empty (the Go operator's `omitempty` zero value)."""

LabelValue = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)
]
"""A non-empty Kubernetes label value."""

VsphereIdent = Annotated[str, StringConstraints(max_length=64, pattern=VSPHERE_IDENT_PATTERN)]
"""A vSphere enumeration-like identifier (guest ID, SCSI or NIC type)."""

UUID_PATTERN: Final = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
BiosUUID = Annotated[str, StringConstraints(pattern=UUID_PATTERN)]
"""A lower-case 8-4-4-4-12 UUID, as `config.uuid` reports it."""

DATASTORE_PATH_PATTERN: Final = r"^\[[^\]]+\] \S.*$"
DatastorePath = Annotated[str, StringConstraints(max_length=1024, pattern=DATASTORE_PATH_PATTERN)]
"""A vSphere datastore path: `[datastore] folder/file`."""

# --- time ----------------------------------------------------------------------------


def _utc_seconds(value: datetime) -> datetime:
    """metav1.Time has second precision and is UTC on the wire; hold it the same way."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(microsecond=0)


def format_time(value: datetime) -> str:
    """RFC 3339 as Kubernetes writes it: `2026-01-02T03:04:05Z`."""
    return _utc_seconds(value).strftime("%Y-%m-%dT%H:%M:%SZ")


Time = Annotated[
    datetime,
    AfterValidator(_utc_seconds),
    PlainSerializer(format_time, return_type=str, when_used="json"),
]
"""A Kubernetes timestamp (metav1.Time): UTC, whole seconds, `...Z` on the wire."""

# --- durations -----------------------------------------------------------------------

GO_DURATION_PATTERN: Final = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

GoDuration = Annotated[str, StringConstraints(pattern=GO_DURATION_PATTERN)]
"""A non-negative Go `time.Duration` string such as `10m`, `1h30m` or `10m0s`."""


def parse_duration(value: str) -> timedelta:
    """The length of a Go duration string (as `time.ParseDuration`, without signs)."""
    if not re.fullmatch(GO_DURATION_PATTERN, value):
        raise ValueError(f"not a Go duration: {value!r} (examples: 10m, 1h30m, 90s)")
    seconds = sum(
        float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(value)
    )
    return timedelta(seconds=seconds)
