"""The `infra` controller (key: pool): is vSphere usable for the pool, and is its ISO cached.

It owns the pool's `status.iso` and the conditions `VsphereReady` and `ISOReady`;
nothing else of the pool is written here (the `pool` controller owns the rest).

* **VsphereReady** comes from `VsphereService.preflight` (credentials, connection,
  every placement object, all problems at once) plus credential problems. It runs
  only when the pool's generation or the credentials changed, or after a failure
  once its backoff has passed (`preflight.PreflightGate`): a healthy pool costs no
  vSphere call. When no session can be had for the pool's credentials the reason
  says why: `LoginFailed` (vCenter refused them), `LoginDeferred` (the account's
  budget of failed logins is used up) or `VcenterUnreachable`, each with a Warning
  event and the time of the next attempt, which is when the pool looks again. A
  login still running (`vsphere.LoginPending`) is no failure: the reconcile returns
  and the pool is reconciled again when the login ends (`waits.LoginWaits`); so is every
  pool using the same credentials when a login with them fails.
* **ISO cache**: re-checked when `iso_cache.check_due` says so; otherwise the key is
  requeued for exactly the moment `checkInterval` ends. A check streams the
  InfraEnv's image into `<isoDatastore>/<prefix>/<sha256>.iso` (conditional GET with
  the validators stored in `status.iso`: an unchanged image downloads 0 bytes), then
  prunes beyond `retainVersions` what no VM holds, and temporary uploads an
  interrupted upload left (looked for at most once per their stale age;
  `iso_step`). While the last
  preflight failed the ISO step waits (VsphereReady names what to fix; retrying an
  upload against a vCenter that refuses the login only adds load).
* **Bad input** (InfraEnv missing, no ISO URL yet, the URL answering 4xx, a Secret
  without a key) sets the condition, records a Warning event naming the object and
  the fix, and changes nothing in vSphere.
* **Credentials** come from `deps.credentials` (`agentforge.secret_credentials`): a copy
  at most the refresh interval old, read anew when the pool's generation changed or a
  failed preflight is due again (a rotated password must not wait for the interval). A
  Secret in another namespace that is not shared with the pool's namespace gives
  `CredentialsNotShared` with one text whatever the cause (`credentials.not_shared`);
  its event and log line are recorded when the condition first says so, not on each
  reconcile, so not even their count follows that Secret's changes. A Secret outside
  the credentials namespaces (`--credential-namespace`) is never read:
  `CredentialsNamespaceNotAllowed` names the namespaces and the fix.

Status is written once per reconcile, only when it changed. Watches: pools (spec,
force-refresh annotation, deletion), InfraEnvs (-> pools naming them), and changes
of credentials Secrets (-> pools naming them) when the credentials source reports
them; the source re-reads only the Secrets some pool names (`set_in_use`).

**When the preflight runs** (`PreflightGate`): on change, and after failures with
backoff. A preflight logs in and resolves every placement object of a pool: a few vCenter
calls. Run on every reconcile it would make the steady state cost vSphere traffic
proportional to pool status churn; never run again it would miss a fixed password.
So the gate remembers, per pool, what the last preflight saw: the pool's generation
and a fingerprint of the credentials (the session key's keyed digest over every
field, kept in memory only, never written anywhere). It runs again when either
changed, and after a failure once its backoff has passed: the time the session
registry names for a refused or deferred login or an unreachable vCenter (so the
pool asks again exactly when a login may be tried), else 30 s doubling to 10 min.
A success stands until an input changes, or until `forget` (a login with the same
credentials failed elsewhere). A restart forgets everything: one preflight per pool.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from agentforge import vsphere
from agentforge.api import conditions, kinds, names, rbac, wire
from agentforge.api.conditions import PoolConditionType, PoolReason
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube.controller import Controller, Result, Watch
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common import indexes, pool_specs, records
from agentforge.reconcilers.common.deps import DEFAULT_RETRY_BASE, Deps, retry_limiter
from agentforge.reconcilers.common.event_reasons import InfraEvent
from agentforge.reconcilers.infra import iso_step as infra_iso
from agentforge.reconcilers.waits import LoginWaits
from agentforge.secret_credentials import (
    CredentialsError,
    CredentialsNamespaceNotAllowed,
    CredentialsNotShared,
    SecretUnreadable,
)


def fingerprint(credentials: vsphere.Credentials) -> str:
    """A digest that changes when any credential field changes (keyed, not reversible)."""
    return credentials.key.digest


@dataclass(frozen=True, slots=True)
class Inputs:
    generation: int
    credentials: str


@dataclass(frozen=True, slots=True)
class Decision:
    run: bool
    wake_at: datetime | None = None
    """When a skipped preflight becomes due (a failure's backoff end), if ever."""


@dataclass(frozen=True, slots=True)
class _Seen:
    inputs: Inputs
    ok: bool
    failures: int
    retry_at: datetime | None


class PreflightGate:
    def __init__(
        self,
        *,
        initial_backoff: timedelta = timedelta(seconds=30),
        max_backoff: timedelta = timedelta(minutes=10),
    ) -> None:
        self._initial = initial_backoff
        self._max = max_backoff
        self._seen: dict[str, _Seen] = {}

    def decide(self, key: str, inputs: Inputs, *, now: datetime) -> Decision:
        seen = self._seen.get(key)
        if seen is None or seen.inputs != inputs:
            return Decision(run=True)
        if seen.ok:
            return Decision(run=False)
        if seen.retry_at is None or now >= seen.retry_at:
            return Decision(run=True)
        return Decision(run=False, wake_at=seen.retry_at)

    def record(
        self,
        key: str,
        inputs: Inputs,
        *,
        ok: bool,
        now: datetime,
        retry_at: datetime | None = None,
    ) -> datetime | None:
        """Remember an outcome; returns when a failed preflight may run again (`retry_at`
        when given and in the future, else the gate's own backoff)."""
        if ok:
            self._seen[key] = _Seen(inputs=inputs, ok=True, failures=0, retry_at=None)
            return None
        previous = self._seen.get(key)
        failures = previous.failures + 1 if previous and previous.inputs == inputs else 1
        if retry_at is None or retry_at <= now:
            retry_at = now + min(self._initial * (1 << min(failures - 1, 20)), self._max)
        self._seen[key] = _Seen(inputs=inputs, ok=False, failures=failures, retry_at=retry_at)
        return retry_at

    def retry_due(self, key: str, *, now: datetime) -> bool:
        """The last preflight of `key` failed and its backoff has passed."""
        seen = self._seen.get(key)
        return seen is not None and not seen.ok and (seen.retry_at is None or now >= seen.retry_at)

    def healthy(self, key: str) -> bool:
        """The last preflight of `key` succeeded (False when none ran)."""
        seen = self._seen.get(key)
        return seen is not None and seen.ok

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)


__all__ = ["CONTROLLER_NAME", "InfraReconciler", "controller"]

log = logging.getLogger(__name__)

CONTROLLER_NAME = "infra"
JsonObj = dict[str, Any]

rbac.needs(kinds.VSPHERE_AGENT_POOL, "get", why="fresh read before a status write")
rbac.needs(
    kinds.VSPHERE_AGENT_POOL,
    "update",
    subresource="status",
    why="write status.iso, VsphereReady and ISOReady (PUT with resourceVersion)",
)
rbac.needs(kinds.EVENT, "create", "patch", why="events about ISO caching and vSphere access")


@runtime_checkable
class Notifying(Protocol):
    """A credentials source that reports changed Secrets and re-reads those in use
    (`credentials.SecretCredentials`)."""

    def subscribe(self, listener: Callable[[str, str], None]) -> None: ...

    def set_in_use(self, in_use: Callable[[str, str], bool]) -> None: ...


class InfraReconciler:
    def __init__(self, *, deps: Deps, iso_limits: vsphere.IsoLimits | None = None) -> None:
        self._deps = deps
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._iso = infra_iso.IsoInputs(
            pools=self._pools,
            infra_envs=deps.informer(kinds.INFRA_ENV),
            agents=deps.informer(kinds.VSPHERE_AGENT),
            limits=iso_limits,
            access=deps.iso,
        )
        self.gate = PreflightGate()
        self._generations: dict[str, int] = {}  # the pool generation credentials were read for
        self.waits = LoginWaits(deps.vsphere, on_failure=self.gate.forget)

    async def reconcile(self, key: ObjectKey) -> Result | None:
        obj = self._pools.get_by_key(key)
        pool = records.record(self._pools, key, VsphereAgentPool)
        # gone, going, or unreadable (the pool controller says what is wrong with it)
        if obj is None or pool is None or pool.metadata.deleting:
            self.gate.forget(key)
            self._iso.forget(key)
            self._generations.pop(key, None)
            self.waits.track(key, None)
            return None
        now = self._deps.now()
        outcome = infra_iso.Outcome()
        pending: vsphere.LoginPending | None = None
        service = await self._service(pool, key=key, outcome=outcome)
        self.waits.track(key, service.credentials.key if service is not None else None)
        if service is not None:
            try:
                await self._preflight(pool, key=key, service=service, outcome=outcome, now=now)
                if self.gate.healthy(key):  # else VsphereReady says what to fix
                    await infra_iso.check_iso(
                        pool, inputs=self._iso, service=service, outcome=outcome, now=now
                    )
            except vsphere.LoginPending as exc:  # reconciled again when the login ends
                pending = exc
        await self._write(pool, outcome, now=now)
        for type_, reason, message in outcome.events:
            await self._deps.events.record(obj, type=type_, reason=reason, message=message)
        if pending is not None:
            return self.waits.wait(pending, key)
        if outcome.retry:
            return Result(requeue=True)
        if outcome.wake_at:
            delay = (min(outcome.wake_at) - self._deps.now()).total_seconds()
            return Result(requeue_after=max(delay, 0.0))
        return None

    # --- credentials and preflight ---------------------------------------------------

    async def _service(
        self, pool: VsphereAgentPool, *, key: str, outcome: infra_iso.Outcome
    ) -> vsphere.VsphereService | None:
        ref = pool.spec.vsphere.credentials_secret_ref
        generation = pool.metadata.generation
        seen = self._generations.get(key)
        fresh = (seen is not None and seen != generation) or self.gate.retry_due(
            key, now=self._deps.now()
        )
        try:
            credentials = await self._deps.credentials.get(
                namespace=pool.credentials_secret_namespace(),
                name=ref.name,
                for_namespace=pool.metadata.namespace,
                max_age=0.0 if fresh else None,
            )
        except CredentialsError as exc:
            self._generations[key] = generation
            self.gate.forget(key)
            self._refused(pool, exc, outcome=outcome)
            # A changed Secret is reported by the source; only an unreadable one is retried.
            outcome.retry = isinstance(exc, SecretUnreadable)
            return None
        self._generations[key] = generation
        return vsphere.VsphereService(registry=self._deps.vsphere, credentials=credentials)

    def _refused(
        self, pool: VsphereAgentPool, exc: CredentialsError, *, outcome: infra_iso.Outcome
    ) -> None:
        message = str(exc)
        if isinstance(exc, CredentialsNamespaceNotAllowed):
            reason = PoolReason.CREDENTIALS_NAMESPACE_NOT_ALLOWED
            outcome.condition(
                PoolConditionType.VSPHERE_READY, ok=False, reason=reason, message=message
            )
            outcome.event(EventType.WARNING, InfraEvent.CREDENTIALS_NAMESPACE_NOT_ALLOWED, message)
            return
        if not isinstance(exc, CredentialsNotShared):
            reason, event = PoolReason.CREDENTIALS_UNAVAILABLE, InfraEvent.CREDENTIALS_UNAVAILABLE
            outcome.condition(
                PoolConditionType.VSPHERE_READY, ok=False, reason=reason, message=message
            )
            outcome.event(EventType.WARNING, event, message)
            return
        reason = PoolReason.CREDENTIALS_NOT_SHARED
        outcome.condition(PoolConditionType.VSPHERE_READY, ok=False, reason=reason, message=message)
        shown = next(
            (c for c in pool.status.conditions if c.type == PoolConditionType.VSPHERE_READY), None
        )
        if shown is not None and (shown.reason, shown.message) == (reason, message):
            return  # said already: no event whose count would follow the other Secret
        outcome.event(EventType.WARNING, InfraEvent.CREDENTIALS_NOT_SHARED, message)

    async def _preflight(
        self,
        pool: VsphereAgentPool,
        *,
        key: str,
        service: vsphere.VsphereService,
        outcome: infra_iso.Outcome,
        now: datetime,
    ) -> None:
        inputs = Inputs(
            generation=pool.metadata.generation, credentials=fingerprint(service.credentials)
        )
        decision = self.gate.decide(key, inputs, now=now)
        if not decision.run:
            if decision.wake_at is not None:
                outcome.wake_at.append(decision.wake_at)
            return
        where = pool_specs.placement(pool)
        try:
            await service.session()
        except vsphere.SessionUnavailable as exc:
            retry_at = self.gate.record(key, inputs, ok=False, now=now, retry_at=exc.retry_at)
            reason, event = _login_reason(exc)
            outcome.condition(
                PoolConditionType.VSPHERE_READY, ok=False, reason=reason, message=str(exc)
            )
            outcome.event(EventType.WARNING, event, str(exc))
            if retry_at is not None:
                outcome.wake_at.append(retry_at)
            return
        try:
            problems = await service.preflight(placement=where)
        except vsphere.VsphereError as exc:
            problems = [vsphere.Problem(subject="vCenter", message=str(exc), fix="retried")]
        report = None if problems else await pool_specs.inspect_domains(service, pool)
        if report is not None and report.unusable:
            return self._domains_unusable(key, inputs, report, outcome=outcome, now=now)
        retry_at = self.gate.record(key, inputs, ok=not problems, now=now)
        if not problems:
            outcome.condition(
                PoolConditionType.VSPHERE_READY,
                ok=True,
                reason=PoolReason.VSPHERE_CONNECTED,
                message=(
                    f"vCenter {service.credentials.netloc} reachable as "
                    f"{service.credentials.username}; datacenter {where.datacenter}, resource "
                    f"pool {where.resource_pool}, datastore cluster {where.datastore_cluster}, "
                    f"ISO datastore {where.iso_datastore} and network {where.network} found"
                ),
            )
            return
        message = "; ".join(str(p) for p in problems)
        outcome.condition(
            PoolConditionType.VSPHERE_READY,
            ok=False,
            reason=PoolReason.VSPHERE_UNAVAILABLE,
            message=message,
        )
        outcome.event(EventType.WARNING, InfraEvent.VSPHERE_UNAVAILABLE, message)
        if retry_at is not None:
            outcome.wake_at.append(retry_at)

    def _domains_unusable(
        self,
        key: str,
        inputs: Inputs,
        report: pool_specs.DomainReport,
        *,
        outcome: infra_iso.Outcome,
        now: datetime,
    ) -> None:
        """Some failure domains cannot take VMs: said, never skipped silently. With one
        usable domain left the pool stays ready (checked again when its spec or
        credentials change, or after a restart); with none, again after the backoff."""
        usable = bool(report.usable)
        retry_at = self.gate.record(key, inputs, ok=usable, now=now)
        outcome.condition(
            PoolConditionType.VSPHERE_READY,
            ok=usable,
            reason=PoolReason.FAILURE_DOMAIN_UNUSABLE,
            message=report.message,
        )
        outcome.event(EventType.WARNING, InfraEvent.VSPHERE_UNAVAILABLE, report.message)
        if retry_at is not None:
            outcome.wake_at.append(retry_at)

    # --- the ISO cache ---------------------------------------------------------------

    async def _write(
        self, pool: VsphereAgentPool, outcome: infra_iso.Outcome, *, now: datetime
    ) -> None:
        iso = wire.to_wire(outcome.iso) if outcome.iso is not None else None
        cached = {c.type: c for c in pool.status.conditions}
        unchanged = all(
            (found := cached.get(c.type)) is not None
            and found.is_true == c.ok
            and found.reason == c.reason
            and found.message == c.message
            for c in outcome.conditions
        )
        if unchanged and (iso is None or iso == wire.to_wire(pool.status.iso)):
            return  # the cache already shows it: not even the fresh GET

        def mutate(obj: JsonObj) -> JsonObj | None:
            if (obj.get("metadata") or {}).get("uid") != pool.metadata.uid:
                return None
            status = obj.setdefault("status", {})
            before = copy.deepcopy(status)
            for cond in outcome.conditions:
                conditions.set_condition(
                    status,
                    type=cond.type,
                    value=conditions.ConditionStatus.TRUE
                    if cond.ok
                    else conditions.ConditionStatus.FALSE,
                    reason=cond.reason,
                    message=cond.message,
                    now=now,
                    observed_generation=pool.metadata.generation,
                )
            if iso is not None:
                status["iso"] = iso
            return obj if status != before else None

        await self._deps.client.update_status(
            kinds.VSPHERE_AGENT_POOL,
            namespace=pool.metadata.namespace,
            name=pool.metadata.name,
            mutate=mutate,
        )


def _login_reason(exc: vsphere.SessionUnavailable) -> tuple[PoolReason, InfraEvent]:
    if isinstance(exc, vsphere.LoginFailed):
        return PoolReason.LOGIN_FAILED, InfraEvent.LOGIN_FAILED
    if isinstance(exc, vsphere.LoginDeferred):
        return PoolReason.LOGIN_DEFERRED, InfraEvent.LOGIN_DEFERRED
    if isinstance(exc, vsphere.VcenterUnreachable):
        return PoolReason.VCENTER_UNREACHABLE, InfraEvent.VCENTER_UNREACHABLE
    if exc.fault == vsphere.UNTRUSTED_CERTIFICATE_FAULT:
        return PoolReason.VCENTER_UNTRUSTED, InfraEvent.VCENTER_UNTRUSTED
    return PoolReason.VSPHERE_UNAVAILABLE, InfraEvent.VSPHERE_UNAVAILABLE


def _pool_changed(old: JsonObj, new: JsonObj) -> bool:
    """Only what the infra controller reads from a pool's own object triggers it."""

    def watched(obj: JsonObj) -> tuple[Any, ...]:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return (
            meta.get("uid"),
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            annotations.get(names.ANNOTATION_FORCE_ISO_REFRESH),
        )

    return watched(old) != watched(new)


def controller(
    deps: Deps,
    *,
    iso_limits: vsphere.IsoLimits | None = None,
    retry_base: float = DEFAULT_RETRY_BASE,
) -> Controller:
    """The `infra` controller over the app's informers (see the module doc)."""
    pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
    indexes.install(deps.informers)
    reconciler = InfraReconciler(deps=deps, iso_limits=iso_limits)

    def pools_of_infra_env(obj: JsonObj) -> list[ObjectKey]:
        meta = obj.get("metadata") or {}
        value = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return indexes.keys_of(pools.by_index(indexes.POOLS_BY_INFRA_ENV, value))

    built = Controller(
        name=CONTROLLER_NAME,
        reconcile=reconciler.reconcile,
        watches=[
            Watch(source=pools, predicate=_pool_changed),
            Watch(source=deps.informer(kinds.INFRA_ENV), map=pools_of_infra_env),
        ],
        workers=deps.workers,
        rate_limiter=retry_limiter(base=retry_base),
    )
    reconciler.waits.bind(built.enqueue)
    if isinstance(deps.credentials, Notifying):

        def secret_changed(namespace: str, name: str) -> None:
            for key in indexes.keys_of(
                pools.by_index(indexes.POOLS_BY_SECRET, f"{namespace}/{name}")
            ):
                built.enqueue(key)

        def secret_in_use(namespace: str, name: str) -> bool:
            return bool(pools.by_index(indexes.POOLS_BY_SECRET, f"{namespace}/{name}"))

        deps.credentials.subscribe(secret_changed)
        deps.credentials.set_in_use(secret_in_use)
    return built
