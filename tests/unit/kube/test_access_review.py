"""TokenReview + SubjectAccessReview with bounded TTL caches (`kube.access_review`).

The API server is scripted (`fakes.ReviewApi`); the real one answers the same reviews
in tests/kube/test_metrics_access.py. The clock is a plain number moved by hand, so
the cache lifetimes are shown exactly, without sleeping.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from agentforge.kube import errors
from agentforge.kube.access_review import (
    AccessReviewer,
    ReviewThrottled,
    ReviewUnavailable,
    TokenBucket,
    TtlCache,
    User,
    Verdict,
)
from agentforge.kube.client import KubeClient
from tests.unit.kube.fakes import ReviewApi

PROMETHEUS: dict[str, Any] = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "uid": "u-1",
    "groups": ["system:serviceaccounts", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
}
INTRUDER: dict[str, Any] = {
    "username": "system:serviceaccount:tenant:app",
    "groups": ["system:authenticated"],
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api() -> ReviewApi:
    return ReviewApi(
        users={"prom-token": PROMETHEUS, "intruder-token": INTRUDER},
        grants={(PROMETHEUS["username"], "get", "/metrics")},
    )


def _reviewer(api: ReviewApi, clock: Clock, **kw: Any) -> AccessReviewer:
    return AccessReviewer(cast(KubeClient, api), clock=clock, **kw)


async def test_no_token_is_unauthenticated_without_asking(api: ReviewApi, clock: Clock) -> None:
    decision = await _reviewer(api, clock).review(None, verb="get", path="/metrics")
    assert decision.verdict is Verdict.UNAUTHENTICATED
    assert api.posted == []


async def test_a_token_the_api_server_rejects_is_unauthenticated(
    api: ReviewApi, clock: Clock
) -> None:
    decision = await _reviewer(api, clock).review("forged", verb="get", path="/metrics")
    assert decision.verdict is Verdict.UNAUTHENTICATED
    assert [kind for kind, _ in api.posted] == ["TokenReview"]


async def test_a_user_without_the_grant_is_forbidden(api: ReviewApi, clock: Clock) -> None:
    decision = await _reviewer(api, clock).review("intruder-token", verb="get", path="/metrics")
    assert decision.verdict is Verdict.FORBIDDEN
    assert decision.user is not None
    assert decision.user.name == INTRUDER["username"]


async def test_the_review_carries_the_whole_identity_and_the_non_resource_url(
    api: ReviewApi, clock: Clock
) -> None:
    decision = await _reviewer(api, clock).review("prom-token", verb="get", path="/metrics")
    assert decision.verdict is Verdict.ALLOWED
    assert api.posted == [
        ("TokenReview", {"token": "prom-token"}),
        (
            "SubjectAccessReview",
            {
                "user": PROMETHEUS["username"],
                "uid": "u-1",
                "groups": PROMETHEUS["groups"],
                "extra": PROMETHEUS["extra"],
                "nonResourceAttributes": {"verb": "get", "path": "/metrics"},
            },
        ),
    ]


async def test_a_scrape_every_15s_for_10_minutes_costs_10_token_and_2_access_reviews(
    api: ReviewApi, clock: Clock
) -> None:
    reviewer = _reviewer(api, clock)
    for _ in range(40):  # 40 scrapes, 15 s apart
        decision = await reviewer.review("prom-token", verb="get", path="/metrics")
        assert decision.verdict is Verdict.ALLOWED
        clock.now += 15
    # TokenReview cached 60 s (both outcomes), allowed SubjectAccessReview 300 s:
    # controller-runtime's delegating authenticator and authorizer use the same.
    assert api.count("TokenReview") == 10
    assert api.count("SubjectAccessReview") == 2


async def test_negative_answers_are_cached_too_but_shorter(api: ReviewApi, clock: Clock) -> None:
    reviewer = _reviewer(api, clock)
    for _ in range(3):
        assert (await reviewer.review("forged", verb="get", path="/metrics")).verdict is (
            Verdict.UNAUTHENTICATED
        )
        assert (await reviewer.review("intruder-token", verb="get", path="/metrics")).verdict is (
            Verdict.FORBIDDEN
        )
        clock.now += 10
    assert api.count("TokenReview") == 2  # one per token within the minute
    assert api.count("SubjectAccessReview") == 1
    clock.now += 30  # the denial expires after 30 s: a new binding takes effect soon
    api.grants.add((INTRUDER["username"], "get", "/metrics"))
    decision = await reviewer.review("intruder-token", verb="get", path="/metrics")
    assert decision.verdict is Verdict.ALLOWED
    assert api.count("SubjectAccessReview") == 2


async def test_an_unanswered_review_raises_without_the_token_and_is_not_cached(
    api: ReviewApi, clock: Clock
) -> None:
    reviewer = _reviewer(api, clock)
    api.failure = errors.TransportError("connection refused")
    with pytest.raises(ReviewUnavailable) as caught:
        await reviewer.review("prom-token", verb="get", path="/metrics")
    assert "prom-token" not in str(caught.value)
    assert "TokenReview failed" in str(caught.value)
    api.failure = None
    assert (await reviewer.review("prom-token", verb="get", path="/metrics")).verdict is (
        Verdict.ALLOWED
    )
    assert api.count("TokenReview") == 2  # the failure was not remembered


async def test_the_operator_forbidden_to_review_is_an_error_not_a_denial(
    api: ReviewApi, clock: Clock
) -> None:
    reviewer = _reviewer(api, clock)
    api.failure = errors.Forbidden(
        status=403, reason="Forbidden", message="tokenreviews is forbidden"
    )
    with pytest.raises(ReviewUnavailable, match="tokenreviews is forbidden"):
        await reviewer.review("prom-token", verb="get", path="/metrics")


async def test_the_token_caches_hold_digests_and_are_bounded(api: ReviewApi, clock: Clock) -> None:
    reviewer = _reviewer(api, clock, maxsize=8, review_burst=50)
    for i in range(20):
        await reviewer.review(f"random-{i}", verb="get", path="/metrics")
    await reviewer.review("prom-token", verb="get", path="/metrics")
    refused, accepted = reviewer._refused, reviewer._accepted
    assert (len(refused), len(accepted)) == (8, 1)
    keys = [*refused._entries, *accepted._entries]
    assert all(len(key) == 64 and "random" not in key and "prom" not in key for key in keys)


async def test_a_flood_of_unknown_tokens_costs_the_burst_then_the_rate(
    api: ReviewApi, clock: Clock
) -> None:
    reviewer = _reviewer(api, clock, review_rate=2.0, review_burst=5)
    assert (await reviewer.review("prom-token", verb="get", path="/metrics")).verdict is (
        Verdict.ALLOWED
    )
    throttled: list[ReviewThrottled] = []
    for i in range(100):
        try:
            await reviewer.review(f"bogus-{i}", verb="get", path="/metrics")
        except ReviewThrottled as exc:
            throttled.append(exc)
    assert api.count("TokenReview") == 5  # the scraper's, and four of the hundred
    assert len(throttled) == 96
    assert [exc.retry_after for exc in throttled] == [pytest.approx(0.5)] * 96  # 1/rate s
    assert not any("bogus" in str(exc) for exc in throttled)
    # The scraper's token is known, and so is every refused one: neither needs the budget.
    assert (await reviewer.review("prom-token", verb="get", path="/metrics")).verdict is (
        Verdict.ALLOWED
    )
    assert (await reviewer.review("bogus-0", verb="get", path="/metrics")).verdict is (
        Verdict.UNAUTHENTICATED
    )
    with pytest.raises(ReviewThrottled):
        await reviewer.review("intruder-token", verb="get", path="/metrics")
    clock.now += 0.5  # half a second buys one review
    decision = await reviewer.review("intruder-token", verb="get", path="/metrics")
    assert decision.verdict is Verdict.FORBIDDEN
    with pytest.raises(ReviewThrottled):
        await reviewer.review("bogus-100", verb="get", path="/metrics")
    assert api.count("TokenReview") == 6


async def test_a_flood_of_refused_tokens_does_not_evict_the_scrapers(
    api: ReviewApi, clock: Clock
) -> None:
    reviewer = _reviewer(api, clock, maxsize=4, review_burst=50)
    await reviewer.review("prom-token", verb="get", path="/metrics")
    for i in range(40):
        await reviewer.review(f"bogus-{i}", verb="get", path="/metrics")
    before = api.count("TokenReview")
    decision = await reviewer.review("prom-token", verb="get", path="/metrics")
    assert decision.verdict is Verdict.ALLOWED
    assert api.count("TokenReview") == before  # still cached


async def test_concurrent_requests_with_one_unknown_token_share_one_review(
    api: ReviewApi, clock: Clock
) -> None:
    answered = asyncio.Event()

    class HeldApi(ReviewApi):
        async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            await answered.wait()  # every request arrives while the first review is out
            return await super().request(method, path, **kw)

    held = HeldApi(users=api.users, grants=api.grants)
    reviewer = _reviewer(held, clock, review_burst=1)
    requests = [
        asyncio.create_task(reviewer.review("prom-token", verb="get", path="/metrics"))
        for _ in range(10)
    ]
    await asyncio.sleep(0)
    answered.set()
    decisions = await asyncio.gather(*requests)
    assert {d.verdict for d in decisions} == {Verdict.ALLOWED}
    assert held.count("TokenReview") == 1


def test_token_bucket_spends_the_burst_and_refills_at_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=4.0, burst=2, clock=clock)
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    assert bucket.wait() == pytest.approx(0.25)
    clock.now += 10  # never more than the burst
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0, burst=1)


def test_ttl_cache_expires_and_evicts_the_least_recently_used() -> None:
    clock = Clock()
    cache: TtlCache[str, int | None] = TtlCache(maxsize=2, clock=clock)
    cache.put("a", 1, ttl=10)
    cache.put("b", None, ttl=10)
    assert cache.get("b") == (True, None)  # a cached None is a hit
    assert cache.get("a") == (True, 1)  # "a" is now the most recently used
    cache.put("c", 3, ttl=10)
    assert cache.get("b") == (False, None)  # evicted
    clock.now += 10
    assert cache.get("a") == (False, None)  # expired
    cache.put("d", 4, ttl=0)
    assert cache.get("d") == (False, None)  # a zero lifetime caches nothing


def test_user_from_a_token_review_status() -> None:
    user = User.from_status(PROMETHEUS)
    assert user.name == PROMETHEUS["username"]
    assert user.groups == tuple(PROMETHEUS["groups"])
    assert dict(user.extra) == {"authentication.kubernetes.io/pod-name": ("prometheus-0",)}
    hash(user)  # a cache key
