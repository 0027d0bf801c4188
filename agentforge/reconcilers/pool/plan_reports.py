"""When a pool's `Planned` and `AgentsPrepared` events are due, and what they say.

`Planned` reports the plan's actions other than Agent preparations (those are
`AgentsPrepared`, once, when applied), by type and object, and only when that list
changed: a `DemandDeficit` whose numbers moved is the same plan, and repeating it
would only bump the event's count. The list last reported is remembered per pool,
because the status write that records `plannedActions` may be paced
(`status_pacing`) and the cached status then still shows the one before; after a
restart the cached status is the reference. A plan of a nameless `Noop` alone
(nothing to do) is remembered but not reported.

`AgentsPrepared` names each Agent prepared, once. In a burst the pool prepares an
Agent every few seconds; one event each would cost a write per VM. So the first
preparation after a quiet `interval` (30 s, the recorder's flush interval) is
reported at once, later ones are held and reported together when `interval` has
passed since the last report (the pool is requeued for that moment), and a failed
step reports what was held at once. Held names are lost only with the process.

Pure bookkeeping: no I/O; the caller passes `now`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agentforge.api.pool import PlannedActionType
from agentforge.kube.events import FLUSH_INTERVAL_S
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning.planner import Action

__all__ = ["PlannedReports", "PreparedReports", "summary"]


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


class PreparedReports:
    """The Agents prepared but not reported yet, per pool (one instance per controller)."""

    def __init__(self, *, interval: float = FLUSH_INTERVAL_S) -> None:
        self._interval = interval
        self._held: dict[ObjectKey, list[str]] = {}
        self._reported_at: dict[ObjectKey, datetime] = {}

    def due(
        self, key: ObjectKey, prepared: Sequence[str], *, now: datetime, at_once: bool = False
    ) -> tuple[list[str], float | None]:
        """(the preparations to report now, seconds until held ones are due or None)."""
        held = self._held.setdefault(key, [])
        held.extend(prepared)
        if not held:
            return [], None
        last = self._reported_at.get(key)
        elapsed = (now - last).total_seconds() if last is not None else self._interval
        if at_once or elapsed < 0 or elapsed >= self._interval:
            self._held[key] = []
            self._reported_at[key] = now
            return held, None
        return [], self._interval - elapsed

    def forget(self, key: ObjectKey) -> None:
        self._held.pop(key, None)
        self._reported_at.pop(key, None)
