"""The session cache makes each value once for concurrent callers and forgets on request."""

from __future__ import annotations

import asyncio

import pytest

from agentforge.vsphere.model.specs import Placement
from agentforge.vsphere.session.vcenter_session import Memo, SessionCache

PLACEMENT = Placement(
    datacenter="dc",
    resource_pool="rp",
    folder="f",
    network="n",
    datastore_cluster="pod",
    iso_datastore="iso",
)


async def test_concurrent_callers_share_one_make() -> None:
    memo: Memo[str, int] = Memo()
    made = 0
    gate = asyncio.Event()

    async def make() -> int:
        nonlocal made
        made += 1
        await gate.wait()
        return 42

    callers = [asyncio.create_task(memo.get_or_make("dc", make)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*callers) == [42] * 5
    assert made == 1
    assert memo.get("dc") == 42


async def test_forget_makes_it_again_and_a_failure_is_not_kept() -> None:
    memo: Memo[Placement, str] = Memo()
    values = iter(["first", "second"])

    async def make() -> str:
        return next(values)

    assert await memo.get_or_make(PLACEMENT, make) == "first"
    assert await memo.get_or_make(PLACEMENT, make) == "first"
    memo.forget(PLACEMENT)
    assert await memo.get_or_make(PLACEMENT, make) == "second"

    async def fail() -> str:
        raise RuntimeError("vCenter said no")

    memo.forget(PLACEMENT)
    with pytest.raises(RuntimeError):
        await memo.get_or_make(PLACEMENT, fail)
    assert memo.get(PLACEMENT) is None


def test_a_new_cache_knows_nothing() -> None:
    cache = SessionCache()
    assert cache.vms == {}
    assert cache.vapi_token is None
    assert cache.placements.get(PLACEMENT) is None
