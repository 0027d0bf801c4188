"""LIST pages decoded to what the informer keeps: the rest of each object is never built.

A LIST page of 100 Agents is about 600 KB of JSON, of which the informer keeps a
few hundred bytes per Agent (`api.trim`). Decoding it whole builds every key and
value of every inventory only to drop them in the trim. `decoder(keep)` decodes a
page with msgspec into the fields `keep` lists (and the page's `metadata`), skipping
the others while parsing; the informer's trim then runs on that as on a full object,
so what is cached is the same (`tests/unit/kube/test_pages.py`). A page whose shape
the decoder refuses (a field of another type than the trim expects) is decoded whole
with `json.loads`, and the trim handles it as before.
"""

from __future__ import annotations

import itertools
import json
import typing
from collections.abc import Mapping
from typing import Any

from agentforge.api.trim import Keep, Shared
from agentforge.kube.transport import Decode

__all__ = ["SMALL", "Decode", "decoder"]

SMALL = 64 * 1024
"""Bytes below which an answer is read whole (a page of about ten Agents)."""

_names = itertools.count()
# `TypedDict(name, fields)` with computed fields: mypy only checks literal ones.
_typed_dict: Any = typing.TypedDict


def _shape(spec: Keep) -> Any:
    """The type msgspec decodes a value kept by `spec` as: whole values as `Any`,
    mappings as a TypedDict of the listed keys (others skipped), lists item by item."""
    if isinstance(spec, Shared):
        return _shape(spec.spec)
    if isinstance(spec, list):
        return list[_shape(spec[0])]  # type: ignore[misc]
    if isinstance(spec, Mapping):
        fields = {key: _shape(sub) for key, sub in spec.items()}
        return _typed_dict(f"Kept{next(_names)}", fields, total=False)
    return Any


def decoder(keep: Keep) -> Decode:
    """Decode a LIST response to its `metadata` and, of each item, what `keep` lists.
    An answer below `SMALL` bytes (an empty list, a few objects) is read with
    `json.loads`: msgspec is imported, and the decoder built, for the first large one."""
    typed: Decode | None = None

    def decode(raw: bytes) -> Any:
        nonlocal typed
        if len(raw) < SMALL:
            return json.loads(raw)
        if typed is None:
            typed = _typed(keep)
        return typed(raw)

    return decode


def _typed(keep: Keep) -> Decode:
    import msgspec  # noqa: PLC0415 (an operator whose pages are all small never loads it)

    page = _typed_dict(
        f"Page{next(_names)}",
        {"metadata": dict[str, Any], "items": list[_shape(keep)]},  # type: ignore[misc]
        total=False,
    )
    typed = msgspec.json.Decoder(page).decode

    def decode(raw: bytes) -> Any:
        try:
            return typed(raw)
        except msgspec.MsgspecError:
            return json.loads(raw)  # another shape, or not JSON: as before

    return decode
