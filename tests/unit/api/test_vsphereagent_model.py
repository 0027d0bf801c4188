"""VsphereAgent: the creation and ISO-ejection checkpoints resume safely after a crash."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from agentforge.api import crdgen
from agentforge.api.vm import OwnedVM
from agentforge.api.vsphereagent import (
    CreationPhase,
    CreationRecord,
    ISOEjectionPhase,
    ISOEjectionRecord,
    Ownership,
    VsphereAgent,
)
from agentforge.api.wire import to_wire
from tests.unit.api.support import crd_validator

UUID = "423297c6-d72e-28bb-b279-1209c29ab72b"
NOW = datetime(2026, 3, 2, 11, 0, tzinfo=UTC)
OWNERSHIP = Ownership(
    pool_namespace="demo", pool_name="demo-worker", pool_uid="6f1c", vsphere_agent="w-1"
)


def record(**overrides: Any) -> ISOEjectionRecord:
    fields: dict[str, Any] = {
        "vm_name": "w-1",
        "bios_uuid": UUID,
        "ownership": OWNERSHIP,
        "datacenter": "dc1",
        "device_key": 3000,
        "iso_path": "[iso-ds] agent-forge/demo/demo-worker/abc.iso",
        "started_at": NOW,
    }
    return ISOEjectionRecord(**(fields | overrides))


def agent_with(**status: Any) -> VsphereAgent:
    return VsphereAgent.model_validate(
        {
            "metadata": {"name": "w-1", "namespace": "demo"},
            "spec": {"poolRef": {"name": "demo-worker"}},
            "status": status,
        }
    )


def test_a_new_ejection_record_starts_recorded_without_a_started_disconnect() -> None:
    fresh = record()
    assert fresh.phase is ISOEjectionPhase.RECORDED
    assert to_wire(fresh)["disconnectStarted"] is False


@pytest.mark.parametrize(
    ("go_fields", "phase"),
    [
        ({}, ISOEjectionPhase.RECORDED),
        ({"disconnectStarted": True}, ISOEjectionPhase.DISCONNECT_ISSUED),
        ({"disconnectStarted": True, "questionID": "_vmx1"}, ISOEjectionPhase.QUESTION_RECORDED),
    ],
)
def test_a_go_record_without_phase_gets_the_phase_its_flags_imply(
    go_fields: dict[str, Any], phase: ISOEjectionPhase
) -> None:
    wire = {k: v for k, v in to_wire(record()).items() if k not in ("phase", "disconnectStarted")}
    assert ISOEjectionRecord.model_validate(wire | go_fields).phase is phase


def test_advancing_records_the_question_and_keeps_the_go_flag_consistent() -> None:
    issued = record().advanced(ISOEjectionPhase.DISCONNECT_ISSUED, task_ref="task-12")
    asked = issued.advanced(ISOEjectionPhase.QUESTION_RECORDED, question_id="_vmx1")
    wire = to_wire(asked)
    assert wire["phase"] == "QuestionRecorded"
    assert wire["questionID"] == "_vmx1"
    assert wire["taskRef"] == "task-12"
    assert wire["disconnectStarted"] is True


def test_an_ejection_never_moves_backwards() -> None:
    asked = record().advanced(ISOEjectionPhase.QUESTION_RECORDED, question_id="_vmx1")
    with pytest.raises(ValueError, match="back"):
        asked.advanced(ISOEjectionPhase.DISCONNECT_ISSUED)


def test_question_recorded_requires_the_question_id() -> None:
    with pytest.raises(ValueError, match="question id"):
        record().advanced(ISOEjectionPhase.QUESTION_RECORDED)


def test_the_go_flag_follows_phase_even_when_phase_is_assigned_directly() -> None:
    changed = record()
    changed.phase = ISOEjectionPhase.ANSWERED
    assert to_wire(changed)["disconnectStarted"] is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("iso_path", "agent-forge/demo/abc.iso"),
        ("iso_path", "[iso-ds]"),
        ("bios_uuid", "VMware-42 32 97 c6"),
        ("bios_uuid", UUID.upper()),
        ("device_key", -1),
        ("datacenter", ""),
    ],
)
def test_an_ejection_record_refuses_malformed_identities(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        record(**{field: value})


def test_a_creation_record_round_trips_through_status() -> None:
    creation = CreationRecord(
        vm_name="w-1",
        bios_uuid=UUID,
        ownership=OWNERSHIP,
        datacenter="dc1",
        folder="demo",
        iso_path="[iso-ds] agent-forge/demo/demo-worker/abc.iso",
        started_at=NOW,
    )
    agent = agent_with(vm={"name": "w-1"})
    agent.status.creation = creation.model_copy(update={"phase": CreationPhase.CREATE_ISSUED})
    reparsed = VsphereAgent.model_validate(to_wire(agent))
    assert reparsed.status.creation is not None
    assert reparsed.status.creation.phase is CreationPhase.CREATE_ISSUED
    assert reparsed.status.creation.bios_uuid == UUID
    assert reparsed.vm_name == "w-1"


def test_status_with_every_record_is_valid_against_the_crd() -> None:
    agent = agent_with(vm={"name": "w-1", "biosUUID": UUID, "phase": "Bound"})
    agent.status.iso_ejection = record().advanced(
        ISOEjectionPhase.QUESTION_RECORDED, question_id="_vmx1"
    )
    agent.status.creation = CreationRecord(
        vm_name="w-1",
        bios_uuid=UUID,
        ownership=OWNERSHIP,
        datacenter="dc1",
        folder="demo",
        started_at=NOW,
    )
    errors = [e.message for e in crd_validator(crdgen.VSPHERE_AGENT).iter_errors(to_wire(agent))]
    assert errors == []


def test_a_go_vm_record_with_an_empty_name_still_parses() -> None:
    assert agent_with(vm={"name": ""}).vm_name is None
    assert agent_with().vm_name is None


def test_owned_vm_stores_macs_with_hyphens_and_compares_with_colons() -> None:
    vm = OwnedVM(name="w-1", mac_address="00:50:56:AA:BB:CC", bios_uuid=UUID.upper())
    assert vm.mac_address == "00-50-56-aa-bb-cc"
    assert vm.mac == "00:50:56:aa:bb:cc"
    assert vm.bios_uuid == UUID
