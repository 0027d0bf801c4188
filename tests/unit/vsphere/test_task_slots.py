"""The cap on tasks in flight per vCenter: nobody waits, groups take turns."""

from __future__ import annotations

import pytest

from agentforge.vsphere.task_slots import TaskSlots


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
