"""What every reconciler gets from the composition root, in one frozen value.

The app builds the one `Deps` of the process (there is no other container of these)
and, once it leads, hands it to `wiring.build_controllers`, which builds every controller
from it. Reconcilers read Kubernetes state only through `informers` (the cache) and
write through `client`; they reach vCenter only through `vsphere`, with credentials
from `credentials`, and image services as `iso` says (trust, proxy, limits). `now`
is the injected clock, so planners and tests never read the wall clock themselves.
`vm_keys` serialises the controllers that act on one VM (`VmKeyLocks`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.kube.client import KubeClient
from agentforge.kube.events import EventRecorder
from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey
from agentforge.ratelimit import BucketLimiter, ItemExponentialLimiter, MaxOfLimiter
from agentforge.vsphere import IsoAccess


class CredentialsSource(Protocol):
    """Turns a Secret reference into vSphere credentials (cached; no API call when warm)."""

    async def get(
        self, *, namespace: str, name: str, for_namespace: str, max_age: float | None = None
    ) -> vsphere.Credentials:
        """The credentials in Secret `namespace/name` for a pool in `for_namespace`.

        Raise `CredentialsError` when the Secret is missing or incomplete, or lies in
        another namespace and is not shared with `for_namespace`. `max_age` (seconds):
        re-read a copy older than that first (0: a read that starts now)."""
        ...


class VmKeyLocks:
    """One lock per VsphereAgent key, shared by the `vm` and `ejection` controllers
    (docs/design/0009): a pass of either holds its key's lock from its first cache read
    to its last write, so an ejection never runs concurrently with the creation or the
    deletion of the same VM. Passes never wait on vCenter (a started task ends the
    pass), so a lock is held for one short pass; an unused lock is dropped."""

    def __init__(self) -> None:
        self._locks: dict[ObjectKey, asyncio.Lock] = {}
        self._holders: dict[ObjectKey, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: ObjectKey) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._holders[key] = self._holders.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._holders[key] -= 1
            if not self._holders[key]:
                del self._holders[key], self._locks[key]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Deps:
    client: KubeClient
    informers: Mapping[kinds.Kind, Informer]
    events: EventRecorder
    vsphere: vsphere.SessionRegistry
    credentials: CredentialsSource
    now: Callable[[], datetime] = utcnow
    workers: int = 1
    iso: IsoAccess = field(default_factory=IsoAccess)
    """How image services are reached: limits, proxy, extra trusted CAs (the flags)."""
    vm_keys: VmKeyLocks = field(default_factory=VmKeyLocks)
    """The per-VsphereAgent lock the `vm` and `ejection` controllers share."""

    def informer(self, kind: kinds.Kind) -> Informer:
        return self.informers[kind]


DEFAULT_RETRY_BASE: Final = 1.0


def retry_limiter(*, base: float = DEFAULT_RETRY_BASE) -> MaxOfLimiter[ObjectKey]:
    """Backoff for controllers whose retries reach vCenter or an image service: from
    `base` seconds (not client-go's 5 ms) doubling to 5 min, and 10 retries/s overall."""
    return MaxOfLimiter(
        ItemExponentialLimiter[ObjectKey](base=base, cap=300.0),
        BucketLimiter[ObjectKey](qps=10.0, burst=100),
    )
