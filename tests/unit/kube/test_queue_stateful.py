"""Work-queue invariants under arbitrary interleavings (hypothesis state machine).

Rules pinned: a key is queued at most once; a key is never handed out while it is
processing; a key added while processing is handed out again after `done` (no lost
re-adds); nothing is handed out that was not added.
"""

from __future__ import annotations

import asyncio
import collections

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agentforge.kube import queue

KEYS = st.sampled_from(["a", "b", "c", "d"])


class WorkQueueMachine(RuleBasedStateMachine):
    """A model of client-go's queue (dirty, processing, FIFO) checked against ours."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.q: queue.WorkQueue[str] = queue.WorkQueue(name="stateful", clock=lambda: 0.0)
        self.model_queue: collections.deque[str] = collections.deque()
        self.dirty: set[str] = set()
        self.processing: set[str] = set()
        self.handed_out: list[str] = []

    @initialize()
    def start(self) -> None:
        assert len(self.q) == 0

    def teardown(self) -> None:
        # Everything still dirty must come out (no lost re-adds), each exactly once.
        for key in list(self.processing):
            self.q.done(key)
            self.processing.discard(key)
            if key in self.dirty:
                self.model_queue.append(key)
        remaining = [self.loop.run_until_complete(self.q.get()) for _ in range(len(self.q))]
        assert sorted(remaining) == sorted(self.dirty)
        self.loop.close()

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.q.add(key)
        if key not in self.dirty:
            self.dirty.add(key)
            if key not in self.processing:
                self.model_queue.append(key)

    @precondition(lambda self: len(self.model_queue) > 0)
    @rule()
    def get(self) -> None:
        key = self.loop.run_until_complete(self.q.get())
        expected = self.model_queue.popleft()
        assert key == expected, "keys are handed out in FIFO order"
        assert key not in self.processing, "a key is never processed twice at once"
        self.processing.add(key)
        self.dirty.discard(key)
        self.handed_out.append(key)

    @precondition(lambda self: len(self.processing) > 0)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.processing)))
        self.q.done(key)
        self.processing.discard(key)
        if key in self.dirty:
            self.model_queue.append(key)

    @invariant()
    def queue_matches_model(self) -> None:
        assert len(self.q) == len(self.model_queue)
        assert len(set(self.model_queue)) == len(self.model_queue), "queued at most once"
        assert self.q.processing == frozenset(self.processing)

    @invariant()
    def no_lost_re_adds(self) -> None:
        for key in self.dirty:
            assert key in self.model_queue or key in self.processing


WorkQueueMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestWorkQueueInvariants = WorkQueueMachine.TestCase
