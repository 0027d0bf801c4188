"""The generated CRDs are structural, valid CRD objects, and default what the models do.

The API server refuses a non-structural schema and silently prunes fields a schema
does not declare, so these properties are checked on the generated output itself.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from pydantic import BaseModel, Field

from agentforge.api import crdgen, kinds
from agentforge.api.pool import VsphereAgentPoolSpec
from agentforge.api.wire import to_wire
from tests.unit.api.support import MINIMAL_SPEC

RESOURCES = pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind.kind)
FORBIDDEN = {"$ref", "$defs", "anyOf", "allOf", "oneOf", "not", "title", "const"}


def openapi(resource: crdgen.Resource) -> dict[str, Any]:
    schema: dict[str, Any] = crdgen.render(resource)["spec"]["versions"][0]["schema"]
    return dict(schema["openAPIV3Schema"])


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


@RESOURCES
def test_every_schema_node_is_typed_and_uses_no_json_schema_composition(
    resource: crdgen.Resource,
) -> None:
    for path, node in nodes(openapi(resource)):
        assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        assert not FORBIDDEN & node.keys(), f"{path}: {FORBIDDEN & node.keys()}"
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        for required in node.get("required", []):
            assert required in node["properties"], f"{path}: required {required} is undeclared"


@RESOURCES
def test_status_carries_no_defaults(resource: crdgen.Resource) -> None:
    status = openapi(resource)["properties"]["status"]
    assert [path for path, node in nodes(status) if "default" in node] == []


@RESOURCES
def test_conditions_are_a_list_map_keyed_by_type(resource: crdgen.Resource) -> None:
    conditions = openapi(resource)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


@RESOURCES
def test_crd_objects_are_valid_apiextensions_v1(resource: crdgen.Resource) -> None:
    kubernetes_validate.validate(crdgen.render(resource), "1.36", strict=True)


@RESOURCES
def test_printer_columns_point_at_declared_fields(resource: crdgen.Resource) -> None:
    schema = openapi(resource)
    for column in resource.columns:
        path = column.json_path.split("[")[0].lstrip(".").split(".")
        if path[0] == "metadata":
            continue
        node = schema
        for name in path:
            node = node["properties"][name]
        assert node, column.name


def test_names_short_names_and_columns_match_the_go_operator() -> None:
    pool = crdgen.render(crdgen.POOL)["spec"]
    agent = crdgen.render(crdgen.VSPHERE_AGENT)["spec"]
    assert pool["group"] == agent["group"] == kinds.GROUP
    assert pool["names"]["shortNames"] == ["vap"]
    assert agent["names"]["shortNames"] == ["va"]
    columns = pool["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Waiting",
        "Desired",
        "Agents",
        "Ejected",
        "Age",
    ]
    # warm spares (not in the Go operator): `kubectl get -o wide` only
    assert [c["name"] for c in columns if c.get("priority")] == ["Spares", "Wanted"]
    assert [c["name"] for c in agent["versions"][0]["additionalPrinterColumns"]] == [
        "Pool",
        "VM",
        "Phase",
        "ISOEjected",
        "Age",
    ]
    for spec in (pool, agent):
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
        assert spec["scope"] == "Namespaced"


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's structural defaulting does to `value`."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        return value
    result = dict(value)
    for name, sub in schema.get("properties", {}).items():
        if name not in result and "default" in sub:
            result[name] = copy.deepcopy(sub["default"])
        if name in result:
            result[name] = apply_defaults(sub, result[name])
    return result


def without_empty_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_empty_lists(v) for k, v in value.items() if v != []}
    return value


def test_api_server_defaults_equal_the_model_defaults() -> None:
    spec_schema = openapi(crdgen.POOL)["properties"]["spec"]
    defaulted_by_server = apply_defaults(spec_schema, copy.deepcopy(MINIMAL_SPEC))
    defaulted_by_model = to_wire(VsphereAgentPoolSpec.model_validate(MINIMAL_SPEC))
    assert defaulted_by_server == without_empty_lists(defaulted_by_model)


def test_fields_with_derived_defaults_have_no_schema_default() -> None:
    spec = openapi(crdgen.POOL)["properties"]["spec"]["properties"]
    assert "default" not in spec["vsphere"]["properties"]["folder"]
    assert "default" not in spec["template"]["properties"]["namePrefix"]
    assert "default" not in spec["iso"]["properties"]["pathPrefix"]


def test_immutable_references_carry_a_transition_rule() -> None:
    spec = openapi(crdgen.POOL)["properties"]["spec"]["properties"]
    for field in ("hostedClusterRef", "nodePoolRef", "infraEnvRef", "controlPlaneNamespace"):
        assert spec[field]["x-kubernetes-validations"] == [
            {"rule": "self == oldSelf", "message": f"{field} is immutable"}
        ]


def test_a_union_of_two_types_is_refused() -> None:
    class Union(BaseModel):
        value: int | str

    with pytest.raises(crdgen.SchemaError, match="unions"):
        crdgen.structural_schema(Union)


def test_an_exclusive_bound_is_refused() -> None:
    class Exclusive(BaseModel):
        value: int = Field(gt=0)

    with pytest.raises(crdgen.SchemaError, match="exclusiveMinimum"):
        crdgen.structural_schema(Exclusive)


def test_an_untyped_field_is_refused() -> None:
    class Untyped(BaseModel):
        value: Any

    with pytest.raises(crdgen.SchemaError, match="type"):
        crdgen.structural_schema(Untyped)
