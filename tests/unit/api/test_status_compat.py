"""Status written by another version always parses; spec enumerations stay closed.

docs/design/0003: every enumeration in status is open (`fields.OpenEnum`): a known
value parses to its member, any other string is kept as written, and the CRD has no
`enum` there, so the API server accepts every version's status writes. The one
exception is metav1.Condition's `status` (True/False/Unknown), whose schema is the
same in every version's CRD.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentforge.api import crdgen, wire
from agentforge.api.conditions import Condition, ConditionStatus
from agentforge.api.fields import known
from agentforge.api.pool import (
    CleanupPolicy,
    Firmware,
    PlannedActionType,
    VsphereAgentPool,
    VsphereAgentPoolStatus,
)
from agentforge.api.vm import VMPhase, VMSource
from agentforge.api.vsphereagent import (
    CreationPhase,
    ISOEjectionPhase,
    ISOEjectionRecord,
    VsphereAgent,
    VsphereAgentStatus,
)
from tests.unit.api.support import MINIMAL_SPEC, crd_validator, pool_object

UUID = "4210a5e1-0000-4000-8000-000000000001"
OWNERSHIP = {"poolNamespace": "demo", "poolName": "p", "poolUID": "u", "vsphereAgent": "va"}
STARTED = "2026-03-01T12:00:00Z"


def creation(**fields: Any) -> dict[str, Any]:
    return {
        "vmName": "vm-1",
        "biosUUID": UUID,
        "ownership": OWNERSHIP,
        "datacenter": "dc1",
        "folder": "demo",
        "startedAt": STARTED,
        **fields,
    }


def ejection(**fields: Any) -> dict[str, Any]:
    return {
        "vmName": "vm-1",
        "biosUUID": UUID,
        "ownership": OWNERSHIP,
        "datacenter": "dc1",
        "deviceKey": 3000,
        "isoPath": "[iso-ds] agent-forge/demo/p/abc.iso",
        "startedAt": STARTED,
        **fields,
    }


def vsphere_agent(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgent",
        "metadata": {"name": "va", "namespace": "demo"},
        "spec": {"poolRef": {"name": "p"}},
        "status": status,
    }


def pool(status: dict[str, Any]) -> dict[str, Any]:
    return {**pool_object(MINIMAL_SPEC), "status": status}


# Every status enumeration: (object with an unknown value there, path to the value).
UNKNOWN = "FromANewerVersion"
CASES: dict[str, tuple[type[BaseModel], dict[str, Any], tuple[str | int, ...]]] = {
    "VsphereAgent status.vm.phase": (
        VsphereAgent,
        vsphere_agent({"vm": {"name": "vm-1", "phase": UNKNOWN}}),
        ("vm", "phase"),
    ),
    "VsphereAgent status.vm.source": (
        VsphereAgent,
        vsphere_agent({"vm": {"name": "vm-1", "source": UNKNOWN}}),
        ("vm", "source"),
    ),
    "VsphereAgent status.creation.phase": (
        VsphereAgent,
        vsphere_agent({"creation": creation(phase=UNKNOWN)}),
        ("creation", "phase"),
    ),
    "VsphereAgent status.isoEjection.phase": (
        VsphereAgent,
        vsphere_agent({"isoEjection": ejection(phase=UNKNOWN, disconnectStarted=True)}),
        ("isoEjection", "phase"),
    ),
    "VsphereAgentPool status.ownedVMs[].phase": (
        VsphereAgentPool,
        pool({"ownedVMs": [{"name": "vm-1", "phase": UNKNOWN}]}),
        ("ownedVMs", 0, "phase"),
    ),
    "VsphereAgentPool status.ownedVMs[].source": (
        VsphereAgentPool,
        pool({"ownedVMs": [{"name": "vm-1", "source": UNKNOWN}]}),
        ("ownedVMs", 0, "source"),
    ),
    "VsphereAgentPool status.plannedActions[].type": (
        VsphereAgentPool,
        pool({"plannedActions": [{"type": "CreateVM", "reason": "older Go release"}]}),
        ("plannedActions", 0, "type"),
    ),
}


def _at(obj: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        obj = obj[step]
    return obj


@pytest.mark.parametrize("case", CASES, ids=str)
def test_an_unknown_status_enum_value_parses_and_is_written_back_unchanged(case: str) -> None:
    model, obj, path = CASES[case]
    parsed = model.model_validate(obj)
    wanted = _at(obj["status"], path)
    assert _at(wire.to_wire(parsed)["status"], path) == wanted


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_api_server_accepts_an_unknown_status_enum_value(case: str) -> None:
    model, obj, _ = CASES[case]
    resource = crdgen.POOL if model is VsphereAgentPool else crdgen.VSPHERE_AGENT
    errors = [e.message for e in crd_validator(resource).iter_errors(obj)]
    assert errors == []


def test_known_status_values_parse_to_their_enum_members() -> None:
    agent = VsphereAgent.model_validate(
        vsphere_agent(
            {
                "vm": {"name": "vm-1", "phase": "Released", "source": "VsphereAgent"},
                "creation": creation(phase="CreateIssued"),
                "isoEjection": ejection(phase="QuestionRecorded", questionID="_vmx1"),
            }
        )
    )
    assert agent.status.vm is not None
    assert agent.status.vm.phase is VMPhase.RELEASED
    assert agent.status.vm.source is VMSource.VSPHERE_AGENT
    assert agent.status.creation is not None
    assert agent.status.creation.phase is CreationPhase.CREATE_ISSUED
    assert agent.status.iso_ejection is not None
    assert agent.status.iso_ejection.phase is ISOEjectionPhase.QUESTION_RECORDED
    parsed = VsphereAgentPool.model_validate(
        pool({"plannedActions": [{"type": "DeleteVM", "name": "vm-1", "reason": "surplus"}]})
    )
    assert parsed.status.planned_actions[0].type is PlannedActionType.DELETE_VM


def test_known_names_a_member_and_nothing_else() -> None:
    assert known(VMPhase, "Bound") is VMPhase.BOUND
    assert known(VMPhase, VMPhase.BOUND) is VMPhase.BOUND
    assert known(VMPhase, UNKNOWN) is None
    assert known(VMPhase, None) is None
    assert known(VMPhase, 3) is None


def test_a_non_string_status_value_is_still_rejected() -> None:
    with pytest.raises(ValidationError):
        VsphereAgent.model_validate(vsphere_agent({"vm": {"name": "vm-1", "phase": 3}}))


# --- ISO ejection records of another version ---------------------------------------------


@pytest.mark.parametrize("flag", [True, False])
def test_an_unknown_ejection_phase_keeps_disconnect_started_as_written(flag: bool) -> None:
    record = ISOEjectionRecord.model_validate(ejection(phase=UNKNOWN, disconnectStarted=flag))
    assert record.known_phase is None
    assert wire.to_wire(record)["disconnectStarted"] is flag


def test_a_known_ejection_phase_still_derives_disconnect_started() -> None:
    record = ISOEjectionRecord.model_validate(
        ejection(phase="DisconnectIssued", disconnectStarted=False)
    )
    assert record.known_phase is ISOEjectionPhase.DISCONNECT_ISSUED
    assert wire.to_wire(record)["disconnectStarted"] is True


def test_an_ejection_in_an_unknown_phase_cannot_be_advanced() -> None:
    record = ISOEjectionRecord.model_validate(ejection(phase=UNKNOWN))
    with pytest.raises(ValueError, match="unknown phase"):
        record.advanced(ISOEjectionPhase.DISCONNECT_ISSUED)


# --- spec stays strict ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [("vsphere", "firmware", "uefi"), (None, "cleanupPolicy", "Keep")],
)
def test_an_unknown_spec_enum_value_is_rejected_by_model_and_crd(
    section: str | None, field: str, value: str
) -> None:
    spec = {**MINIMAL_SPEC}
    if section is None:
        spec[field] = value
    else:
        spec[section] = {**spec[section], field: value}
    obj = pool_object(spec)
    with pytest.raises(ValidationError) as caught:
        VsphereAgentPool.model_validate(obj)
    assert caught.value.errors()[0]["loc"][-1] == field
    assert any(value in e.message for e in crd_validator(crdgen.POOL).iter_errors(obj))


def test_spec_enums_keep_their_enum_in_the_crd() -> None:
    spec = crdgen.structural_schema(crdgen.POOL.spec)
    assert spec["properties"]["cleanupPolicy"]["enum"] == [p.value for p in CleanupPolicy]
    firmware = spec["properties"]["vsphere"]["properties"]["firmware"]
    assert firmware["enum"] == [f.value for f in Firmware]


# --- the rule, for every status field now and later -----------------------------------------


def _enum_paths(node: Any, path: str) -> Iterator[str]:
    if isinstance(node, dict):
        if "enum" in node:
            yield path
        for key, value in node.items():
            if key == "properties":
                for name, sub in value.items():
                    yield from _enum_paths(sub, f"{path}.{name}")
            elif key == "items":
                yield from _enum_paths(value, f"{path}[]")


@pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind.kind)
def test_the_only_enum_in_a_status_schema_is_the_condition_status(
    resource: crdgen.Resource,
) -> None:
    schema = crdgen.root_schema(resource)["properties"]["status"]
    assert list(_enum_paths(schema, "status")) == ["status.conditions[].status"]


def _annotation_args(annotation: Any) -> Iterator[Any]:
    yield annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        for arg in typing.get_args(annotation):
            yield from _annotation_args(arg)


def _closed_enum_fields(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[str]:
    """Fields of `model` (and the models it nests) typed with an enum but not with `str`."""
    if model in seen:
        return
    seen.add(model)
    for name, info in model.model_fields.items():
        args = list(_annotation_args(info.annotation))
        enums = [a for a in args if isinstance(a, type) and issubclass(a, StrEnum)]
        if enums and str not in args:
            yield f"{model.__name__}.{name}"
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _closed_enum_fields(arg, seen)


@pytest.mark.parametrize("status", [VsphereAgentPoolStatus, VsphereAgentStatus])
def test_every_status_enum_field_is_open(status: type[BaseModel]) -> None:
    # Condition.status is metav1's True/False/Unknown: enforced by every version's CRD.
    assert list(_closed_enum_fields(status, set())) == [f"{Condition.__name__}.status"]
    assert Condition.model_fields["status"].annotation is ConditionStatus
