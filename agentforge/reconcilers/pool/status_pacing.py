"""Status writes paced per object: transitions at once, routine changes at most every few seconds.

A pool's status follows every VM: each VsphereAgent's `status.vm` is mirrored in
`ownedVMs`, and the counts move with every AgentMachine and Agent. During a burst
(200 VMs in a minute) the `pool` controller's reconciles, already deduplicated by
the work queue, would still write the pool's status about 2.5 times per VM. The
pacer keeps that to one write per object per `interval` while routine fields
change, without holding back what users and alerts watch:

* a **transition** (a condition's status, `observedGeneration`) is written in the
  reconcile that sees it, as before;
* a **routine** change (counts, `ownedVMs`, `plannedActions`, `isoEjections`, a
  condition's message, or its reason while its status stays: a burst flips
  CapacitySatisfied=False between DemandDeficit and Provisioning with every
  AgentMachine, about one write per VM when each flip was written at once) is
  written at once when the object's last write is at least
  `interval` old; otherwise the reconcile asks to be run again when it is, and that
  reconcile writes the then current state (the trailing edge: the last state of a
  burst is always written, at most `interval` late);
* while the pool is **busy** (more of its VMs on their way: a VsphereAgent being
  created, or a VM Provisioning until its Agent registers, minutes on real hardware;
  or the reconcile itself changed the pool's objects, whose watch events bring the
  next one at once) routine changes wait `burst_interval` (30 s, the cadence of the
  pool's burst Events) instead; the first reconcile after the last VM's Agent was
  prepared is not busy, so the burst's end is written at once when the last write is
  `interval` old. A 30-second burst of a new pool took five status writes (the
  checks', the first, three routine), now three.

A new pool's **first** write waits up to `first_quiet` (10 s from its creation) while
it would say Ready=Unknown (`AwaitingChecks`): the `infra` controller's vSphere and
ISO checks usually end within that time, and their status write wakes the pool,
whose first write then carries the checks' outcome and the demand together instead
of an Unknown first and the transition right after.

The trade-off: `kubectl get` may show counts and `ownedVMs` up to `interval`
seconds behind the VsphereAgents (whose own `status.vm` is written at once), and
intermediate values inside that window are never written. Nothing else reads them:
the planner works from the informer cache of the underlying objects.

Pure bookkeeping: the caller passes `now`; the state is one timestamp per key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.pool.status import Change

__all__ = [
    "BURST_STATUS_INTERVAL_S",
    "FIRST_STATUS_QUIET_S",
    "ROUTINE_STATUS_INTERVAL_S",
    "StatusPacer",
    "elapsed",
]

ROUTINE_STATUS_INTERVAL_S: Final = 10.0
"""How often at most a pool's status is written for routine changes alone."""

BURST_STATUS_INTERVAL_S: Final = 30.0
"""The same while more of the pool's VMs are on their way."""

FIRST_STATUS_QUIET_S: Final = 10.0
"""How long after its creation a new pool's first status write waits for its checks."""


def elapsed(now: datetime, since: datetime) -> float:
    """Seconds from `since` to `now`; a clock set back counts as a long time (nothing
    waits on it)."""
    seconds = (now - since).total_seconds()
    return seconds if seconds >= 0 else float("inf")


class StatusPacer:
    """When each object's status may be written next (one instance per controller)."""

    def __init__(
        self,
        *,
        interval: float = ROUTINE_STATUS_INTERVAL_S,
        burst_interval: float = BURST_STATUS_INTERVAL_S,
        first_quiet: float = FIRST_STATUS_QUIET_S,
    ) -> None:
        self._interval = interval
        self._burst_interval = max(burst_interval, interval)
        self._first_quiet = first_quiet
        self._written: dict[ObjectKey, datetime] = {}

    def delay(
        self, key: ObjectKey, change: Change, *, now: datetime, busy: bool = False
    ) -> float | None:
        """None: write now (or nothing to write); else seconds until a routine write is
        due (`busy`: more of the pool's VMs are on their way)."""
        if change is not Change.ROUTINE:
            return None
        last = self._written.get(key)
        if last is None:
            return None
        interval = self._burst_interval if busy else self._interval
        since = elapsed(now, last)
        return None if since >= interval else interval - since

    def first_delay(self, created: datetime | None, *, now: datetime) -> float | None:
        """None: write the first status now; else seconds until it is written anyway
        (the caller asks only while that write would say Ready=Unknown)."""
        if created is None:
            return None
        age = elapsed(now, created)  # (a clock behind the API server's: no wait)
        return None if age >= self._first_quiet else self._first_quiet - age

    def wrote(self, key: ObjectKey, *, now: datetime) -> None:
        self._written[key] = now

    def forget(self, key: ObjectKey) -> None:
        self._written.pop(key, None)
