"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

Only one replica may reconcile at a time; the others stay warm (informers synced)
and take over when the leader goes away. The rules, as client-go's
`tools/leaderelection` implements them:

* A candidate reads the Lease; it takes it when nobody holds it, when it already
  holds it, or when the holder has not changed the record for `leaseDurationSeconds`
  as measured on the candidate's **own monotonic clock** from the moment it first
  saw that record (so clock skew between machines cannot shorten a lease).
* Every write carries the resourceVersion it read (optimistic concurrency): of two
  candidates racing for an expired Lease, exactly one update succeeds.
* Taking the Lease from another holder sets `acquireTime` and increments
  `leaseTransitions`; renewing keeps both and moves `renewTime`.
* Candidates retry every `retry_period` x [1, 2.2) (jitter, so standbys do not
  stampede). The leader renews every `retry_period`; a renewal round keeps retrying
  for `renew_deadline`, after which leadership is lost: `renew_until_lost` raises
  `LeadershipLostError` and the process must stop reconciling (the app exits 1).
  `renew_deadline < lease_duration` guarantees the leader gives up before a standby
  may take over.
* `release` (clean shutdown) writes an empty `holderIdentity` and a 1 s duration, so
  a standby takes over at its next retry instead of waiting for expiry.

`leader_election_master_status{name}` is 1 while this process leads, else 0.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn, Protocol

from prometheus_client import Gauge

from agentforge.api import rbac
from agentforge.api.kinds import LEASE
from agentforge.kube import errors
from agentforge.kube.client import JsonObj, KubeClient

__all__ = [
    "JITTER_FACTOR",
    "MASTER_STATUS",
    "KubeLeaseStore",
    "LeaderElector",
    "LeadershipLostError",
    "LeaseRecord",
    "LeaseStore",
    "StoredLease",
    "default_identity",
]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2

rbac.needs(
    LEASE,
    "get",
    "create",
    "update",
    why="leader election: only the Lease holder reconciles",
    scope=rbac.Scope.LEADER_ELECTION,
)

MASTER_STATUS = Gauge(
    "leader_election_master_status",
    "1 while this process holds the leader-election Lease `name`, else 0.",
    ["name"],
)


class LeadershipLostError(Exception):
    """The Lease could not be renewed within the renew deadline: stop all work."""


def default_identity() -> str:
    """`<hostname>_<uuid4>`: unique per process, readable in `kubectl get lease`."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election fields of a Lease's spec."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    lease_transitions: int


@dataclass(frozen=True, slots=True)
class StoredLease:
    record: LeaseRecord
    resource_version: str


class LeaseStore(Protocol):
    """Where the record lives; writes raise `errors.Conflict` on a stale version."""

    async def get(self) -> StoredLease | None:
        """The current record, or None when the Lease does not exist (404)."""

    async def create(self, record: LeaseRecord) -> StoredLease:
        """Create the Lease; `errors.AlreadyExists` when another candidate was first."""

    async def update(self, record: LeaseRecord, *, resource_version: str) -> StoredLease:
        """Replace the record if the Lease is still at `resource_version`."""

    def describe(self) -> str:
        """`namespace/name`, for logs."""


def _format_micro_time(moment: dt.datetime | None) -> str | None:
    if moment is None:
        return None
    utc = moment.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # metav1.MicroTime's RFC3339Micro


def _parse_micro_time(value: Any) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(str(value))


class KubeLeaseStore:
    """The record in a real Lease object, read and replaced through `KubeClient`."""

    def __init__(self, *, client: KubeClient, namespace: str, name: str) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._last: JsonObj | None = None  # keeps labels/annotations others set

    def describe(self) -> str:
        return f"{self._namespace}/{self._name}"

    async def get(self) -> StoredLease | None:
        try:
            obj = await self._client.get(LEASE, namespace=self._namespace, name=self._name)
        except errors.NotFound:
            return None
        return self._stored(obj)

    async def create(self, record: LeaseRecord) -> StoredLease:
        obj: JsonObj = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": _spec(record),
        }
        return self._stored(await self._client.create(LEASE, obj))

    async def update(self, record: LeaseRecord, *, resource_version: str) -> StoredLease:
        metadata = dict((self._last or {}).get("metadata") or {})
        metadata.update(
            {"name": self._name, "namespace": self._namespace, "resourceVersion": resource_version}
        )
        metadata.pop("managedFields", None)
        obj: JsonObj = {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": metadata,
            "spec": _spec(record),
        }
        return self._stored(await self._client.replace(LEASE, obj))

    def _stored(self, obj: JsonObj) -> StoredLease:
        self._last = obj
        spec = obj.get("spec") or {}
        record = LeaseRecord(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse_micro_time(spec.get("acquireTime")),
            renew_time=_parse_micro_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
        )
        return StoredLease(record=record, resource_version=str(obj["metadata"]["resourceVersion"]))


def _spec(record: LeaseRecord) -> JsonObj:
    return {
        "holderIdentity": record.holder_identity,
        "leaseDurationSeconds": record.lease_duration_seconds,
        "acquireTime": _format_micro_time(record.acquire_time),
        "renewTime": _format_micro_time(record.renew_time),
        "leaseTransitions": record.lease_transitions,
    }


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    """One candidate for one Lease: `acquire`, then `renew_until_lost`, then `release`."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        wall_clock: Callable[[], dt.datetime] = _utcnow,
        rng: random.Random | None = None,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period * JITTER_FACTOR > 0:
            raise ValueError(
                "leader election needs lease_duration > renew_deadline > retry_period x "
                f"{JITTER_FACTOR} > 0 (got {lease_duration}, {renew_deadline}, {retry_period})"
            )
        self.name = name
        self.identity = identity
        self._store = store
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._observed: StoredLease | None = None
        self._observed_at = 0.0  # loop time when the observed record last changed
        self._leading = False
        self._reported_holder: str | None = None
        MASTER_STATUS.labels(name=name).set(0)

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def holder(self) -> str | None:
        """The holder this candidate last observed ('' when released)."""
        return None if self._observed is None else self._observed.record.holder_identity

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease; cancel the call to give up."""
        log.info(
            "attempting to acquire leader lease",
            extra={"lease": self._store.describe(), "identity": self.identity},
        )
        while True:
            if await self._attempt(budget=self._renew_deadline):
                self._set_leading(True)
                log.info(
                    "became leader",
                    extra={"lease": self._store.describe(), "identity": self.identity},
                )
                return
            jitter = self._rng.random() * JITTER_FACTOR * self._retry_period
            await asyncio.sleep(self._retry_period + jitter)

    async def renew_until_lost(self) -> NoReturn:
        """Renew every retry period until a round fails for `renew_deadline`; then raise."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._retry_period)
            deadline = loop.time() + self._renew_deadline
            while not await self._attempt(budget=deadline - loop.time()):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._set_leading(False)
                    log.error(
                        "leader lost: could not renew the lease within the renew deadline",
                        extra={
                            "lease": self._store.describe(),
                            "renew_deadline_s": self._renew_deadline,
                        },
                    )
                    raise LeadershipLostError(
                        f"lease {self._store.describe()} not renewed within "
                        f"{self._renew_deadline:g}s"
                    )
                await asyncio.sleep(min(self._retry_period, remaining))

    async def release(self) -> bool:
        """Give the Lease up (clean shutdown) so a standby takes over at once.

        A renewal cancelled in flight may have landed, leaving our resourceVersion
        stale: on a conflict the Lease is read again and, if we still hold it,
        released at its current version.
        """
        if not self._leading or self._observed is None:
            return False
        self._set_leading(False)
        current: StoredLease | None = self._observed
        try:
            async with asyncio.timeout(self._retry_period):
                for _ in range(2):
                    if current is None or current.record.holder_identity != self.identity:
                        return False  # someone else holds it now: nothing of ours to release
                    try:
                        stored = await self._store.update(
                            self._released(current.record),
                            resource_version=current.resource_version,
                        )
                    except errors.Conflict:
                        current = await self._store.get()
                        continue
                    self._observe(stored)
                    log.info("released leader lease", extra={"lease": self._store.describe()})
                    return True
        except (errors.KubeError, TimeoutError) as exc:
            log.warning(
                "could not release the lease; a standby takes over when it expires",
                extra={"lease": self._store.describe(), "error": str(exc) or type(exc).__name__},
            )
        return False

    def _released(self, record: LeaseRecord) -> LeaseRecord:
        now = self._wall_clock()
        return LeaseRecord(
            holder_identity="",
            lease_duration_seconds=1,
            acquire_time=now,
            renew_time=now,
            lease_transitions=record.lease_transitions,
        )

    # --- one attempt -------------------------------------------------------------------

    async def _attempt(self, *, budget: float) -> bool:
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease request timed out", extra={"lease": self._store.describe()})
            return False
        except errors.KubeError as exc:
            log.warning(
                "lease request failed", extra={"lease": self._store.describe(), "error": str(exc)}
            )
            return False

    async def _try_acquire_or_renew(self) -> bool:
        now = self._wall_clock()
        desired = LeaseRecord(
            holder_identity=self.identity,
            lease_duration_seconds=max(1, round(self._lease_duration)),
            acquire_time=now,
            renew_time=now,
            lease_transitions=0,
        )
        current = await self._store.get()
        if current is None:
            try:
                self._observe(await self._store.create(desired))
            except errors.Conflict:  # another candidate created it first
                return False
            return True

        if self._observed is None or current.record != self._observed.record:
            self._observe(current)
        holder = current.record.holder_identity
        loop_now = asyncio.get_running_loop().time()
        expires = self._observed_at + current.record.lease_duration_seconds
        if holder and holder != self.identity and expires > loop_now:
            return False  # held by someone else and not expired on our clock

        if holder == self.identity:
            desired = replace(
                desired,
                acquire_time=current.record.acquire_time,
                lease_transitions=current.record.lease_transitions,
            )
        else:
            desired = replace(desired, lease_transitions=current.record.lease_transitions + 1)
        try:
            self._observe(
                await self._store.update(desired, resource_version=current.resource_version)
            )
        except errors.Conflict:  # someone else wrote first; re-read on the next attempt
            return False
        return True

    def _observe(self, stored: StoredLease) -> None:
        self._observed = stored
        self._observed_at = asyncio.get_running_loop().time()
        holder = stored.record.holder_identity
        if holder != self._reported_holder:
            self._reported_holder = holder
            if holder and holder != self.identity:
                log.info(
                    "new leader observed", extra={"lease": self._store.describe(), "holder": holder}
                )

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        MASTER_STATUS.labels(name=self.name).set(1 if leading else 0)
