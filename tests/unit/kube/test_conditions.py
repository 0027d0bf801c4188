"""Condition rules: one per type, transition time only moves when status changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentforge.kube import conditions
from agentforge.kube.conditions import ConditionStatus

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
    assert conditions.is_true(status, type="Ready")


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
    assert conditions.remove_condition(status, type="B")
    assert not conditions.remove_condition(status, type="B")
    assert [c["type"] for c in status["conditions"]] == ["A", "C"]


def test_missing_status_reads_as_no_condition() -> None:
    assert conditions.get_condition(None, type="Ready") is None
    assert not conditions.is_true({}, type="Ready")


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        conditions.format_time(datetime(2026, 1, 1))
