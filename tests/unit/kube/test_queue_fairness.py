"""The work queue's fairness between groups (`WorkQueue(fairness=...)`).

Pinned: keys of one group come out in the order they were queued; the groups take
turns, so a group's i-th queued key waits for at most i+1 keys of every other group
(a group with one key queued behind another group's hundreds is served within one
turn); the client-go rules (dedupe, exclusive, no lost re-adds) hold as without
fairness, checked against a model of per-group FIFOs served in turn.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentforge.kube import queue

KEYS = st.sampled_from(["a1", "a2", "a3", "b1", "b2", "c1"])


def group_of(key: str) -> str:
    return key[0]


def drain(q: queue.WorkQueue[str]) -> list[str]:
    loop = asyncio.new_event_loop()
    try:
        return [loop.run_until_complete(q.get()) for _ in range(len(q))]
    finally:
        loop.close()


def test_one_key_of_a_new_group_is_handed_out_within_one_turn_of_a_burst() -> None:
    q = queue.WorkQueue[str](name="fair-burst", clock=lambda: 0.0, fairness=group_of)
    for i in range(300):
        q.add(f"b{i}")
    q.add("s0")  # the small group asks once the burst is queued
    order = drain(q)
    assert order.index("s0") == 1  # one key of the only other group first, not 300
    assert [k for k in order if k != "s0"] == [f"b{i}" for i in range(300)]


def test_without_fairness_the_queue_is_one_fifo() -> None:
    q = queue.WorkQueue[str](name="fair-none", clock=lambda: 0.0)
    for key in ["b0", "b1", "s0", "b2"]:
        q.add(key)
    assert drain(q) == ["b0", "b1", "s0", "b2"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=4), st.integers(0, 30)),
        min_size=1,
        max_size=80,
        unique=True,
    )
)
def test_groups_take_turns_and_each_group_is_fifo(added: list[tuple[int, int]]) -> None:
    keys = [f"{g}-{n}" for g, n in added]

    def group(key: str) -> Hashable:
        return key.split("-", maxsplit=1)[0]

    q = queue.WorkQueue[str](name="fair-property", clock=lambda: 0.0, fairness=group)
    for key in keys:
        q.add(key)
    order = drain(q)
    assert sorted(order) == sorted(keys)  # each exactly once
    by_group: dict[Hashable, list[str]] = collections.defaultdict(list)
    for key in keys:
        by_group[group(key)].append(key)
    for members in by_group.values():
        assert [k for k in order if k in set(members)] == members  # FIFO within a group
    for g, members in by_group.items():
        for i, key in enumerate(members):
            before = order[: order.index(key)]
            for h in by_group:
                if h != g:
                    served = sum(1 for k in before if group(k) == h)
                    assert served <= i + 1, (
                        f"{key} (#{i} of group {g}) waited for {served} keys of group {h}"
                    )


class FairQueueMachine(RuleBasedStateMachine):
    """A model of the fair queue (dirty, processing, per-group FIFOs in turn order)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.q: queue.WorkQueue[str] = queue.WorkQueue(
            name="fair-stateful", clock=lambda: 0.0, fairness=group_of
        )
        self.turns: collections.OrderedDict[str, collections.deque[str]] = collections.OrderedDict()
        self.dirty: set[str] = set()
        self.processing: set[str] = set()

    def teardown(self) -> None:
        self.loop.close()

    def _model_push(self, key: str) -> None:
        self.turns.setdefault(group_of(key), collections.deque()).append(key)

    def _model_queued(self) -> list[str]:
        return [k for keys in self.turns.values() for k in keys]

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.q.add(key)
        if key not in self.dirty:
            self.dirty.add(key)
            if key not in self.processing:
                self._model_push(key)

    @precondition(lambda self: any(self.turns.values()))
    @rule()
    def get(self) -> None:
        key = self.loop.run_until_complete(self.q.get())
        group, keys = next(iter(self.turns.items()))
        expected = keys.popleft()
        del self.turns[group]
        if keys:
            self.turns[group] = keys
        assert key == expected, "the next group in turn, its oldest key"
        assert key not in self.processing, "a key is never processed twice at once"
        self.processing.add(key)
        self.dirty.discard(key)

    @precondition(lambda self: len(self.processing) > 0)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.processing)))
        self.q.done(key)
        self.processing.discard(key)
        if key in self.dirty:
            self._model_push(key)

    @invariant()
    def queue_matches_model(self) -> None:
        queued = self._model_queued()
        assert len(self.q) == len(queued)
        assert len(set(queued)) == len(queued), "queued at most once"
        assert self.q.processing == frozenset(self.processing)

    @invariant()
    def no_lost_re_adds(self) -> None:
        queued = set(self._model_queued())
        for key in self.dirty:
            assert key in queued or key in self.processing


FairQueueMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestFairQueueInvariants = FairQueueMachine.TestCase
