"""The JSON the API server exchanges with us: models to request bodies, and lenient
reads of cached objects.

`to_wire` drops None (the Go operator's `omitempty`) but keeps empty lists, because a
status list the operator emptied must reach the server as `[]`. `get` and `text` read
a raw object as index functions and watch predicates must: never raising, a missing
or mistyped value read as None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


def to_wire(model: BaseModel) -> dict[str, Any]:
    """`model` as the camelCase JSON object the API server expects."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def get(obj: object, *path: str) -> Any:
    """The value at `path` in nested mappings, None where any step is missing."""
    value: Any = obj
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def text(value: object) -> str | None:
    """`value` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None
