"""When a pool's `Planned` event is due, and what it says.

`Planned` reports the plan's actions other than Agent preparations (those are
`AgentsPrepared`, once, when applied), by type and object, and only when that list
changed: a `DemandDeficit` whose numbers moved is the same plan, and repeating it
would only bump the event's count. The list last reported is remembered per pool,
because the status write that records `plannedActions` may be paced
(`status_pacing`) and the cached status then still shows the one before; after a
restart the cached status is the reference. A plan of a nameless `Noop` alone
(nothing to do) is remembered but not reported.

Pure bookkeeping: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentforge.api.pool import PlannedActionType
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planner import Action

__all__ = ["PlannedReports", "summary"]


def summary(items: Sequence[str], limit: int = 10) -> str:
    """The first `limit` items, then how many more."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _part(type_: str, name: object) -> str:
    return f"{type_}/{name}" if name else type_


class PlannedReports:
    """The `Planned` list last reported per pool (one instance per controller)."""

    def __init__(self) -> None:
        self._reported: dict[ObjectKey, list[str]] = {}

    def message(
        self, key: ObjectKey, actions: Sequence[Action], status: Mapping[str, Any] | None
    ) -> str | None:
        """The `Planned` event's message when one is due for this plan, else None."""
        reported = [a for a in actions if a.type is not PlannedActionType.PATCH_AGENT]
        current = [_part(a.type.value, a.name) for a in reported]
        previous = self._reported.get(key)
        if previous is None:  # the first look since this process started: the status's
            previous = [
                _part(str(a.get("type")), a.get("name"))
                for a in (status or {}).get("plannedActions") or ()
                if isinstance(a, dict) and a.get("type") != PlannedActionType.PATCH_AGENT.value
            ]
        self._reported[key] = current
        only_noop = all(a.type is PlannedActionType.NOOP and a.name is None for a in reported)
        if current == previous or only_noop:
            return None
        return f"planned {len(reported)} action(s): {summary(current)}"

    def forget(self, key: ObjectKey) -> None:
        self._reported.pop(key, None)
