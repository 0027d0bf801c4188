"""The `spread-rules` controller (key: VsphereAgentPool): a spread pool's DRS rules converge.

A pool with `spreadPolicy: Spread` owns one DRS VM-VM anti-affinity rule per domain
cluster (named with its UID, `vsphere.model.spread.rule_name`) holding the pool's VMs
recorded there: VsphereAgents not being deleted whose records name a failure domain
(`status.creation` / `status.placement`) and whose `status.vm.moRef` is known. The
rule is the pool's, not a VM's, so it is kept by a controller keyed by the pool:

* **Task model (docs/design/0005).** A pass that finds a cluster's rule out of line
  starts its `ReconfigureComputeResource_Task` (`VsphereService.start_anti_affinity`),
  keeps the task's moref in memory and returns; the task's end wakes the pool
  (`waits.TaskWaits`), and the next pass reads the outcome by the moref. No worker waits.
  The members a succeeded task set are remembered per (pool UID, cluster), so a pool
  whose VMs did not change costs no vCenter call. After a restart nothing is
  remembered: the first pass reads each rule and changes only what differs.
* **Retried on its own.** A failed start or task (cluster gone, privilege missing,
  credentials unavailable) is said in a Warning event on the pool (`SpreadRuleFailed`,
  naming the cluster, the error and the fix) and the pool is requeued with the
  controller's backoff: the rule converges without further VM churn. A cluster that
  is gone (a domain skipped as unusable) holding none of the pool's VMs needs no rule:
  it is no failure, and does not hold a deleted pool.
* **Removed with the pool.** A spread pool carries the finalizer
  `FINALIZER_SPREAD_RULES` (added by the first pass). Once the pool is being deleted,
  or stops spreading, every domain cluster's rule of the pool is removed and then the
  finalizer; a failure holds the finalizer and is retried like any other (a rule of a
  deleted pool would otherwise stay in vCenter for ever). A rule whose name does not
  carry the pool's UID is never edited or removed (`spread.owned_rule`).

Watches: pools (own key); VsphereAgents (-> their pool, only when the VM's moref, the
recorded domain or the deletion changed).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agentforge import vsphere
from agentforge.api import kinds, names, rbac
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube import errors as kerrors
from agentforge.kube.controller import Controller, Result, Watch
from agentforge.kube.events import EventType
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import DEFAULT_RETRY_BASE, Deps, retry_limiter
from agentforge.reconcilers.common.event_reasons import RuleEvent
from agentforge.reconcilers.vm.spread_choice import recorded_spot
from agentforge.reconcilers.waits import LoginWaits, TaskWaits
from agentforge.secret_credentials import CredentialsError
from agentforge.vsphere.model import spread

__all__ = ["CONTROLLER_NAME", "RuleSync", "controller", "members_by_cluster"]

log = logging.getLogger(__name__)

CONTROLLER_NAME: Final = "spread-rules"
JsonObj = dict[str, Any]

rbac.needs(kinds.VSPHERE_AGENT_POOL, "patch", why="spread-rules finalizer on spread pools")
rbac.needs(kinds.EVENT, "create", "patch", why="events about a pool's anti-affinity rules")


def clusters_of(pool: VsphereAgentPool) -> list[str]:
    """Every compute cluster the pool's failure domains name (spreading or not: a pool
    that stopped spreading still has its rules removed there)."""
    return sorted({d.compute_cluster.strip("/") for d in pool.spec.vsphere.failure_domains})


def members_by_cluster(
    pool: VsphereAgentPool, agents: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[str, ...]]:
    """Cluster -> the VM morefs its rule should hold (sorted): the pool's VsphereAgents
    not being deleted, with a recorded domain and VM. Empty everywhere when the pool
    is being deleted or does not spread."""
    want: dict[str, list[str]] = {c: [] for c in clusters_of(pool)}
    if pool.metadata.deleting or not pool.spread_domains():
        return {c: () for c in want}
    home = {d.name: d.compute_cluster.strip("/") for d in pool.spread_domains()}
    for raw in agents:
        meta, status = raw.get("metadata") or {}, raw.get("status") or {}
        spot = recorded_spot(raw)
        moref = (status.get("vm") or {}).get("moRef")
        if meta.get("deletionTimestamp") or spot is None or not moref:
            continue
        cluster = home.get(str(spot[0]))
        if cluster is not None:
            want[cluster].append(str(moref))
    return {c: tuple(sorted(set(m))) for c, m in want.items()}


@dataclass(frozen=True, slots=True)
class _Running:
    task: str
    members: tuple[str, ...]
    action: str


@dataclass(slots=True)
class Outcome:
    """What one pass did for a pool's clusters."""

    waiting: list[str] = field(default_factory=list)
    """Morefs of reconfigure tasks still running."""
    changed: list[str] = field(default_factory=list)
    """`<action> in <cluster>`, for each change that succeeded."""
    failed: list[str] = field(default_factory=list)
    """`cluster <c>: <error>`, for each change that failed."""


@dataclass(slots=True)
class RuleSync:
    """Per (pool UID, cluster): the members last confirmed in vCenter, the task running."""

    confirmed: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    running: dict[tuple[str, str], _Running] = field(default_factory=dict)

    def settled(self, uid: str, want: Mapping[str, tuple[str, ...]]) -> bool:
        """Every cluster's rule is confirmed to hold `want` and no task runs: nothing
        to ask vCenter (not even for credentials)."""
        return all(
            (uid, c) not in self.running and self.confirmed.get((uid, c)) == m
            for c, m in want.items()
        )

    def forget(self, uid: str) -> None:
        for table in (self.confirmed, self.running):
            for k in [k for k in table if k[0] == uid]:
                del table[k]

    async def sync(
        self,
        service: vsphere.VsphereService,
        pool: VsphereAgentPool,
        want: Mapping[str, tuple[str, ...]],
        *,
        awaiting: Callable[[str], bool] | None = None,
    ) -> Outcome:
        """Bring each cluster's rule towards `want` without waiting for a task.
        `awaiting(task) -> bool`: the task is followed and not ended (ask nothing)."""
        outcome = Outcome()
        uid = pool.metadata.uid
        name = spread.rule_name(
            pool_uid=uid, namespace=pool.metadata.namespace, pool=pool.metadata.name
        )
        for cluster, members in sorted(want.items()):
            at = (uid, cluster)
            try:
                if await self._settle(service, at, outcome, cluster, awaiting):
                    continue  # still running
                if self.confirmed.get(at) == members:
                    continue
                action, task = await service.start_anti_affinity(
                    datacenter=pool.spec.vsphere.datacenter,
                    cluster=cluster,
                    pool_uid=uid,
                    name=name,
                    vm_moids=list(members),
                )
            except vsphere.LoginPending:
                raise
            except vsphere.NotFound as exc:
                if len(members) < 2:  # a cluster that is gone holds no rule: nothing to do
                    self.confirmed[at] = members
                    continue
                self.confirmed.pop(at, None)
                outcome.failed.append(f"cluster {cluster}: {exc}")
                continue
            except vsphere.VsphereError as exc:
                self.confirmed.pop(at, None)
                outcome.failed.append(f"cluster {cluster}: {exc}")
                continue
            if task is None:
                self.confirmed[at] = members
            else:
                self.running[at] = _Running(task=task, members=members, action=action)
                outcome.waiting.append(task)
        return outcome

    async def _settle(
        self,
        service: vsphere.VsphereService,
        at: tuple[str, str],
        outcome: Outcome,
        cluster: str,
        awaiting: Callable[[str], bool] | None,
    ) -> bool:
        """Read the outcome of the cluster's running task; True while it still runs."""
        running = self.running.get(at)
        if running is None:
            return False
        if awaiting is not None and awaiting(running.task):
            outcome.waiting.append(running.task)
            return True
        try:
            task = await service.task(task_ref=running.task)
        except vsphere.NotFound:
            del self.running[at]
            self.confirmed.pop(at, None)  # forgotten by vCenter: the rule is read again
            return False
        if task.running:
            await service.follow_task(task_ref=running.task)
            outcome.waiting.append(running.task)
            return True
        del self.running[at]
        if task.error is not None:
            self.confirmed.pop(at, None)
            outcome.failed.append(f"cluster {cluster}: {task.error}")
            return True  # reported now; started again after the backoff
        self.confirmed[at] = running.members
        outcome.changed.append(f"{running.action} in {cluster}")
        return False


class SpreadRulesReconciler:
    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._pools = deps.informer(kinds.VSPHERE_AGENT_POOL)
        self._agents = deps.informer(kinds.VSPHERE_AGENT)
        self.rules = RuleSync()
        self.logins = LoginWaits(deps.vsphere)
        self.tasks = TaskWaits(deps.vsphere, controller=CONTROLLER_NAME)
        self._uids: dict[ObjectKey, str] = {}

    async def reconcile(self, key: ObjectKey) -> Result | None:
        raw = self._pools.get_by_key(key)
        if raw is None:
            self.tasks.forget(key)
            uid = self._uids.pop(key, None)
            if uid is not None:
                self.rules.forget(uid)
            return None
        pool = records.record(self._pools, key, VsphereAgentPool)
        if pool is None:
            return None  # the pool controller says what is wrong with it
        self._uids[key] = pool.metadata.uid
        held = names.FINALIZER_SPREAD_RULES in pool.metadata.finalizers
        spreading = bool(pool.spread_domains()) and not pool.metadata.deleting
        if not spreading and not held:
            return None  # no rule of this pool was ever made by this version
        if spreading and not held and not await self._set_finalizers(pool, add=True):
            return Result(requeue=True)
        want = members_by_cluster(
            pool, self._agents.by_index(indexes.VSPHERE_AGENTS_BY_POOL, _pool_value(pool))
        )
        outcome, vcenter = Outcome(), ""
        try:
            if not self.rules.settled(pool.metadata.uid, want):  # else nothing to ask
                service = await self._service(pool)
                vcenter = service.vcenter
                outcome = await self.rules.sync(
                    service,
                    pool,
                    want,
                    awaiting=lambda task: self.tasks.awaiting(key, vcenter=vcenter, task=task),
                )
        except vsphere.LoginPending as pending:
            return self.logins.wait(pending, key)
        except (CredentialsError, vsphere.VsphereError) as exc:
            outcome = Outcome(failed=[f"vCenter: {exc}"])
        if outcome.changed:
            await self._event(raw, RuleEvent.SPREAD_RULE_UPDATED, ", ".join(outcome.changed))
        if outcome.failed:
            fix = (
                "check that the cluster exists and the vCenter user may change its DRS "
                "rules (Host > Inventory > Modify cluster); retried with backoff"
            )
            await self._event(
                raw,
                RuleEvent.SPREAD_RULE_FAILED,
                f"the anti-affinity rules of pool {pool.metadata.name} are out of sync: "
                f"{'; '.join(outcome.failed)}; {fix}",
                warning=True,
            )
            return Result(requeue=True)
        if outcome.waiting:  # the first task's end wakes the pool
            for task in outcome.waiting:
                waited = self.tasks.wait_task(key, vcenter=vcenter, task=task)
            return waited
        if not spreading and held and not await self._set_finalizers(pool, add=False):
            return Result(requeue=True)
        return None

    async def _service(self, pool: VsphereAgentPool) -> vsphere.VsphereService:
        credentials = await self._deps.credentials.get(
            namespace=pool.credentials_secret_namespace(),
            name=pool.spec.vsphere.credentials_secret_ref.name,
            for_namespace=pool.metadata.namespace,
        )
        return vsphere.VsphereService(registry=self._deps.vsphere, credentials=credentials)

    async def _set_finalizers(self, pool: VsphereAgentPool, *, add: bool) -> bool:
        """Add or drop `FINALIZER_SPREAD_RULES`; False on a 409 (look again). The
        resourceVersion makes the merge patch conditional, so a finalizer someone else
        changed meanwhile is never lost."""
        kept = [f for f in pool.metadata.finalizers if f != names.FINALIZER_SPREAD_RULES]
        finalizers = [*kept, names.FINALIZER_SPREAD_RULES] if add else kept
        try:
            await self._deps.client.patch_merge(
                kinds.VSPHERE_AGENT_POOL,
                namespace=pool.metadata.namespace,
                name=pool.metadata.name,
                patch={
                    "metadata": {
                        "finalizers": finalizers,
                        "resourceVersion": pool.metadata.resource_version,
                    }
                },
            )
        except kerrors.NotFound:
            return True
        except kerrors.Conflict:
            log.debug(
                "pool %s/%s changed since the cache saw it; finalizers retried",
                pool.metadata.namespace,
                pool.metadata.name,
            )
            return False
        return True

    async def _event(
        self, raw: JsonObj, reason: RuleEvent, message: str, *, warning: bool = False
    ) -> None:
        with contextlib.suppress(kerrors.KubeError):
            await self._deps.events.record(
                raw,
                type=EventType.WARNING if warning else EventType.NORMAL,
                reason=reason,
                message=message,
            )


def _pool_value(pool: VsphereAgentPool) -> str:
    return indexes.namespaced_key(pool.metadata.namespace, pool.metadata.name)


def _pool_changed(old: JsonObj, new: JsonObj) -> bool:
    def watched(obj: JsonObj) -> tuple[Any, ...]:
        meta = obj.get("metadata") or {}
        return (
            meta.get("uid"),
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            tuple(meta.get("finalizers") or ()),
        )

    return watched(old) != watched(new)


def _agent_changed(old: JsonObj, new: JsonObj) -> bool:
    def watched(obj: JsonObj) -> tuple[Any, ...]:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        return (
            meta.get("deletionTimestamp"),
            (status.get("vm") or {}).get("moRef"),
            recorded_spot(obj),
        )

    return watched(old) != watched(new)


def controller(deps: Deps, *, retry_base: float = DEFAULT_RETRY_BASE) -> Controller:
    """The `spread-rules` controller over the app's informers (see the module doc)."""
    indexes.install(deps.informers)
    reconciler = SpreadRulesReconciler(deps)

    def pool_of_agent(obj: JsonObj) -> list[ObjectKey]:
        meta = obj.get("metadata") or {}
        pool = ((obj.get("spec") or {}).get("poolRef") or {}).get("name")
        if not pool:
            return []
        return [ObjectKey(indexes.namespaced_key(meta.get("namespace", ""), pool))]

    built = Controller(
        name=CONTROLLER_NAME,
        reconcile=reconciler.reconcile,
        watches=[
            Watch(source=deps.informer(kinds.VSPHERE_AGENT_POOL), predicate=_pool_changed),
            Watch(
                source=deps.informer(kinds.VSPHERE_AGENT),
                map=pool_of_agent,
                predicate=_agent_changed,
            ),
        ],
        workers=deps.workers,
        rate_limiter=retry_limiter(base=retry_base),
    )
    reconciler.logins.bind(built.enqueue)
    reconciler.tasks.bind(built.enqueue)
    return built
