"""A source URL's refusals back off: 30 s after the first, doubling to 10 min, shared by
every pool caching the URL (`iso_cache.Refusal`, `infra_iso.SourceBackoff`).

Pure values, and the one-try-at-a-time turn on the loop's clock (looptime).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from agentforge.reconcilers.infra import iso_cache
from agentforge.reconcilers.infra.iso_step import SourceBackoff
from agentforge.vsphere import IsoInvalid

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
URL = "https://assisted.example/images/abc?api_key=secret-jwt&version=4.16"
OTHER = "https://assisted.example/images/abc?api_key=rotated-jwt&version=4.16"
REFUSED = IsoInvalid("no boot image", subject="[REDACTED]")


def test_the_schedule_starts_at_tens_of_seconds_and_grows_to_minutes() -> None:
    delays = [iso_cache.retry_delay(n).total_seconds() for n in range(1, 9)]
    assert delays == [30, 60, 120, 240, 480, 600, 600, 600]
    assert iso_cache.retry_delay(10_000) == timedelta(minutes=10)


def test_a_try_before_the_next_try_is_blocked_and_one_at_it_is_not() -> None:
    refusal = iso_cache.Refusal.first(REFUSED, now=NOW, token=None)
    assert refusal.next_try == NOW + timedelta(seconds=30)
    assert refusal.blocks(now=NOW + timedelta(seconds=29), token=None)
    assert not refusal.blocks(now=NOW + timedelta(seconds=30), token=None)


def test_each_refusal_in_a_row_doubles_the_rest() -> None:
    refusal = iso_cache.Refusal.first(REFUSED, now=NOW, token=None)
    moments = []
    for _ in range(6):
        moments.append((refusal.failures, (refusal.next_try - NOW).total_seconds()))
        refusal = refusal.again(REFUSED, now=refusal.next_try, token=None)
    # each try at its next try: 30 s, then 60 more, 120 more...
    assert moments == [(1, 30), (2, 90), (3, 210), (4, 450), (5, 930), (6, 1530)]


def test_a_force_refresh_token_not_tried_yet_tries_at_once_and_only_once() -> None:
    refusal = iso_cache.Refusal.first(REFUSED, now=NOW, token="t1")
    soon = NOW + timedelta(seconds=1)
    assert refusal.blocks(now=soon, token="t1"), "the token that was refused"
    assert not refusal.blocks(now=soon, token="t2"), "a new token: an admin's try now"
    refusal = refusal.again(REFUSED, now=soon, token="t2")
    assert refusal.blocks(now=soon, token="t2")
    assert refusal.blocks(now=soon, token="t1")


def test_one_refusal_holds_for_every_pool_of_the_url_and_a_success_clears_it() -> None:
    backoff = SourceBackoff()
    assert backoff.refusal(URL) is None
    first = backoff.refused(URL, REFUSED, now=NOW, token=None)
    assert backoff.refusal(URL) == first, "the URL's, whichever pool asks"
    assert backoff.refusal(OTHER) is None, "another key is another URL"
    second = backoff.refused(URL, REFUSED, now=first.next_try, token=None)
    assert second.failures == 2
    assert second.next_try == first.next_try + timedelta(minutes=1)
    backoff.succeeded(URL)
    assert backoff.refusal(URL) is None
    assert backoff.refused(URL, REFUSED, now=NOW, token=None).failures == 1


def test_a_url_nobody_tries_any_more_is_forgotten() -> None:
    backoff = SourceBackoff()
    old = backoff.refused(OTHER, REFUSED, now=NOW, token=None)
    later = old.next_try + iso_cache.MAX_RETRY
    backoff.refused(URL, REFUSED, now=later - timedelta(seconds=1), token=None)
    assert backoff.refusal(OTHER) is not None
    backoff.refused(URL, REFUSED, now=later, token=None)
    assert backoff.refusal(OTHER) is None


@pytest.mark.looptime
async def test_while_a_refusal_is_on_record_one_pool_tries_and_the_others_wait() -> None:
    backoff = SourceBackoff()
    order: list[str] = []

    async def check(pool: str) -> None:
        async with backoff.turn(URL):
            order.append(f"{pool} starts")
            await asyncio.sleep(1)
            order.append(f"{pool} ends")

    await asyncio.gather(check("a"), check("b"))
    assert order == ["a starts", "b starts", "a ends", "b ends"], "no refusal: no turns"
    order.clear()
    backoff.refused(URL, REFUSED, now=NOW, token=None)
    await asyncio.gather(check("a"), check("b"))
    assert order == ["a starts", "a ends", "b starts", "b ends"]
