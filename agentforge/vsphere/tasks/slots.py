"""A cap on the tasks one vCenter runs for us at once, shared fairly between groups.

vCenter runs about 640 operations at once before it queues new ones (VMware's
performance team, "vCenter Limits for Tasks Running at the Same Time", 2021), and it
serves every other client of the same vCenter from that budget: backups, DRS, other
automation, people. `TaskSlots` keeps this operator's share bounded: at most `cap`
of our tasks are in flight per vCenter (`--vsphere-max-tasks-in-flight`), on top of
the request rate (`--vsphere-qps`, `--vsphere-burst`).

Promises:
- **Nobody waits.** `claim(group, token)` returns a `Slot` at once or None; None
  queues the token (once, keeping its place), and when a slot frees it is *reserved*
  for the next token and the `on_grant` listener is told, so the caller (a
  reconcile woken by its controller) claims it then. A reservation unclaimed for
  `reservation_seconds` goes to the next in line, so a caller that went away cannot
  hold a slot.
- **Fair between groups** (one group per pool): tokens wait in a FIFO per group and
  the groups take turns (round robin), so a group asking for one slot during another
  group's burst of hundreds is served at the next free slot, not after the burst.
- **Headroom for a group with nothing in flight.** The last `cap // 16` free slots
  (`headroom`; none below a cap of 16) go only to groups holding no slot or
  reservation: a pool asking for its first VM while others' bursts fill the cap
  starts at once, without waiting for any task to end (the bursts run on the other
  15/16 of the cap).
- A slot is in flight from `claim` until it is released: `Slot.release()` (the start
  failed, or its task ended: `finished(task)` once the slot was `bind`-ed to it).
- **A chain keeps its slot.** A slot claimed with `keep=True` is not freed when its
  task ends but *handed over*: reserved for the same token (its VM's next task: the
  power-on after the create, the destroy after the power-off), without a turn in
  line, for `handover_seconds` at most. The woken caller claims it at once; one that
  needs no further task gives it back (`give_back`), which frees it for the next in
  line. So a VM whose create ended is powered on before the queued creates of its own
  and every other pool start, instead of waiting behind them in its group's FIFO:
  VMs finish in the order they began, and a small pool's VM runs within about one
  task chain of getting its first slot.
  `adopt(task)` counts a task found running after a restart (it was started by an
  earlier process), without waiting, so new starts make room for it.

Single event loop, no locks, nothing held across an await. The clock and timer are
the running loop's (injectable for tests).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from agentforge.vsphere import metrics

__all__ = ["DEFAULT_CAP", "Grant", "Slot", "TaskSlots"]

log = logging.getLogger(__name__)

DEFAULT_CAP: Final = 64
RESERVATION_SECONDS: Final = 30.0
HANDOVER_SECONDS: Final = 10.0
"""How long a slot handed over to the same token waits for its claim (a fallback:
the woken caller claims it or gives it back in the same pass)."""

Grant = Callable[[str], None]
"""Told the token a slot was reserved for (the caller should come and claim it)."""


@dataclass(eq=False)
class Slot:
    """One task's place in the cap: bind it to the started task, or release it."""

    _owner: TaskSlots
    id: int
    token: str
    task: str | None = None
    released: bool = field(default=False)
    keep: bool = False
    """When the bound task ends, hand the slot over to `token` (its chain's next task)."""
    group: str = ""

    def bind(self, task: str) -> None:
        """The task started: the slot is held until `finished(task)` (or `release`)."""
        self._owner._bind(self, task)

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        self._owner._release(self)


class TaskSlots:
    """The cap on tasks in flight for one vCenter, with per-group round robin."""

    def __init__(
        self,
        *,
        cap: int = DEFAULT_CAP,
        name: str = "",
        on_grant: Grant | None = None,
        reservation_seconds: float = RESERVATION_SECONDS,
        handover_seconds: float = HANDOVER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cap < 1:
            raise ValueError("a task cap needs at least one slot")
        self.cap = cap
        self.headroom = cap // 16
        self.name = name
        self._on_grant = on_grant
        self._reservation_seconds = reservation_seconds
        self._handover_seconds = handover_seconds
        self._clock = clock
        self._ids = itertools.count(1)
        self._held: dict[int, Slot] = {}
        self._by_task: dict[str, Slot] = {}
        self._adopted: set[str] = set()
        self._reserved: dict[str, float] = {}  # token -> deadline
        self._reserved_group: dict[str, str] = {}  # token -> group
        self._handed: set[str] = set()  # reservations that are hand-overs
        self._per_group: collections.Counter[str] = collections.Counter()
        """Slots held plus reservations, per group (adopted tasks have none)."""
        self._queues: collections.OrderedDict[str, collections.deque[str]] = (
            collections.OrderedDict()
        )
        self._queued: dict[str, str] = {}  # token -> group
        self._timer: asyncio.TimerHandle | None = None

    # --- observed -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Slots held (claimed or bound) plus adopted tasks."""
        return len(self._held) + len(self._adopted)

    @property
    def reserved(self) -> int:
        return len(self._reserved)

    @property
    def waiting(self) -> int:
        return len(self._queued)

    def position(self, token: str) -> int | None:
        """How many tokens of the token's group wait before it (None: not waiting)."""
        group = self._queued.get(token)
        if group is None:
            return None
        return list(self._queues[group]).index(token)

    # --- claiming -------------------------------------------------------------------

    def claim(self, *, group: str, token: str, keep: bool = False) -> Slot | None:
        """A slot now, or None: the token waits its turn (`on_grant` tells when).
        `keep`: hand the slot over to this token when its task ends (see the module doc)."""
        self._expire()
        if token in self._reserved:
            group = self._reserved_group.pop(token, group)
            del self._reserved[token]
            self._handed.discard(token)
            return self._new_slot(token, group, keep=keep, counted=True)
        if token not in self._queued:
            free = self._free()
            if self._per_group[group] == 0 and free > 0 and not self._starved_waiting():
                return self._new_slot(token, group, keep=keep)  # (the headroom's use)
            if not self._queued and free > self.headroom:
                return self._new_slot(token, group, keep=keep)
        if token not in self._queued:
            self._queued[token] = group
            self._queues.setdefault(group, collections.deque()).append(token)
        self._grant()
        self._report()
        return None

    def cancel(self, token: str) -> None:
        """The token no longer wants a slot: leave the queue, drop its reservation."""
        self._queued_cancel(token)
        if self._unreserve(token):
            self._grant()
        self._report()

    def give_back(self, token: str) -> None:
        """A slot handed over to `token` is not needed (its chain ended): free it for
        the next in line. Keeps the token's place in line and any ordinary grant."""
        if token in self._handed and self._unreserve(token):
            self._grant()
            self._report()

    def finished(self, task: str) -> None:
        """The task ended (or vCenter forgot it): its slot frees."""
        if task in self._adopted:
            self._adopted.discard(task)
            self._grant()
            self._report()
            return
        slot = self._by_task.get(task)
        if slot is None:
            return
        if slot.keep and not slot.released and slot.token not in self._reserved:
            self._hand_over(slot)
        else:
            self._release(slot)

    def adopt(self, task: str) -> None:
        """Count a running task an earlier process started (no wait, may exceed the cap)."""
        if task not in self._by_task:
            self._adopted.add(task)
            self._report()

    def holds(self, task: str) -> bool:
        return task in self._by_task or task in self._adopted

    # --- internals ------------------------------------------------------------------

    def _free(self) -> int:
        return self.cap - self.in_flight - len(self._reserved)

    def _new_slot(self, token: str, group: str, *, keep: bool, counted: bool = False) -> Slot:
        """A held slot; `counted`: it replaces the token's reservation (counted already)."""
        slot = Slot(self, next(self._ids), token, keep=keep, group=group)
        if not counted:
            self._per_group[group] += 1
        self._held[slot.id] = slot
        self._report()
        return slot

    def _report(self) -> None:
        metrics.TASKS_IN_FLIGHT.labels(vcenter=self.name).set(self.in_flight + self.reserved)
        metrics.TASKS_WAITING.labels(vcenter=self.name).set(self.waiting)

    def _bind(self, slot: Slot, task: str) -> None:
        if slot.released:
            return
        slot.task = task
        self._by_task[task] = slot
        self._adopted.discard(task)

    def _release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self._held.pop(slot.id, None)
        if slot.task is not None and self._by_task.get(slot.task) is slot:
            del self._by_task[slot.task]
        self._uncount(slot.group)
        self._grant()
        self._report()

    def _hand_over(self, slot: Slot) -> None:
        """The slot's task ended: the slot becomes a reservation for the same token
        (nobody is told: the task's end wakes the caller)."""
        slot.released = True
        self._held.pop(slot.id, None)
        if slot.task is not None and self._by_task.get(slot.task) is slot:
            del self._by_task[slot.task]
        self._queued_cancel(slot.token)
        self._reserved[slot.token] = self._clock() + self._handover_seconds
        self._reserved_group[slot.token] = slot.group  # (still counted: slot -> reservation)
        self._handed.add(slot.token)
        self._schedule()
        self._report()

    def _unreserve(self, token: str) -> bool:
        """Drop the token's reservation (False: it had none)."""
        self._handed.discard(token)
        if self._reserved.pop(token, None) is None:
            return False
        self._uncount(self._reserved_group.pop(token, ""))
        return True

    def _uncount(self, group: str) -> None:
        self._per_group[group] -= 1
        if self._per_group[group] <= 0:
            del self._per_group[group]

    def _starved_waiting(self) -> bool:
        """A group holding nothing has a token in line (it goes before newcomers)."""
        return any(self._per_group[group] == 0 for group in self._queues)

    def _queued_cancel(self, token: str) -> None:
        """Take `token` out of line (it holds a reservation now)."""
        group = self._queued.pop(token, None)
        if group is not None:
            queue = self._queues[group]
            queue.remove(token)
            if not queue:
                del self._queues[group]

    def _next(self, *, starved_only: bool) -> tuple[str, str] | None:
        """The next (token, group) by round robin over the groups (FIFO within a
        group); `starved_only`: from groups holding nothing (the headroom)."""
        for group, queue in self._queues.items():
            if starved_only and self._per_group[group] > 0:
                continue
            token = queue.popleft()
            del self._queues[group]
            if queue:
                self._queues[group] = queue  # to the back: the other groups go first
            del self._queued[token]
            return token, group
        return None

    def _grant(self) -> None:
        while (free := self._free()) > 0:
            found = self._next(starved_only=free <= self.headroom)
            if found is None:
                return
            token, group = found
            self._reserved[token] = self._clock() + self._reservation_seconds
            self._reserved_group[token] = group
            self._per_group[group] += 1
            self._schedule()
            if self._on_grant is not None:
                try:
                    self._on_grant(token)
                except Exception:
                    log.exception("a task slot listener failed")

    def _expire(self) -> None:
        now = self._clock()
        expired = [t for t, deadline in self._reserved.items() if deadline <= now]
        for token in expired:
            self._unreserve(token)
            log.info(
                "vCenter %s: a task slot reserved for %s was not claimed in %gs; passed on",
                self.name,
                token,
                self._reservation_seconds,
            )
        if expired:
            self._grant()
            self._report()

    def _schedule(self) -> None:
        """Look at reservations again when the earliest one lapses (no task: a timer)."""
        if self._timer is not None or not self._reserved:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (pure tests): lapses are found by the next claim

        def fire() -> None:
            self._timer = None
            self._expire()
            self._schedule()

        delay = max(min(self._reserved.values()) - self._clock(), 0.0) + 0.01
        self._timer = loop.call_later(delay, fire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
