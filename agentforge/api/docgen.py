"""`docs/reference/api.md`, generated from the same models as the CRDs (pure).

The reference is built from the structural schemas `crdgen` produces, so a type,
default or bound in the docs is the one the API server enforces; `make manifests`
rewrites it and `make manifests-check` fails when it drifts.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel

from agentforge.api import conditions, crdgen, pool, vm, vsphereagent

_BOUNDS: Final = (
    ("minimum", "≥ {}"),
    ("maximum", "≤ {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("minProperties", "≥ {} entries"),
    ("maxProperties", "≤ {} entries"),
)

_ENUMS: Final[tuple[type[StrEnum], ...]] = (
    conditions.PoolConditionType,
    conditions.PoolReason,
    conditions.VsphereAgentConditionType,
    conditions.VsphereAgentReason,
    conditions.ISOEjectedReason,
    vm.VMPhase,
    vm.VMReason,
    vm.VMSource,
    pool.PlannedActionType,
    vsphereagent.CreationPhase,
    vsphereagent.ISOEjectionPhase,
)
_NOT_WRITTEN: Final[frozenset[StrEnum]] = frozenset({vsphereagent.CreationPhase.POWER_ON_ISSUED})
"""Values earlier versions wrote that this version still reads but no longer writes."""


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models mentioned anywhere in a field annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def _reachable(root: type[BaseModel]) -> list[type[BaseModel]]:
    """`root` and every model its fields use, in first-seen (depth-first) order."""
    seen: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for info in model.model_fields.values():
            for nested in _models_in(info.annotation):
                visit(nested)

    visit(root)
    return seen


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_of(node: dict[str, Any], model: type[BaseModel] | None) -> str:
    if model is not None:
        link = f"[{model.__name__}](#{model.__name__.lower()})"
        return f"[]{link}" if node.get("type") == "array" else link
    kind = str(node.get("type", "any"))
    if kind == "array":
        return "[]" + _type_of(node.get("items", {}), None)
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map[string]" + _type_of(node["additionalProperties"], None)
    return f"{kind} ({node['format']})" if "format" in node else kind


def _bounds(node: dict[str, Any]) -> str:
    parts = [template.format(node[key]) for key, template in _BOUNDS if key in node]
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    if any(v.get("rule") == "self == oldSelf" for v in node.get("x-kubernetes-validations", [])):
        parts.append("immutable")
    return "; ".join(parts)


def _table(model: type[BaseModel], *, defaults: bool) -> list[str]:
    schema = crdgen.structural_schema(model, defaults=defaults)
    required = set(schema.get("required", ()))
    lines = [
        "| field | type | default | bounds | description |",
        "|---|---|---|---|---|",
    ]
    for name, info in model.model_fields.items():
        alias = info.alias or name
        node = schema["properties"][alias]
        nested = next(_models_in(info.annotation), None)
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        field = f"`{alias}`" + (" (required)" if alias in required else "")
        lines.append(
            "| "
            + " | ".join(
                _cell(part)
                for part in (
                    field,
                    _type_of(node, nested),
                    default,
                    _bounds(node),
                    node.get("description", ""),
                )
            )
            + " |"
        )
    return lines


def _resource_section(resource: crdgen.Resource, documented: set[type[BaseModel]]) -> list[str]:
    kind = resource.kind
    columns = ", ".join(c.name for c in resource.columns)
    lines = [
        f"## {kind.kind}",
        "",
        " ".join((resource.root.__doc__ or "").split()),
        "",
        f"`{kind.api_version}`, namespaced, short name `{', '.join(resource.short_names)}`, "
        f"status subresource; `kubectl get` columns: {columns}.",
        "",
    ]
    for root, defaults in ((resource.spec, True), (resource.status, False)):
        for model in _reachable(root):
            if model in documented:
                continue
            documented.add(model)
            doc = " ".join((model.__doc__ or "").split())
            lines += [f"### {model.__name__}", "", doc, "", *_table(model, defaults=defaults), ""]
    return lines


def _enum_section() -> list[str]:
    lines = [
        "## Enumerations",
        "",
        "The values this version writes. A status field holding one accepts any other string",
        "too (written by another version) and is not an `enum` in the CRD; see each field for",
        "how an unknown value is treated. Spec fields accept only the values listed with them.",
        "",
    ]
    for enum in _ENUMS:
        values = ", ".join(
            f"`{member.value}`" + (" (read, no longer written)" if member in _NOT_WRITTEN else "")
            for member in enum
        )
        lines += [f"- **{enum.__name__}**: {values}"]
    return [*lines, ""]


def render() -> str:
    """The whole reference page."""
    documented: set[type[BaseModel]] = set()
    lines = [
        "# API reference: agent-forge.containeroo.ch/v1alpha1",
        "",
        "<!-- Generated by `make manifests` from agentforge/api; do not edit by hand. -->",
        "",
        "Defaults are applied by the API server. Defaults that depend on other fields",
        "(`folder`, `namePrefix`, `pathPrefix`) are resolved by the operator and named",
        "in the description.",
        "",
    ]
    for resource in crdgen.RESOURCES:
        lines += _resource_section(resource, documented)
    lines += _enum_section()
    return "\n".join(lines).rstrip("\n") + "\n"
