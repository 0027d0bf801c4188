"""Models to request bodies: the JSON the API server receives from us.

`to_wire` drops None (the Go operator's `omitempty`) but keeps empty lists, because a
status list the operator emptied must reach the server as `[]`. A JSON merge patch
cannot express removal by omission, so `merge_patch` turns a before/after pair into an
RFC 7386 patch in which a removed field (a cleared `status.isoEjection` record, say)
is an explicit null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


def to_wire(model: BaseModel) -> dict[str, Any]:
    """`model` as the camelCase JSON object the API server expects."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `before` into `after`.

    Lists are replaced whole, as merge patches require; an empty result means no change.
    """
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, new in after.items():
        old = before.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            nested = merge_patch(old, new)
            if nested:
                patch[key] = nested
        elif key not in before or old != new:
            patch[key] = new
    return patch
