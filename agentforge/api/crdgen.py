"""CustomResourceDefinitions generated from the pydantic models (pure: data in, dicts out).

The API server accepts only *structural* schemas: every node typed, no `$ref`, no
`anyOf` for optional values, defaults only where pruning and defaulting can apply
them. Pydantic's JSON schema is close but not that, so `structural_schema` rewrites
it: references are inlined (the field's own description wins over the type's),
`X | None` becomes plain `X` (absent means None), titles go, and any keyword outside
the subset Kubernetes understands raises instead of producing a CRD the server
would refuse. Defaults are kept in `spec` (the server applies them, so stored
objects show effective values) and dropped in `status` (only the operator writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from agentforge.api import kinds
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
