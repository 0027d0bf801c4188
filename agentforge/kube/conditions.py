"""Kubernetes-style conditions in a status dict (`metav1.Condition` semantics).

Promises:

* One condition per `type` in `status["conditions"]`; order of others is kept.
* `lastTransitionTime` changes only when the condition's `status` changes, so it
  says since when something has been true, not when we last looked.
* `set_condition` returns whether anything changed, so a reconciler can skip the
  status write when nothing did (the write-only-if-changed rule).
* Messages pass `agentforge.redaction.redact` (as log lines and Events do): a
  credential that reached a message, such as an API key in a URL, never reaches
  status; ordinary text is left as it is, so a message is compared and written
  exactly as the reconciler built it.
* Pure: the caller passes `now`; no clock is read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from agentforge import redaction

__all__ = [
    "ConditionStatus",
    "format_time",
    "get_condition",
    "is_true",
    "remove_condition",
    "set_condition",
]


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def format_time(moment: datetime) -> str:
    """RFC 3339 with seconds precision in UTC, as the API server writes metav1.Time."""
    if moment.tzinfo is None:
        raise ValueError("condition times must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(status: Mapping[str, Any] | None, /, *, type: str) -> dict[str, Any] | None:
    """The condition of `type`, or None."""
    for condition in (status or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == type:
            return condition
    return None


def is_true(status: Mapping[str, Any] | None, /, *, type: str) -> bool:
    condition = get_condition(status, type=type)
    return condition is not None and condition.get("status") == ConditionStatus.TRUE


def set_condition(
    status: dict[str, Any],
    /,
    *,
    type: str,
    value: ConditionStatus | str,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> bool:
    """Create or update the condition of `type` in `status`; True when it changed."""
    conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
    desired: dict[str, Any] = {
        "type": type,
        "status": str(value),
        "reason": reason,
        "message": redaction.redact(message),
    }
    if observed_generation is not None:
        desired["observedGeneration"] = observed_generation
    current = get_condition(status, type=type)
    if current is None:
        desired["lastTransitionTime"] = format_time(now)
        conditions.append(desired)
        return True
    if current.get("status") != desired["status"] or "lastTransitionTime" not in current:
        desired["lastTransitionTime"] = format_time(now)
    else:
        desired["lastTransitionTime"] = current["lastTransitionTime"]
    if observed_generation is None and "observedGeneration" in current:
        desired["observedGeneration"] = current["observedGeneration"]
    if desired == current:
        return False
    current.clear()
    current.update(desired)
    return True


def remove_condition(status: dict[str, Any], /, *, type: str) -> bool:
    """Drop the condition of `type`; True when there was one."""
    conditions = status.get("conditions") or []
    kept = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == type)]
    if len(kept) == len(conditions):
        return False
    status["conditions"] = kept
    return True
