"""Keys waiting for vCenter: for a task to end or a slot to start one, for a login to end.

No worker waits on vCenter (docs/design/0005-task-model.md). A reconcile that started a
task, or found a login in flight, records its key here and returns; the session registry
reports the end and the key is enqueued again (`TaskWaits`, `LoginWaits`). The task
waiter itself (one PropertyCollector long poll) is `agentforge/vsphere/tasks/waiter.py`.

May import `agentforge.vsphere` and `agentforge.kube` (controller results, keys); no
controller package and not `reconcilers.common` (import-linter: the reconcilers' layers).

**Tasks** (`TaskWaits`). No worker waits on vCenter. A reconcile that started a task
records its moref in status and returns `wait_task(...)`; one that found every task slot
of the vCenter taken (`vsphere.TaskSlotPending`) returns `wait_slot(...)`. The session
registry reports every followed task that ended and every slot reserved for a waiting
key (`SessionRegistry.subscribe_tasks`, one listener per controller), and the keys are
enqueued at once, as `LoginWaits` does for logins. The next reconcile reads the task's
outcome from vCenter by the recorded moref, or claims its reserved slot.

A task whose reference no status field records (adoption's marker stamp, a created VM's
power-on) is noted here instead (`note`, with what the next pass needs to finish: which
creation it belongs to and the VM as read before it started), so the next pass still
reads its outcome; after a restart the VM tells (its markers, its power state). A
report that arrives before the key registered (the task ended while its reference was
being written) is remembered for a while, so registering then wakes the key at once. A
requeue after `TASK_RECHECK_S` / `SLOT_RECHECK_S` is the fallback should a report be
lost; a deleted object's reservation, place in line and notes are given up (`forget`).

**Logins** (`LoginWaits`). The session registry lets a caller wait for a login only
briefly (`SessionOptions.login_wait_seconds`), then raises `vsphere.LoginPending` while
the login goes on in the background. Holding the worker until the login ends would let
one black-holed vCenter occupy every worker of a controller for a whole login timeout;
returning `requeue` would spin on the rate limiter. Instead a reconcile that meets
`LoginPending` records here which credentials it waits for (`wait`) and returns; the
registry reports every login that ends (`SessionRegistry.subscribe`) and the waiting
keys are enqueued again at once, as a changed Secret enqueues the pools naming it. A
requeue after the login timeout is the fallback should a report come before the key was
recorded.

`track` (the infra controller) also remembers which credentials each key used last,
so a failed login (a password changed in vCenter, found at a re-login after the
session expired) brings every pool using those credentials back, not only those
that happened to wait.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from agentforge import vsphere
from agentforge.kube.controller import Result
from agentforge.kube.store import ObjectKey

__all__ = ["SLOT_RECHECK_S", "TASK_RECHECK_S", "LoginWaits", "Noted", "TaskWaits"]

TASK_RECHECK_S: Final = 300.0
"""A key waiting for a task looks again after this long even without news."""
SLOT_RECHECK_S: Final = 60.0
"""A key waiting for a task slot asks again after this long even without news."""
REMEMBERED: Final = 4096
"""Ended tasks remembered for keys that register late."""

_Task = tuple[str, str]  # (vCenter, task moref)


@dataclass(frozen=True, slots=True)
class Noted:
    """A task no status field records, as the key's pass that started it noted it."""

    vcenter: str
    task: str
    """The task's moref."""
    about: str = ""
    """What it was started for, as the noting code tells its tasks apart (a power-on:
    the BIOS UUID of the creation record it belongs to)."""
    vm: vsphere.VmFacts | None = None
    """The VM as read before the task started (a power-on: the identity to record once
    it succeeded)."""


class TaskWaits:
    def __init__(self, registry: vsphere.SessionRegistry, *, controller: str) -> None:
        self._registry = registry
        self._prefix = f"{controller}:"
        self._waiting: dict[_Task, set[ObjectKey]] = {}
        self._of_key: dict[ObjectKey, set[_Task]] = {}
        self._ended: collections.OrderedDict[_Task, None] = collections.OrderedDict()
        self._noted: dict[tuple[ObjectKey, str], Noted] = {}
        self._enqueue: Enqueue | None = None
        self.unsubscribe = registry.subscribe_tasks(self._told)

    def bind(self, enqueue: Enqueue) -> None:
        """Where woken keys go (the controller's `enqueue`)."""
        self._enqueue = enqueue

    def token(self, key: ObjectKey) -> str:
        """The key's token in the task slot queues (this controller's keys only)."""
        return f"{self._prefix}{key}"

    def wait_task(self, key: ObjectKey, *, vcenter: str, task: str) -> Result:
        """`key` waits for `task` on `vcenter` to end; the result to return."""
        item = (vcenter, task)
        if item in self._ended:
            self._wake(key)
        else:
            self._waiting.setdefault(item, set()).add(key)
            self._of_key.setdefault(key, set()).add(item)
        return Result(requeue_after=TASK_RECHECK_S)

    def wait_slot(self, key: ObjectKey, pending: vsphere.TaskSlotPending) -> Result:
        """`key` waits for a task slot (it is in line already); the result to return."""
        return Result(requeue_after=SLOT_RECHECK_S)

    def note(
        self,
        key: ObjectKey,
        purpose: str,
        *,
        vcenter: str,
        task: str,
        about: str = "",
        vm: vsphere.VmFacts | None = None,
    ) -> None:
        """Remember the task `key` started for `purpose` when no status field records
        it (a marker stamp, a power-on): the next pass asks vCenter how it ended."""
        self._noted[(key, purpose)] = Noted(vcenter=vcenter, task=task, about=about, vm=vm)

    def noted(self, key: ObjectKey, purpose: str, *, vcenter: str) -> str | None:
        """The task noted for `purpose`, and forget it (its outcome is read once)."""
        item = self.take(key, purpose, vcenter=vcenter)
        return item.task if item is not None else None

    def take(self, key: ObjectKey, purpose: str, *, vcenter: str) -> Noted | None:
        """The note for `purpose` (on `vcenter`; one about another vCenter is dropped),
        and forget it (its outcome is read once)."""
        item = self._noted.pop((key, purpose), None)
        return item if item is not None and item.vcenter == vcenter else None

    def forget(self, key: ObjectKey) -> None:
        """`key` waits for nothing any more (its object is gone)."""
        for noted in [k for k in self._noted if k[0] == key]:
            del self._noted[noted]
        for item in self._of_key.pop(key, set()):
            keys = self._waiting.get(item)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._waiting[item]
        self._registry.cancel_task_slot(self.token(key))

    def give_back(self, key: ObjectKey) -> None:
        """A task slot handed over to `key` (its task ended) that its pass did not
        claim goes to the next in line (`TaskSlots` hand-over)."""
        self._registry.give_back_task_slot(self.token(key))

    def waiting(self, key: ObjectKey) -> bool:
        return key in self._of_key

    def awaiting(self, key: ObjectKey, *, vcenter: str, task: str) -> bool:
        """`key` waits for `task`, followed by this process and not ended yet: asking
        vCenter about it now would only hear "running" (its end wakes the key)."""
        return key in self._waiting.get((vcenter, task), ())

    def _told(self, news: vsphere.TaskNews) -> None:
        if news.token is not None and news.token.startswith(self._prefix):
            self._wake(ObjectKey(news.token.removeprefix(self._prefix)))
        if news.task is None:
            return
        item = (news.vcenter, news.task)
        self._ended[item] = None
        self._ended.move_to_end(item)
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
        for key in self._waiting.pop(item, set()):
            items = self._of_key.get(key)
            if items is not None:
                items.discard(item)
                if not items:
                    del self._of_key[key]
            self._wake(key)

    def _wake(self, key: ObjectKey) -> None:
        if self._enqueue is not None:
            self._enqueue(key)


Enqueue = Callable[[ObjectKey], None]
Failed = Callable[[ObjectKey], None]


class LoginWaits:
    def __init__(
        self, registry: vsphere.SessionRegistry, *, on_failure: Failed | None = None
    ) -> None:
        self._registry = registry
        self._waiting: dict[vsphere.SessionKey, set[ObjectKey]] = {}
        self._users: dict[vsphere.SessionKey, set[ObjectKey]] = {}
        self._used: dict[ObjectKey, vsphere.SessionKey] = {}
        self._on_failure = on_failure
        self._enqueue: Enqueue | None = None
        registry.subscribe(self._ended)

    def bind(self, enqueue: Enqueue) -> None:
        """Where woken keys go (the controller's `enqueue`)."""
        self._enqueue = enqueue

    def wait(self, pending: vsphere.LoginPending, key: ObjectKey) -> Result:
        """Record that `key` waits for the login of `pending`; the result to return."""
        session_key = pending.key
        if isinstance(session_key, vsphere.SessionKey):
            self._waiting.setdefault(session_key, set()).add(key)
        return Result(requeue_after=self._registry.options.login_timeout_seconds)

    def track(self, key: ObjectKey, session_key: vsphere.SessionKey | None) -> None:
        """`key` now uses the credentials `session_key` (None: none, or it is gone)."""
        previous = self._used.pop(key, None)
        if previous is not None:
            users = self._users.get(previous)
            if users is not None:
                users.discard(key)
                if not users:
                    del self._users[previous]
        if session_key is not None:
            self._used[key] = session_key
            self._users.setdefault(session_key, set()).add(key)

    def _ended(
        self, session_key: vsphere.SessionKey, failure: vsphere.SessionUnavailable | None
    ) -> None:
        woken = self._waiting.pop(session_key, set())
        if failure is not None:
            users = self._users.get(session_key, set())
            if self._on_failure is not None:
                for key in users:
                    self._on_failure(key)
            woken |= users
        if self._enqueue is not None:
            for key in woken:
                self._enqueue(key)
