"""Conditions follow client-go's SetStatusCondition: one per type, the transition time
moves only when the status does; typed lists are read by type; and the reasons the
seed names exist as enum values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from agentforge.api import conditions
from agentforge.api.conditions import (
    Condition,
    ConditionStatus,
    ISOEjectedReason,
    PoolConditionType,
    condition_true,
    find_condition,
)
from agentforge.api.views import StatusCondition

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_setting_a_new_condition_stamps_its_transition_time() -> None:
    status: dict[str, Any] = {}
    changed = conditions.set_condition(
        status,
        type="Ready",
        value=ConditionStatus.TRUE,
        reason="Ok",
        message="m",
        now=T0,
        observed_generation=3,
    )
    assert changed
    assert status["conditions"] == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Ok",
            "message": "m",
            "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]


def test_same_status_keeps_transition_time_but_updates_reason_and_message() -> None:
    status: dict[str, Any] = {}
    conditions.set_condition(status, type="Ready", value="False", reason="A", message="a", now=T0)
    later = T0 + timedelta(hours=1)
    assert conditions.set_condition(
        status, type="Ready", value="False", reason="B", message="b", now=later
    )
    condition = conditions.get_condition(status, type="Ready")
    assert condition is not None
    assert condition["reason"] == "B"
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_status_change_moves_transition_time() -> None:
    status: dict[str, Any] = {}
    conditions.set_condition(status, type="Ready", value="False", reason="A", message="", now=T0)
    later = T0 + timedelta(minutes=5)
    conditions.set_condition(status, type="Ready", value="True", reason="A", message="", now=later)
    assert conditions.get_condition(status, type="Ready")["lastTransitionTime"] == (  # type: ignore[index]
        "2026-01-01T00:05:00Z"
    )
    assert conditions.get_condition(status, type="Ready")["status"] == "True"  # type: ignore[index]


def test_setting_an_identical_condition_reports_no_change() -> None:
    status: dict[str, Any] = {}
    conditions.set_condition(status, type="Ready", value="True", reason="A", message="m", now=T0)
    again = conditions.set_condition(
        status, type="Ready", value="True", reason="A", message="m", now=T0 + timedelta(days=1)
    )
    assert not again
    assert len(status["conditions"]) == 1


def test_conditions_of_other_types_are_kept_in_order() -> None:
    status: dict[str, Any] = {}
    for name in ("A", "B", "C"):
        conditions.set_condition(status, type=name, value="True", reason="R", message="", now=T0)
    conditions.set_condition(status, type="B", value="False", reason="R", message="", now=T0)
    assert [c["type"] for c in status["conditions"]] == ["A", "B", "C"]


def test_missing_status_reads_as_no_condition() -> None:
    assert conditions.get_condition(None, type="Ready") is None
    assert conditions.get_condition({}, type="Ready") is None


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        conditions.format_time(datetime(2026, 1, 1))


def test_typed_conditions_are_found_by_type() -> None:
    ready = StatusCondition(type="Ready", status="True", reason="Ok")
    installed = StatusCondition(type="Installed", status="False")
    assert find_condition([ready, installed], "Installed") is installed
    assert find_condition([ready], "Installed") is None
    assert condition_true([ready, installed], "Ready")
    assert not condition_true([ready, installed], "Installed")
    assert not condition_true([], "Ready")


@pytest.mark.parametrize(
    "fields",
    [
        {"reason": ""},
        {"reason": "has space"},
        {"type": "has space"},
        {"status": "Maybe"},
    ],
)
def test_conditions_refuse_what_metav1_condition_refuses(fields: dict[str, str]) -> None:
    base = {"type": "Ready", "status": "True", "reason": "Ok", "lastTransitionTime": T0}
    with pytest.raises(ValidationError):
        Condition.model_validate(base | fields)


def test_the_seed_iso_ejected_reasons_and_pool_condition_types_exist() -> None:
    assert {r.value for r in ISOEjectedReason} == {
        "Disabled",
        "WaitingForInstallation",
        "EjectionInProgress",
        "Ejected",
        "EjectionFailed",
        "NoOwnedMedia",  # ours: nothing of the pool's was attached (not counted as ejected)
    }
    assert {t.value for t in PoolConditionType} == {
        "Ready",
        "AgentMachineDemandFound",
        "InfraEnvAvailable",
        "CapacitySatisfied",
        "VsphereReady",
        "ISOReady",
    }
