"""Logs that tell: a problem an admin must fix is logged when it starts and when it clears.

Admins read logs first. A condition that turns False for a reason in
`api.conditions.ACTIONABLE` (credentials, TLS, placement, ISO, ejection, API
permissions) is logged once at warning level, naming the object, the condition, the
reason, its message and the fix; once it is over, one info line says so. Nothing is
logged per retry. It is done in one place, the status writer: `KubeClient` calls
`ConditionLog.observe(kind, before, after)` after each status write that succeeded,
with the object as read just before (the fresh GET) and as stored, so

* a transition is seen exactly once, by the write that made it (a write that lost a
  409 race was not made; only the leader writes);
* **starts**: after the write the condition is False with an actionable reason that
  it did not have before and that this episode has not reported yet;
* **retries** are not news: the same reason with a new message ("next attempt at
  ..."), or a pass through a reason of `RETRYING` (EjectionInProgress, VMCreating
  ...) on the way to failing again, logs nothing;
* **clears**: the condition turns True, or to a reason that is neither actionable
  nor a retry state: one info line naming what was reported;
* another actionable reason on the same condition (LoginFailed, then LoginDeferred)
  is its own warning: it has its own fix.

The episode of each (object UID, condition) lives in memory, bounded (the oldest is
forgotten first); a process that restarts mid-episode and sees the condition clear
still logs the clearing when the write that clears it saw the actionable reason.
Messages were redacted where they were set, and every log record is redacted again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentforge.api.conditions import ACTIONABLE, RETRYING, Actionable
from agentforge.api.kinds import Kind

__all__ = ["MAX_TRACKED", "ConditionLog"]

log = logging.getLogger(__name__)

MAX_TRACKED = 10_000
"""Episodes remembered at most (objects deleted mid-episode are never cleared)."""

JsonObj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Subject:
    """The object and condition a transition is about."""

    kind: str
    namespace: str
    name: str
    condition: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    def fields(self, reason: str, transition: str) -> dict[str, str]:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return {
            "kind": self.kind,
            "object": where,
            "condition": self.condition,
            "reason": reason,
            "transition": transition,
        }


class ConditionLog:
    """Observes status writes; see the module doc."""

    def __init__(
        self,
        actionable: Iterable[Actionable] = ACTIONABLE,
        retrying: Mapping[tuple[str, str], frozenset[str]] = RETRYING,
        *,
        logger: logging.Logger = log,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._fixes = {(a.kind, a.type, a.reason): a.fix for a in actionable}
        self._types = {(a.kind, a.type) for a in actionable}
        self._retrying = retrying
        self._log = logger
        self._max = max_tracked
        self._episodes: OrderedDict[tuple[str, str], list[str]] = OrderedDict()

    def observe(self, kind: Kind, before: JsonObj, after: JsonObj) -> None:
        """Log what the write from `before` to `after` started or cleared."""
        meta = after.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        old = _conditions(before)
        for type_, new in _conditions(after).items():
            if (kind.kind, type_) not in self._types:
                continue
            subject = _Subject(
                kind.kind, str(meta.get("namespace") or ""), str(meta.get("name", "")), type_
            )
            self._transition(subject, (uid, type_), old.get(type_), new)

    def _transition(
        self,
        subject: _Subject,
        key: tuple[str, str],
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
    ) -> None:
        episode = self._episodes.get(key, [])
        status, reason = str(new.get("status", "")), str(new.get("reason", ""))
        message = str(new.get("message", ""))
        fix = self._fixes.get((subject.kind, subject.condition, reason))
        if status == "False" and fix is not None:
            was = old is not None and (old.get("status"), old.get("reason")) == (status, reason)
            if reason not in episode and not was:
                self._log.warning(
                    "%s: %s is False (%s): %s; to fix: %s",
                    subject,
                    subject.condition,
                    reason,
                    message,
                    fix,
                    extra=subject.fields(reason, "started"),
                )
            if reason not in episode:
                self._remember(key, [*episode, reason])
            return
        retrying = self._retrying.get((subject.kind, subject.condition), frozenset())
        if status != "True" and reason in retrying:
            return
        reported = list(episode)
        old_reason = str((old or {}).get("reason", ""))
        if (old or {}).get("status") == "False" and (
            subject.kind,
            subject.condition,
            old_reason,
        ) in self._fixes:
            reported = reported or [old_reason]
        if not reported:
            return
        self._episodes.pop(key, None)
        self._log.info(
            "%s: %s cleared (%s); now %s (%s): %s",
            subject,
            subject.condition,
            ", ".join(reported),
            status,
            reason,
            message,
            extra={**subject.fields(reported[-1], "cleared"), "now": f"{status}/{reason}"},
        )

    def _remember(self, key: tuple[str, str], reasons: list[str]) -> None:
        self._episodes[key] = reasons
        self._episodes.move_to_end(key)
        while len(self._episodes) > self._max:
            self._episodes.popitem(last=False)


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = (obj.get("status") or {}).get("conditions") or ()
    return {str(c.get("type")): c for c in found if isinstance(c, Mapping)}
