"""Logs that tell: an actionable condition is logged when it starts and when it clears."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agentforge.api import kinds
from agentforge.api.conditions import ACTIONABLE, PoolReason, VsphereAgentReason
from agentforge.kube.condition_log import ConditionLog

POOL, VA = kinds.VSPHERE_AGENT_POOL, kinds.VSPHERE_AGENT


def obj(
    *conditions: tuple[str, str, str], uid: str = "u1", name: str = "workers"
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"{r} message"}
                for t, s, r in conditions
            ]
        },
    }


class Recorder:
    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.log = ConditionLog()
        self.state: dict[str, Any] = {}

    def write(self, kind: kinds.Kind, after: dict[str, Any]) -> None:
        key = after["metadata"]["uid"]
        self.log.observe(kind, self.state.get(key, {"metadata": after["metadata"]}), after)
        self.state[key] = after

    def lines(self) -> list[tuple[str, str, str, str]]:
        return [
            (r.levelname, getattr(r, "condition", ""), getattr(r, "reason", ""), r.getMessage())
            for r in self.caplog.records
            if r.name == "agentforge.kube.condition_log"
        ]


@pytest.fixture
def rec(caplog: pytest.LogCaptureFixture) -> Recorder:
    caplog.set_level(logging.INFO, logger="agentforge.kube.condition_log")
    return Recorder(caplog)


def test_a_wrong_password_is_one_warning_then_one_info_however_often_retried(
    rec: Recorder,
) -> None:
    rec.write(POOL, obj(("VsphereReady", "False", "LoginFailed")))
    for attempt in range(3):  # each retry names a new time: a new message, same reason
        after = obj(("VsphereReady", "False", "LoginFailed"))
        after["status"]["conditions"][0]["message"] = f"next attempt {attempt}"
        rec.write(POOL, after)
    rec.write(POOL, obj(("VsphereReady", "True", "VsphereConnected")))
    lines = rec.lines()
    assert [line[:3] for line in lines] == [
        ("WARNING", "VsphereReady", "LoginFailed"),
        ("INFO", "VsphereReady", "LoginFailed"),
    ]
    warning, info = lines[0][3], lines[1][3]
    assert warning.startswith(
        "VsphereAgentPool team-a/workers: VsphereReady is False (LoginFailed)"
    )
    assert "to fix: correct username or password in the credentials Secret" in warning
    assert info.startswith("VsphereAgentPool team-a/workers: VsphereReady cleared (LoginFailed)")
    assert "now True (VsphereConnected)" in info


def test_a_retry_passing_through_an_in_progress_reason_is_not_news(rec: Recorder) -> None:
    for _ in range(3):
        rec.write(VA, obj(("ISOEjected", "False", "EjectionInProgress")))
        rec.write(VA, obj(("ISOEjected", "False", "EjectionFailed")))
    rec.write(VA, obj(("ISOEjected", "True", "Ejected")))
    assert [line[:3] for line in rec.lines()] == [
        ("WARNING", "ISOEjected", "EjectionFailed"),
        ("INFO", "ISOEjected", "EjectionFailed"),
    ]


def test_another_actionable_reason_is_its_own_warning_and_both_clear_together(
    rec: Recorder,
) -> None:
    rec.write(POOL, obj(("VsphereReady", "False", "LoginFailed")))
    rec.write(POOL, obj(("VsphereReady", "False", "LoginDeferred")))
    rec.write(POOL, obj(("VsphereReady", "False", "LoginFailed")))
    rec.write(POOL, obj(("VsphereReady", "True", "VsphereConnected")))
    lines = rec.lines()
    assert [line[:3] for line in lines] == [
        ("WARNING", "VsphereReady", "LoginFailed"),
        ("WARNING", "VsphereReady", "LoginDeferred"),
        ("INFO", "VsphereReady", "LoginDeferred"),
    ]
    assert "cleared (LoginFailed, LoginDeferred)" in lines[2][3]


def test_ordinary_states_and_copies_in_ready_are_not_logged(rec: Recorder) -> None:
    rec.write(
        POOL,
        obj(
            ("Ready", "False", "LoginFailed"),  # Ready copies the blocker: logged there
            ("CapacitySatisfied", "False", "Provisioning"),
            ("ISOReady", "False", "WaitingForInfraEnv"),
        ),
    )
    rec.write(VA, obj(("Ready", "False", "VMCreating"), uid="u2"))
    assert rec.lines() == []


def test_a_condition_already_failing_before_a_restart_is_not_started_again(
    rec: Recorder,
) -> None:
    before = obj(("ISOReady", "False", "ISOCacheFailed"))
    after = obj(("ISOReady", "False", "ISOCacheFailed"))
    after["status"]["conditions"][0]["message"] = "a new message"
    rec.log.observe(POOL, before, after)  # a fresh process: no memory of the episode
    assert rec.lines() == []
    rec.log.observe(POOL, after, obj(("ISOReady", "True", "ISOCached")))
    assert [line[:3] for line in rec.lines()] == [("INFO", "ISOReady", "ISOCacheFailed")]


def test_objects_are_told_apart_by_uid(rec: Recorder) -> None:
    rec.write(VA, obj(("Ready", "False", "VMCreateFailed"), uid="a", name="one"))
    rec.write(VA, obj(("Ready", "False", "VMCreateFailed"), uid="b", name="two"))
    rec.write(VA, obj(("Ready", "True", "VMReady"), uid="a", name="one"))
    assert [(line[0], line[3].split(":")[0]) for line in rec.lines()] == [
        ("WARNING", "VsphereAgent team-a/one"),
        ("WARNING", "VsphereAgent team-a/two"),
        ("INFO", "VsphereAgent team-a/one"),
    ]


def test_memory_is_bounded() -> None:
    log = ConditionLog(max_tracked=2)
    for uid in "abc":
        log.observe(VA, {}, obj(("ISOEjected", "False", "EjectionFailed"), uid=uid))
    assert len(log._episodes) == 2


def test_every_actionable_reason_is_a_reason_of_its_condition() -> None:
    known = (
        {r.value for r in PoolReason} | {r.value for r in VsphereAgentReason} | {"EjectionFailed"}
    )
    assert {a.reason for a in ACTIONABLE} <= known
    assert all(a.fix and not a.fix.endswith(".") for a in ACTIONABLE)
