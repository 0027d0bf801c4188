"""What every actor shares: a polling loop that can be woken, timings, a journal.

The actors play other people's software (HyperShift, CAPI, Assisted Installer), so
each is level-triggered like those controllers are: every `tick` seconds (or at once
when kicked) it reads the state it cares about and moves it one step on. A step that
loses a race (409, an object that vanished) simply runs again on the next tick;
anything else unexpected is logged, kept in `failures` (a bug in the simulation that
tests should see, not swallow) and retried.

`settle()` waits until a whole step has started and finished after the call, which
lets a test say "the actors have seen what I just did" without sleeping.

The `Journal` is the world's shared, bounded log of what the actors did, in words;
the demo shows it live and test failures print its tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentforge.kube import errors

__all__ = [
    "DEMO_TIMINGS",
    "SIM_PREFIX",
    "Actor",
    "Journal",
    "JournalEntry",
    "Timings",
    "condition",
    "conditions_differ",
    "now_rfc3339",
    "set_conditions",
]

SIM_PREFIX = "sim.agent-forge.containeroo.ch"
"""Prefix of the labels and annotations only the simulated world uses."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Timings:
    """How fast the simulated world moves (seconds). Tests shorten, the demo lengthens."""

    tick: float = 0.25
    """Polling interval of every actor (they are also woken by `kick`)."""
    boot: float = 0.3
    """From a powered-on VM with the discovery ISO to its Agent being registered."""
    install_start: float = 0.3
    """From an Agent being bound to `Installed=False/InstallationInProgress`."""
    install: float = 1.0
    """From installation start to `Installed=True/InstallationCompleted`."""
    drain: float = 0.3
    """From a Machine being marked Deleting to its AgentMachine being deleted."""
    reclaim: float = 0.3
    """From an Agent being unbound to it being available again (`Bound=False/Unbound`)."""
    added_to_existing_cluster: float = 0.5
    """Fraction of installed Agents reporting `added-to-existing-cluster` (not `installed`)."""


DEMO_TIMINGS = Timings(tick=0.5, boot=3.0, install_start=1.5, install=5.0, drain=2.0, reclaim=2.0)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: bool | str, reason: str, message: str = "") -> dict[str, str]:
    """A condition without a transition time (`set_conditions` fills it in)."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    return {"type": type_, "status": value, "reason": reason, "message": message}


def set_conditions(
    current: list[dict[str, Any]] | None, desired: list[dict[str, str]], *, now: str
) -> list[dict[str, Any]]:
    """`desired` merged into `current`; a transition time moves only when status changes."""
    by_type = {c.get("type"): c for c in current or []}
    merged = [dict(c) for c in current or [] if c.get("type") not in {d["type"] for d in desired}]
    for want in desired:
        before = by_type.get(want["type"])
        stamp = before.get("lastTransitionTime") if before else None
        if before is None or before.get("status") != want["status"] or not stamp:
            stamp = now
        merged.append({**want, "lastTransitionTime": stamp})
    return merged


def conditions_differ(current: list[dict[str, Any]] | None, desired: list[dict[str, str]]) -> bool:
    """Whether writing `desired` would change type/status/reason/message of any condition."""
    by_type = {c.get("type"): c for c in current or []}
    for want in desired:
        have = by_type.get(want["type"])
        if have is None or any(have.get(k, "") != want[k] for k in want):
            return True
    return False


@dataclass(frozen=True, slots=True)
class JournalEntry:
    at: float
    """`time.time()` of the entry."""
    actor: str
    text: str

    def __str__(self) -> str:
        stamp = datetime.fromtimestamp(self.at, UTC).strftime("%H:%M:%S.%f")[:-3]
        return f"{stamp} {self.actor:<10} {self.text}"


@dataclass(slots=True)
class Journal:
    """The world's bounded log of what the actors did."""

    limit: int = 2000
    entries: deque[JournalEntry] = field(default_factory=deque)

    def add(self, actor: str, text: str) -> None:
        self.entries.append(JournalEntry(time.time(), actor, text))
        while len(self.entries) > self.limit:
            self.entries.popleft()
        log.info("%s: %s", actor, text)

    def tail(self, n: int = 40) -> list[JournalEntry]:
        return list(self.entries)[-n:]

    def render(self, n: int = 60) -> str:
        return "\n".join(str(e) for e in self.tail(n)) or "(nothing happened)"

    def __iter__(self) -> Iterator[JournalEntry]:
        return iter(list(self.entries))


class Actor:
    """A level-triggered polling loop; subclasses implement `step()`."""

    name = "actor"

    def __init__(self, *, timings: Timings, journal: Journal) -> None:
        self.timings = timings
        self.journal = journal
        self.failures: list[str] = []
        self.steps = 0
        self._wake = asyncio.Event()
        self._stepped = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def step(self) -> None:
        raise NotImplementedError

    def note(self, text: str) -> None:
        self.journal.add(self.name, text)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"actor:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # a crashed loop must not keep the world from stopping
                log.exception("%s: loop ended with an error", self.name)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def kick(self) -> None:
        """Run the next step now rather than at the next tick."""
        self._wake.set()

    async def settle(self, *, within: float = 30.0) -> None:
        """Return once a whole step started and finished after this call."""
        if not self.running:
            raise RuntimeError(f"actor {self.name} is not running")
        target = self.steps + 2  # the step in flight may have read state before the call
        self.kick()
        async with asyncio.timeout(within), self._stepped:
            await self._stepped.wait_for(lambda: self.steps >= target)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except (errors.Conflict, errors.NotFound, errors.TransportError) as exc:
                log.debug("%s: step lost a race or the connection, retrying: %s", self.name, exc)
            except Exception as exc:
                self._fail(exc)
            self.steps += 1
            async with self._stepped:
                self._stepped.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timings.tick):
                    await self._wake.wait()

    def _fail(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        log.exception("%s: step failed", self.name)
        self.note(f"step failed: {text}")
        self.failures.append(text)
        del self.failures[:-50]
