"""Who may read an endpoint the operator serves: the API server decides, we remember briefly.

The same checks as controller-runtime's secure metrics
(`filters.WithAuthenticationAndAuthorization`), made through the operator's own client:

* `authenticate(token)`: a TokenReview says whose bearer token it is (or that it is
  nobody's: expired, revoked, forged). Outcomes are cached for `authn_ttl` (1 minute,
  both ways, as controller-runtime's delegating authenticator does), accepted and
  refused tokens in separate caches, so a flood of refused tokens cannot push the
  scraper's accepted token out. Tokens not in either cache are reviewed at most
  `review_burst` (20) at once and `review_rate` (2) per second after that, a token
  bucket shared by every caller; concurrent requests with one unknown token share
  one review. A token that finds the bucket empty raises `ReviewThrottled` (the
  server answers 429 with Retry-After): anyone may send a bearer token, and without
  the bucket each distinct one cost the API server an uncached TokenReview.
* `authorize(user, verb=..., path=...)`: a SubjectAccessReview asks whether that user
  may `verb` the non-resource URL `path` (RBAC `nonResourceURLs`, e.g. `get /metrics`).
  Allowed answers are cached for `allow_ttl` (5 minutes), denied ones for `deny_ttl`
  (30 seconds), as controller-runtime's delegating authorizer does; a binding that is
  removed therefore stops working within `allow_ttl`.
* `review(token, ...)` does both and returns a `Verdict`.

So a Prometheus scraping every 15 seconds costs one TokenReview a minute and one
SubjectAccessReview every five, and no stream of made-up tokens costs the API server
more than 2 TokenReviews a second after the first 20 (SubjectAccessReviews follow
only accepted tokens). The caches are bounded (least recently used entries go
first), and tokens are keyed by their SHA-256 digest, so the caches hold no token.
A review the API server could not answer (no connection, 5xx, the operator itself
forbidden to create reviews) raises `ReviewUnavailable` and is never cached: the next
request asks again. Tokens never reach a log line or an exception message.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentforge.api import rbac
from agentforge.api.kinds import SUBJECT_ACCESS_REVIEW, TOKEN_REVIEW, Kind
from agentforge.kube import errors
from agentforge.kube.client import JsonObj, KubeClient

__all__ = [
    "REVIEW_BURST",
    "REVIEW_RATE",
    "AccessReviewer",
    "ReviewThrottled",
    "ReviewUnavailable",
    "TokenBucket",
    "TtlCache",
    "User",
    "Verdict",
]

log = logging.getLogger(__name__)

rbac.needs(TOKEN_REVIEW, "create", why="authenticate callers of /metrics (bearer tokens)")
rbac.needs(SUBJECT_ACCESS_REVIEW, "create", why="authorise callers of /metrics (get /metrics)")

REVIEW_RATE = 2.0
"""TokenReviews per second for tokens in neither cache, once the burst is spent."""
REVIEW_BURST = 20
"""TokenReviews for unknown tokens that may be made at once."""

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A bounded mapping whose entries expire; the least recently used goes first when full."""

    def __init__(self, *, maxsize: int, clock: Callable[[], float] = time.monotonic) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._maxsize = maxsize
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> tuple[bool, V | None]:
        """(True, value) for a live entry, (False, None) for a missing or expired one."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        expires, value = entry
        if self._clock() >= expires:
            del self._entries[key]
            return False, None
        self._entries.move_to_end(key)
        return True, value

    def put(self, key: K, value: V, *, ttl: float) -> None:
        if ttl <= 0:
            return
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._maxsize:
            self._entries.popitem(last=False)


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; `take()` spends one if there is one."""

    def __init__(
        self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def take(self) -> bool:
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def wait(self) -> float:
        """Seconds until `take()` can succeed (0 when it can now)."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self._rate)


@dataclass(frozen=True, slots=True)
class User:
    """An authenticated identity, as TokenReview reports it and SubjectAccessReview takes it."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    @classmethod
    def from_status(cls, user: JsonObj) -> User:
        extra = user.get("extra") or {}
        return cls(
            name=str(user.get("username", "")),
            uid=str(user.get("uid", "")),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(x) for x in v or ())) for k, v in extra.items())),
        )


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or one the API server does not accept
    FORBIDDEN = "forbidden"  # a known identity without the permission


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    user: User | None = None
    reason: str = ""


class ReviewUnavailable(Exception):
    """The API server did not answer a review; the caller should answer 500, not 401/403."""


class ReviewThrottled(Exception):
    """Too many unknown tokens lately: this one was not reviewed; answer 429."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many unknown bearer tokens; retry in {retry_after:.1f} s")
        self.retry_after = retry_after


class AccessReviewer:
    """TokenReview + SubjectAccessReview against the API server, with bounded TTL caches."""

    def __init__(
        self,
        client: KubeClient,
        *,
        authn_ttl: float = 60.0,
        allow_ttl: float = 300.0,
        deny_ttl: float = 30.0,
        maxsize: int = 1024,
        review_rate: float = REVIEW_RATE,
        review_burst: int = REVIEW_BURST,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._authn_ttl = authn_ttl
        self._allow_ttl = allow_ttl
        self._deny_ttl = deny_ttl
        self._timeout = timeout
        self._accepted: TtlCache[str, User] = TtlCache(maxsize=maxsize, clock=clock)
        self._refused: TtlCache[str, None] = TtlCache(maxsize=maxsize, clock=clock)
        self._bucket = TokenBucket(rate=review_rate, burst=review_burst, clock=clock)
        self._pending: dict[str, asyncio.Future[User | None]] = {}
        self._grants: TtlCache[tuple[User, str, str], tuple[bool, str]] = TtlCache(
            maxsize=maxsize, clock=clock
        )

    async def review(self, token: str | None, *, verb: str, path: str) -> Decision:
        """Whether the bearer of `token` may `verb` the non-resource URL `path`."""
        if not token:
            return Decision(Verdict.UNAUTHENTICATED, reason="no bearer token")
        user = await self.authenticate(token)
        if user is None:
            return Decision(Verdict.UNAUTHENTICATED, reason="token not accepted")
        allowed, reason = await self.authorize(user, verb=verb, path=path)
        return Decision(Verdict.ALLOWED if allowed else Verdict.FORBIDDEN, user, reason)

    async def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server does not accept the token;
        ReviewThrottled when the token is unknown and the review budget is spent."""
        key = hashlib.sha256(token.encode()).hexdigest()
        hit, user = self._accepted.get(key)
        if hit:
            return user
        if self._refused.get(key)[0]:
            return None
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        if not self._bucket.take():
            raise ReviewThrottled(self._bucket.wait())
        future: asyncio.Future[User | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            user = await self._token_review(token)
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(user)
        finally:
            del self._pending[key]
        if user is None:
            self._refused.put(key, None, ttl=self._authn_ttl)
        else:
            self._accepted.put(key, user, ttl=self._authn_ttl)
        return user

    async def _token_review(self, token: str) -> User | None:
        body = {
            "apiVersion": TOKEN_REVIEW.api_version,
            "kind": TOKEN_REVIEW.kind,
            "spec": {"token": token},
        }
        status = await self._create(TOKEN_REVIEW, body)
        user = User.from_status(status.get("user") or {}) if status.get("authenticated") else None
        if user is not None and not user.name:
            user = None  # an "authenticated" answer without a user name grants nothing
        return user

    async def authorize(self, user: User, *, verb: str, path: str) -> tuple[bool, str]:
        """(allowed, the authoriser's reason) for `user` doing `verb` on URL `path`."""
        key = (user, verb, path)
        hit, cached = self._grants.get(key)
        if hit and cached is not None:
            return cached
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"verb": verb, "path": path},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        body = {
            "apiVersion": SUBJECT_ACCESS_REVIEW.api_version,
            "kind": SUBJECT_ACCESS_REVIEW.kind,
            "spec": spec,
        }
        status = await self._create(SUBJECT_ACCESS_REVIEW, body)
        allowed = bool(status.get("allowed")) and not status.get("denied")
        answer = (allowed, str(status.get("reason", "")))
        self._grants.put(key, answer, ttl=self._allow_ttl if allowed else self._deny_ttl)
        return answer

    async def _create(self, kind: Kind, body: JsonObj) -> JsonObj:
        """POST a review (repeating one is harmless) and return its status."""
        try:
            async with asyncio.timeout(self._timeout):
                answer = await self._client.request(
                    "POST",
                    kind.path(),
                    verb="create",
                    resource=f"{kind.plural}.{kind.group}",
                    body=body,
                    repeatable=True,
                )
        except (errors.KubeError, TimeoutError) as exc:
            # The exception names the kind and the API server's answer, never the body.
            what = type(exc).__name__ if isinstance(exc, TimeoutError) else str(exc)
            raise ReviewUnavailable(f"{kind.kind} failed: {what}") from None
        status = answer.get("status")
        return status if isinstance(status, dict) else {}
