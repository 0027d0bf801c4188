"""The cap on tasks in flight per vCenter: nobody waits, groups take turns."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.vsphere.tasks.slots import Slot, TaskSlots


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slots(cap: int, clock: Clock | None = None) -> tuple[TaskSlots, list[str]]:
    granted: list[str] = []
    return (
        TaskSlots(cap=cap, on_grant=granted.append, clock=clock or Clock()),
        granted,
    )


def test_a_free_slot_is_claimed_at_once_and_the_cap_is_never_exceeded() -> None:
    cap, granted = slots(2)
    first = cap.claim(group="a", token="a1")
    second = cap.claim(group="a", token="a2")
    assert first is not None
    assert second is not None
    assert cap.claim(group="a", token="a3") is None
    assert cap.in_flight == 2
    assert cap.waiting == 1
    assert granted == []


def test_a_slot_is_held_by_its_task_until_the_task_ends() -> None:
    cap, granted = slots(1)
    slot = cap.claim(group="a", token="a1")
    assert slot is not None
    slot.bind("task-1")
    assert cap.claim(group="a", token="a2") is None
    cap.finished("task-9")  # someone else's task: nothing frees
    assert granted == []
    cap.finished("task-1")
    assert granted == ["a2"]  # reserved for the one in line, who is told
    assert cap.claim(group="b", token="b1") is None  # a newcomer cannot take it
    assert cap.claim(group="a", token="a2") is not None  # the one told claims it


def test_a_pool_asking_for_one_slot_during_a_burst_is_served_at_the_next_free_slot() -> None:
    cap, granted = slots(4)
    held = [cap.claim(group="burst", token=f"b{i}") for i in range(4)]
    for i in range(4, 200):
        assert cap.claim(group="burst", token=f"b{i}") is None
    assert cap.claim(group="small", token="s1") is None
    first = held[0]
    assert first is not None
    first.bind("task-0")
    cap.finished("task-0")
    assert granted == ["b4"]  # the burst was first in line
    assert cap.claim(group="burst", token="b4") is not None
    second = held[1]
    assert second is not None
    second.release()  # (a start that failed frees its slot too)
    assert granted == ["b4", "s1"]  # then the small pool's turn, not after 195 more


def test_groups_take_turns_and_each_group_keeps_its_order() -> None:
    cap, granted = slots(1)
    slot = cap.claim(group="a", token="a0")
    assert slot is not None
    for token in ("a1", "a2", "a3"):
        cap.claim(group="a", token=token)
    for token in ("b1", "b2"):
        cap.claim(group="b", token=token)
    cap.claim(group="c", token="c1")
    order = []
    for _ in range(6):
        slot.release()
        order.append(granted[-1])
        claimed = cap.claim(group=order[-1][0], token=order[-1])
        assert claimed is not None
        slot = claimed
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_asking_again_keeps_the_place_in_line() -> None:
    cap, _granted = slots(1)
    assert cap.claim(group="a", token="a0") is not None
    cap.claim(group="a", token="a1")
    cap.claim(group="a", token="a2")
    assert cap.claim(group="a", token="a2") is None  # asked again (a requeue)
    assert cap.position("a1") == 0
    assert cap.position("a2") == 1
    assert cap.waiting == 2


def test_an_unclaimed_reservation_passes_to_the_next_in_line() -> None:
    clock = Clock()
    cap, granted = slots(1, clock)
    slot = cap.claim(group="a", token="a0")
    assert slot is not None
    cap.claim(group="a", token="gone")
    cap.claim(group="b", token="b1")
    slot.release()
    assert granted == ["gone"]
    clock.now += 31.0  # the reservation lapses; the next claim finds it out
    assert cap.claim(group="c", token="c1") is None
    assert granted == ["gone", "b1"]
    assert cap.claim(group="b", token="b1") is not None


def test_a_token_that_no_longer_wants_a_slot_gives_up_its_reservation_and_place() -> None:
    cap, granted = slots(1)
    slot = cap.claim(group="a", token="a0")
    assert slot is not None
    cap.claim(group="a", token="a1")
    cap.claim(group="b", token="b1")
    cap.cancel("b1")
    assert cap.waiting == 1
    slot.release()
    assert granted == ["a1"]
    cap.cancel("a1")  # reserved, then deleted: the slot frees at once
    assert cap.reserved == 0
    assert cap.claim(group="c", token="c1") is not None


def test_a_task_found_running_after_a_restart_counts_without_waiting() -> None:
    cap, granted = slots(1)
    cap.adopt("task-old")
    assert cap.in_flight == 1
    assert cap.claim(group="a", token="a1") is None
    cap.adopt("task-old")  # followed again: counted once
    assert cap.in_flight == 1
    cap.finished("task-old")
    assert granted == ["a1"]


def test_releasing_twice_frees_one_slot() -> None:
    cap, _ = slots(2)
    slot = cap.claim(group="a", token="a1")
    assert slot is not None
    slot.bind("task-1")
    slot.release()
    cap.finished("task-1")
    slot.release()
    assert cap.in_flight == 0


def test_a_cap_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        TaskSlots(cap=0)


def test_a_kept_slot_goes_to_its_chains_next_task_before_anyone_in_line() -> None:
    cap, granted = slots(1)
    create = cap.claim(group="a", token="a1", keep=True)
    assert create is not None
    create.bind("create-1")
    assert cap.claim(group="a", token="a2") is None  # queued creates of the same pool
    assert cap.claim(group="b", token="b1") is None
    cap.finished("create-1")
    assert granted == []  # handed over: nobody in line is told
    assert cap.claim(group="b", token="b1") is None
    power_on = cap.claim(group="a", token="a1")  # the power-on, at once
    assert power_on is not None
    power_on.bind("power-on-1")
    cap.finished("power-on-1")  # not kept: the next in line gets it
    assert granted == ["a2"]
    assert cap.in_flight == 0
    assert cap.reserved == 1


def test_a_handed_over_slot_not_needed_is_given_back_to_the_next_in_line() -> None:
    cap, granted = slots(1)
    create = cap.claim(group="a", token="a1", keep=True)
    assert create is not None
    create.bind("create-1")
    cap.claim(group="b", token="b1")
    cap.finished("create-1")
    cap.give_back("b1")  # only a hand-over is given back: b1's place in line stays
    assert cap.position("b1") == 0
    cap.give_back("a1")  # the create failed: no power-on follows
    assert granted == ["b1"]
    assert cap.claim(group="b", token="b1") is not None
    cap.give_back("a1")  # twice: nothing more happens
    assert cap.in_flight == 1
    assert cap.reserved == 0


def test_a_hand_over_nobody_claims_lapses_to_the_next_in_line() -> None:
    clock = Clock()
    cap, granted = slots(1, clock)
    create = cap.claim(group="a", token="a1", keep=True)
    assert create is not None
    create.bind("create-1")
    cap.claim(group="b", token="b1")
    cap.finished("create-1")
    clock.now += 11.0
    assert cap.claim(group="c", token="c1") is None  # the lapse is found out
    assert granted == ["b1"]


def test_a_kept_slot_released_before_its_task_started_frees_as_usual() -> None:
    cap, granted = slots(1)
    slot = cap.claim(group="a", token="a1", keep=True)
    assert slot is not None
    cap.claim(group="b", token="b1")
    slot.release()  # the start failed
    assert granted == ["b1"]


def test_a_pool_with_nothing_in_flight_starts_at_once_while_bursts_fill_the_cap() -> None:
    cap, granted = slots(32)  # headroom: 32 // 16 = 2 slots
    assert cap.headroom == 2
    burst = [cap.claim(group=f"p{i % 3}", token=f"b{i}") for i in range(40)]
    assert sum(s is not None for s in burst) == 30  # the bursts stop short of the cap
    small = cap.claim(group="small", token="s1")
    assert small is not None  # no task had to end first
    other = cap.claim(group="other", token="o1")
    assert other is not None
    assert cap.claim(group="third", token="t1") is None  # the headroom is used up
    assert cap.in_flight == 32
    assert granted == []


def test_the_headroom_goes_to_a_waiting_pool_with_nothing_in_flight_first() -> None:
    cap, granted = slots(16)  # headroom 1
    held = [cap.claim(group="burst", token=f"b{i}") for i in range(15)]
    assert all(s is not None for s in held)
    assert cap.claim(group="burst", token="b15") is None  # only the headroom is left
    assert cap.claim(group="small", token="s1") is not None
    assert cap.claim(group="late", token="l1") is None  # cap reached: in line
    first = held[0]
    assert first is not None
    first.release()  # one frees: 1 free, within the headroom
    assert granted == ["l1"]  # the pool with nothing in flight, before the burst's b15
    assert cap.claim(group="late", token="l1") is not None


def test_below_a_cap_of_16_there_is_no_headroom() -> None:
    cap, _granted = slots(15)
    assert cap.headroom == 0
    assert all(cap.claim(group="burst", token=f"b{i}") is not None for i in range(15))


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(min_value=1, max_value=40),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["claim", "keep", "end", "release", "give_back", "cancel", "wait"]),
            st.integers(min_value=0, max_value=30),
        ),
        max_size=200,
    ),
)
def test_the_cap_and_the_per_pool_counts_hold_whatever_happens(
    cap: int, ops: list[tuple[str, int]]
) -> None:
    clock = Clock()
    slots_, _granted = slots(cap, clock)
    held: dict[str, Slot] = {}
    tasks = 0
    for op, n in ops:
        token, group = f"t{n}", f"g{n % 4}"
        if op in ("claim", "keep") and token not in held:
            slot = slots_.claim(group=group, token=token, keep=op == "keep")
            if slot is not None:
                tasks += 1
                slot.bind(f"task-{tasks}")
                held[token] = slot
        elif op == "end" and token in held:
            task = held.pop(token).task
            assert task is not None
            slots_.finished(task)
        elif op == "release" and token in held:
            held.pop(token).release()
        elif op == "give_back":
            slots_.give_back(token)
        elif op == "cancel" and token not in held:
            slots_.cancel(token)
        elif op == "wait":
            clock.now += n
        assert slots_.in_flight + slots_.reserved <= cap
        assert slots_.in_flight == len(held)
        counted = Counter(s.group for s in held.values())
        counted.update(slots_._reserved_group.values())
        assert +counted == +slots_._per_group
