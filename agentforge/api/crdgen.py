"""CustomResourceDefinitions generated from the pydantic models (pure: data in, dicts out).

The API server accepts only *structural* schemas: every node typed, no `$ref`, no
`anyOf` for optional values, defaults only where pruning and defaulting can apply
them. Pydantic's JSON schema is close but not that, so `structural_schema` rewrites
it: references are inlined (the field's own description wins over the type's),
`X | None` becomes plain `X` (absent means None), titles go, and any keyword outside
the subset Kubernetes understands raises instead of producing a CRD the server
would refuse. Defaults are kept in `spec` (the server applies them, so stored
objects show effective values) and dropped in `status` (only the operator writes it).

`render_reference` writes `docs/reference/api.md` from the same structural schemas, so
a type, default or bound in the docs is the one the API server enforces.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel

from agentforge.api import conditions, kinds, pool, vm, vsphereagent
from agentforge.api.pool import VsphereAgentPool, VsphereAgentPoolSpec, VsphereAgentPoolStatus
from agentforge.api.vsphereagent import VsphereAgent, VsphereAgentSpec, VsphereAgentStatus

Schema = dict[str, Any]

_ALLOWED_KEYS: Final = frozenset(
    {
        "type",
        "format",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "default",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "nullable",
    }
)
_UNTYPED_OK: Final = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")
_NULL: Final = {"type": "null"}

_API_VERSION_DOC: Final = (
    "APIVersion defines the versioned schema of this representation of an object."
)
_KIND_DOC: Final = "Kind is a string value representing the REST resource this object represents."


class SchemaError(ValueError):
    """A model uses a construct that has no structural-schema equivalent."""


def structural_schema(model: type[BaseModel], *, defaults: bool = True) -> Schema:
    """The structural OpenAPI v3 schema of `model`'s wire form."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    return _clean(raw, definitions, defaults=defaults, path=model.__name__)


def _resolve(node: Schema, definitions: dict[str, Schema], path: str) -> Schema:
    """`node` with a `$ref`/single `allOf`/optional `anyOf` replaced by its target."""
    node = dict(node)
    if "allOf" in node:
        (only,) = node.pop("allOf")
        node = {**only, **node}
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b != _NULL]
        if len(branches) != 1:
            raise SchemaError(f"{path}: unions other than `X | None` are not structural")
        node = {**branches[0], **node}
        if node.get("default", 0) is None:
            del node["default"]
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        node = {**_resolve(definitions[name], definitions, path), **node}
    return node


def _clean(node: Schema, definitions: dict[str, Schema], *, defaults: bool, path: str) -> Schema:
    node = _resolve(node, definitions, path)
    out: Schema = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "default" and (not defaults or value is None):
            continue
        if key == "properties":
            out[key] = {
                name: _clean(sub, definitions, defaults=defaults, path=f"{path}.{name}")
                for name, sub in value.items()
            }
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = _clean(value, definitions, defaults=defaults, path=f"{path}[]")
        elif key == "required":
            out[key] = sorted(value)
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key in _ALLOWED_KEYS or key.startswith("x-kubernetes-"):
            out[key] = value
        else:
            raise SchemaError(f"{path}: JSON schema keyword {key!r} is not supported in a CRD")
    if "type" not in out and not any(out.get(k) for k in _UNTYPED_OK):
        raise SchemaError(f"{path}: every node of a structural schema needs a type")
    return out


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0

    def render(self) -> Schema:
        column: Schema = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


AGE: Final = PrinterColumn("Age", "date", ".metadata.creationTimestamp")


@dataclass(frozen=True, slots=True)
class Resource:
    """Everything that turns a pair of models into one CRD."""

    kind: kinds.Kind
    root: type[BaseModel]
    spec: type[BaseModel]
    status: type[BaseModel]
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    categories: tuple[str, ...] = ("agent-forge",)

    @property
    def singular(self) -> str:
        return self.kind.kind.lower()

    @property
    def name(self) -> str:
        return f"{self.kind.plural}.{self.kind.group}"

    @property
    def filename(self) -> str:
        return f"{self.kind.group}_{self.kind.plural}.yaml"


def root_schema(resource: Resource) -> Schema:
    """The openAPIV3Schema of the whole object."""
    return {
        "type": "object",
        "description": _doc(resource.root),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION_DOC},
            "kind": {"type": "string", "description": _KIND_DOC},
            "metadata": {"type": "object"},
            "spec": structural_schema(resource.spec),
            "status": structural_schema(resource.status, defaults=False),
        },
    }


def render(resource: Resource) -> Schema:
    """The CustomResourceDefinition of `resource`."""
    kind = resource.kind
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": resource.name},
        "spec": {
            "group": kind.group,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": resource.singular,
                "shortNames": list(resource.short_names),
                "categories": list(resource.categories),
            },
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "versions": [
                {
                    "name": kind.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root_schema(resource)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.render() for c in resource.columns],
                }
            ],
        },
    }


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


POOL: Final = Resource(
    kind=kinds.VSPHERE_AGENT_POOL,
    root=VsphereAgentPool,
    spec=VsphereAgentPoolSpec,
    status=VsphereAgentPoolStatus,
    short_names=("vap",),
    columns=(
        PrinterColumn("Waiting", "integer", ".status.waitingAgentMachines"),
        PrinterColumn("Desired", "integer", ".status.desiredReplicas"),
        PrinterColumn("Agents", "integer", ".status.matchingAgents"),
        PrinterColumn(
            "Ejected",
            "integer",
            ".status.isoEjections.ejected",
            description="VsphereAgents whose discovery ISO was ejected after installation",
        ),
        # warm spares: `-o wide` only, so the default columns stay the Go operator's
        PrinterColumn(
            "Spares",
            "integer",
            ".status.spares.ready",
            description="Warm spares ready to be handed to a waiting AgentMachine",
            priority=1,
        ),
        PrinterColumn(
            "Wanted",
            "integer",
            ".spec.spares",
            description="Warm spares the pool keeps (spec.spares)",
            priority=1,
        ),
        AGE,
    ),
)

VSPHERE_AGENT: Final = Resource(
    kind=kinds.VSPHERE_AGENT,
    root=VsphereAgent,
    spec=VsphereAgentSpec,
    status=VsphereAgentStatus,
    short_names=("va",),
    columns=(
        PrinterColumn("Pool", "string", ".spec.poolRef.name"),
        PrinterColumn("VM", "string", ".status.vm.name"),
        PrinterColumn("Phase", "string", ".status.vm.phase"),
        PrinterColumn(
            "ISOEjected",
            "string",
            '.status.conditions[?(@.type=="ISOEjected")].reason',
            description="Reason of the ISOEjected condition",
        ),
        AGE,
    ),
)

RESOURCES: Final = (POOL, VSPHERE_AGENT)


def render_all() -> dict[str, Schema]:
    """Every CRD by its file name under `config/crd/`."""
    return {resource.filename: render(resource) for resource in RESOURCES}


# --- docs/reference/api.md ------------------------------------------------------

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
    schema = structural_schema(model, defaults=defaults)
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


def _resource_section(resource: Resource, documented: set[type[BaseModel]]) -> list[str]:
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


def render_reference() -> str:
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
    for resource in RESOURCES:
        lines += _resource_section(resource, documented)
    lines += _enum_section()
    return "\n".join(lines).rstrip("\n") + "\n"
