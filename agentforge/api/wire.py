"""Models to request bodies: the JSON the API server receives from us.

`to_wire` drops None (the Go operator's `omitempty`) but keeps empty lists, because a
status list the operator emptied must reach the server as `[]`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def to_wire(model: BaseModel) -> dict[str, Any]:
    """`model` as the camelCase JSON object the API server expects."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
