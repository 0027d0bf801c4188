"""The proxy's memory: who a token belongs to, what was asked, which faults are armed.

Everything here is plain data mutated from one event loop, so no locks. Tokens are
never stored: identities are registered and looked up by the SHA-256 of the bearer
token, so neither the proxy's memory nor its control API can leak a credential.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.controlplane.proxy.classify import RequestInfo

ANONYMOUS = "anonymous"
UNKNOWN = "unknown"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


@dataclass(frozen=True, slots=True)
class Identity:
    """A registered token's owner. `authenticate` lets the webhook vouch for it."""

    name: str  # the label requests are counted under
    username: str
    uid: str
    groups: tuple[str, ...] = ()
    authenticate: bool = False


@dataclass(frozen=True, slots=True)
class RequestRecord:
    time: float
    identity: str
    method: str
    path: str
    verb: str
    resource: str
    namespace: str
    name: str
    status: int
    duration_ms: float  # until response headers (the open of a watch)
    fault: str  # "" when forwarded untouched, else which fault answered

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class FailRule:
    remaining: int
    status: int
    verb: str | None
    resource: str | None
    identity: str | None
    retry_after: int

    def matches(self, info: RequestInfo, identity: str) -> bool:
        return (
            (self.verb is None or self.verb == info.verb)
            and (self.resource is None or self.resource == info.resource)
            and (self.identity is None or self.identity == identity)
        )


@dataclass(slots=True)
class GoneRule:
    resource: str | None
    identity: str | None

    def matches(self, info: RequestInfo, identity: str) -> bool:
        return (self.resource is None or self.resource == info.resource) and (
            self.identity is None or self.identity == identity
        )


@dataclass(eq=False, slots=True)
class WatchStream:
    """One open watch; setting `dropped` makes its handler end the stream."""

    identity: str
    resource: str
    namespace: str
    opened: float
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    abort: bool = False

    def drop(self, *, abort: bool) -> None:
        self.abort = abort
        self.dropped.set()

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "resource": self.resource,
            "namespace": self.namespace,
            "opened": self.opened,
        }


CountKey = tuple[str, str, str, str, int]  # identity, verb, resource, namespace, status


class ProxyState:
    def __init__(self, *, log_size: int = 10_000) -> None:
        self.identities: dict[str, Identity] = {}
        self.counts: Counter[CountKey] = Counter()
        self.log: deque[RequestRecord] = deque(maxlen=log_size)
        self.fail_rules: list[FailRule] = []
        self.gone_rules: list[GoneRule] = []
        self.latency_s = 0.0
        self.watches: set[WatchStream] = set()

    # --- identities ------------------------------------------------------------
    def register(self, digest: str, identity: Identity) -> None:
        self.identities[digest] = identity

    def identity_of(self, authorization: str | None) -> str:
        token = bearer_token(authorization)
        if token is None:
            return ANONYMOUS
        found = self.identities.get(token_digest(token))
        return found.name if found else UNKNOWN

    def authenticate(self, token: str) -> Identity | None:
        """The identity the token webhook may vouch for, if any."""
        found = self.identities.get(token_digest(token))
        return found if found is not None and found.authenticate else None

    # --- accounting ------------------------------------------------------------
    def record(
        self,
        *,
        identity: str,
        method: str,
        path: str,
        info: RequestInfo,
        status: int,
        started: float,
        fault: str = "",
    ) -> None:
        self.counts[(identity, info.verb, info.resource, info.namespace, status)] += 1
        self.log.append(
            RequestRecord(
                time=time.time(),
                identity=identity,
                method=method,
                path=path,
                verb=info.verb,
                resource=info.resource,
                namespace=info.namespace,
                name=info.name,
                status=status,
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                fault=fault,
            )
        )

    def reset_counts(self) -> None:
        self.counts.clear()
        self.log.clear()

    # --- faults ------------------------------------------------------------------
    def take_failure(self, info: RequestInfo, identity: str) -> FailRule | None:
        for rule in self.fail_rules:
            if rule.remaining > 0 and rule.matches(info, identity):
                rule.remaining -= 1
                if rule.remaining == 0:
                    self.fail_rules.remove(rule)
                return rule
        return None

    def take_gone(self, info: RequestInfo, identity: str) -> bool:
        for rule in self.gone_rules:
            if rule.matches(info, identity):
                self.gone_rules.remove(rule)
                return True
        return False

    def drop_watches(self, *, resource: str | None, identity: str | None, abort: bool) -> int:
        dropped = 0
        for stream in list(self.watches):
            if (resource is None or stream.resource == resource) and (
                identity is None or stream.identity == identity
            ):
                stream.drop(abort=abort)
                self.watches.discard(stream)
                dropped += 1
        return dropped

    def clear_faults(self) -> None:
        self.fail_rules.clear()
        self.gone_rules.clear()
        self.latency_s = 0.0
