"""When a pool's `Planned`, `AgentsPrepared` and `CleanupStarted` events are due, and what.

`Planned` reports the plan's actions other than Agent preparations and clean-ups
(those are `AgentsPrepared` and `CleanupStarted`, once, when applied), by type and
object, and only when that list changed: a `DemandDeficit` whose numbers moved is the
same plan, and repeating it would only bump the event's count. The list last reported
is remembered per pool, because the status write that records `plannedActions` may be
paced (`status_pacing`) and the cached status then still shows the one before; after a
restart the cached status is the reference. A plan of a nameless `Noop` alone (nothing
to do) is remembered but not reported. A plan that comes back to the list last
reported less than `interval` (30 s) after that list was last planned is the same plan
too: in a burst the pool flips between a `DemandDeficit` (an AgentMachine not served
yet) and nothing to do with every AgentMachine, and reporting each flip would only
bump the event's count.

`AgentsPrepared` names each Agent prepared, once. In a burst the pool prepares an
Agent every few seconds; one event each would cost a write per VM. So preparations
are held while more of the pool's VMs are on their way (a VsphereAgent being created
or still Provisioning) and reported together when none is, or when the oldest held
one is `interval` old (30 s, the recorder's flush interval: a long burst is reported
every 30 s); a lone preparation is reported at once, the next ones at most every
`interval`, and a failed step reports what was held at once. Held names are lost
only with the process. `CleanupStarted` names each VsphereAgent deleted, once, in the
same way (`BurstReports`, one instance each): a scale-down deletes a VM every few
seconds too (more are on their way out while the plan unlabels Agents).

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
from agentforge.reconcilers.pool.status_pacing import elapsed

__all__ = ["BurstReports", "PlannedReports", "summary"]


def summary(items: Sequence[str], limit: int = 10) -> str:
    """The first `limit` items, then how many more."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


_REPORTED_APART = frozenset(
    {PlannedActionType.PATCH_AGENT, PlannedActionType.DELETE_VM, PlannedActionType.DELETE_AGENT}
)
"""Actions `Planned` leaves out: `AgentsPrepared` and `CleanupStarted` report them."""


def _part(type_: str, name: object) -> str:
    return f"{type_}/{name}" if name else type_


class PlannedReports:
    """The `Planned` list last reported per pool (one instance per controller)."""

    def __init__(self, *, interval: float = FLUSH_INTERVAL_S) -> None:
        self._interval = interval
        self._reported: dict[ObjectKey, list[str]] = {}
        self._last: dict[ObjectKey, tuple[list[str], datetime]] = {}
        """The list last reported, and when it was last planned."""

    def message(
        self,
        key: ObjectKey,
        actions: Sequence[Action],
        status: Mapping[str, Any] | None,
        *,
        now: datetime,
    ) -> str | None:
        """The `Planned` event's message when one is due for this plan, else None."""
        reported = [a for a in actions if a.type not in _REPORTED_APART]
        current = [_part(a.type.value, a.name) for a in reported]
        previous = self._reported.get(key)
        if previous is None:  # the first look since this process started: the status's
            previous = [
                _part(str(a.get("type")), a.get("name"))
                for a in (status or {}).get("plannedActions") or ()
                if isinstance(a, dict) and a.get("type") not in _REPORTED_APART
            ]
        self._reported[key] = current
        last = self._last.get(key)
        if last is not None and current == last[0]:
            self._last[key] = (current, now)
            if elapsed(now, last[1]) < self._interval:
                return None  # back to the plan reported a moment ago: the same plan
        only_noop = all(a.type is PlannedActionType.NOOP and a.name is None for a in reported)
        if current == previous or only_noop:
            return None
        self._last[key] = (current, now)
        return f"planned {len(reported)} action(s): {summary(current)}"

    def forget(self, key: ObjectKey) -> None:
        self._reported.pop(key, None)
        self._last.pop(key, None)


class BurstReports:
    """The names (Agents prepared, VsphereAgents deleted) not reported yet, per pool (one
    instance per controller and event)."""

    def __init__(self, *, interval: float = FLUSH_INTERVAL_S) -> None:
        self._interval = interval
        self._held: dict[ObjectKey, list[str]] = {}
        self._held_since: dict[ObjectKey, datetime] = {}
        self._reported_at: dict[ObjectKey, datetime] = {}

    def due(
        self,
        key: ObjectKey,
        prepared: Sequence[str],
        *,
        now: datetime,
        at_once: bool = False,
        more_coming: bool = False,
    ) -> tuple[list[str], float | None]:
        """(the names to report now, seconds until held ones are due or None).

        `more_coming`: more of the pool's VMs are on their way (their names are
        reported with these)."""
        held = self._held.setdefault(key, [])
        held.extend(prepared)
        if not held:
            self._held_since.pop(key, None)
            return [], None
        since = self._held_since.setdefault(key, now)
        age = elapsed(now, since)
        last = self._reported_at.get(key)
        quiet = elapsed(now, last) if last is not None else self._interval
        if at_once or age >= self._interval or (not more_coming and quiet >= self._interval):
            self._held[key] = []
            self._held_since.pop(key, None)
            self._reported_at[key] = now
            return held, None
        wait = self._interval - age
        if not more_coming:
            wait = min(wait, self._interval - quiet)
        return [], wait

    def forget(self, key: ObjectKey) -> None:
        self._held.pop(key, None)
        self._held_since.pop(key, None)
        self._reported_at.pop(key, None)
