"""Conditions follow client-go's SetStatusCondition: the transition time moves only
when the status does, and the reasons the seed names exist as enum values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from agentforge.api.conditions import (
    Condition,
    ConditionStatus,
    ISOEjectedReason,
    PoolConditionType,
    find_condition,
    remove_condition,
    set_condition,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_new_condition_is_appended_with_now_as_transition_time() -> None:
    conditions = set_condition(
        [], type_="Ready", status=ConditionStatus.TRUE, reason="Reconciled", now=T0
    )
    assert [(c.type, c.last_transition_time) for c in conditions] == [("Ready", T0)]


def test_same_status_keeps_the_transition_time_but_updates_reason_and_message() -> None:
    first = set_condition(
        [], type_="Ready", status=ConditionStatus.FALSE, reason="A", message="one", now=T0
    )
    second = set_condition(
        first, type_="Ready", status=ConditionStatus.FALSE, reason="B", message="two", now=T1
    )
    (ready,) = second
    assert (ready.reason, ready.message, ready.last_transition_time) == ("B", "two", T0)


def test_a_status_change_moves_the_transition_time() -> None:
    first = set_condition([], type_="Ready", status=ConditionStatus.FALSE, reason="A", now=T0)
    second = set_condition(first, type_="Ready", status=ConditionStatus.TRUE, reason="A", now=T1)
    assert second[0].last_transition_time == T1


def test_setting_one_condition_keeps_the_others_in_order() -> None:
    conditions = set_condition([], type_="A", status=ConditionStatus.TRUE, reason="R", now=T0)
    conditions = set_condition(
        conditions, type_="B", status=ConditionStatus.TRUE, reason="R", now=T0
    )
    conditions = set_condition(
        conditions, type_="A", status=ConditionStatus.FALSE, reason="R", now=T1
    )
    assert [c.type for c in conditions] == ["A", "B"]
    assert find_condition(conditions, "B") is not None
    assert [c.type for c in remove_condition(conditions, "A")] == ["B"]


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
