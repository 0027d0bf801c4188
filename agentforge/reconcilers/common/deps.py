"""What every reconciler gets from the composition root, in one frozen value.

The app builds the one `Deps` of the process (there is no other container of these)
and, once it leads, hands it to `reconcilers.registry.controllers`, which builds every
controller from it. Reconcilers read Kubernetes state only through `informers` (the cache) and
write through `client`; they reach vCenter only through `vsphere`, with credentials
from `credentials`, and image services as `iso` says (trust, proxy, limits). `now`
is the injected clock, so planners and tests never read the wall clock themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.kube.client import KubeClient
from agentforge.kube.events import EventRecorder
from agentforge.kube.informer import Informer
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

    def informer(self, kind: kinds.Kind) -> Informer:
        return self.informers[kind]
