"""The `spread-rules` controller's decisions (`spread_rules`): which VMs each domain
cluster's rule holds, a reconfigure started and never waited for, its outcome read on
the next pass, a failure reported for a retry, and nothing asked of vCenter once the
rule is confirmed.

The vCenter side is a stand-in answering `start_anti_affinity`, `task` and
`follow_task` (a pure unit: the real calls, the task waiter's wake-up and the pool's
deletion are shown in tests/kube/test_reconcilers_spread.py)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agentforge import vsphere
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.spread import reconcile as spread_rules
from agentforge.vsphere.model.facts import TaskFacts, TaskState
from tests.unit.api.support import MINIMAL_SPEC, pool_object

DOMAINS = [
    {"name": "zone-a", "computeCluster": "/cluster-a", "datastore": "ds-a"},
    {"name": "zone-b", "computeCluster": "cluster-b", "datastore": "ds-b"},
]


def spread_pool(*, policy: str = "Spread", deleting: bool = False) -> VsphereAgentPool:
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec["vsphere"] |= {"spreadPolicy": policy, "failureDomains": DOMAINS}
    raw = pool_object(spec)
    raw["metadata"]["uid"] = "uid-1"
    if deleting:
        raw["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return VsphereAgentPool.model_validate(raw)


def agent(
    name: str, *, domain: str | None, moref: str | None, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    status: dict[str, Any] = {}
    if domain:
        status["placement"] = {"failureDomain": domain, "host": "h"}
    if moref:
        status["vm"] = {"moRef": moref}
    return {"metadata": meta, "status": status}


class Vcenter:
    """Answers like vCenter: a reconfigure is a task that runs until `finish`."""

    def __init__(self) -> None:
        self.rules: dict[str, tuple[str, ...]] = {}
        self.started: list[tuple[str, tuple[str, ...]]] = []
        self.tasks: dict[str, TaskFacts] = {}
        self.pending: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.fail_start: dict[str, str] = {}
        self.followed: list[str] = []

    async def start_anti_affinity(
        self, *, datacenter: str, cluster: str, pool_uid: str, name: str, vm_moids: list[str]
    ) -> tuple[str, str | None]:
        if cluster in self.fail_start:
            raise vsphere.VsphereError(self.fail_start[cluster], subject=f"cluster {cluster}")
        members = tuple(vm_moids)
        have = self.rules.get(cluster)
        if (have or ()) == members or (have is None and len(members) < 2):
            return "none", None
        action = "remove" if len(members) < 2 else ("edit" if have else "add")
        task = f"task-{len(self.started) + 1}"
        self.started.append((cluster, members))
        self.tasks[task] = TaskFacts(moid=task, state=TaskState.RUNNING)
        self.pending[task] = (cluster, members)
        return action, task

    def finish(self, task: str, *, error: str | None = None) -> None:
        cluster, members = self.pending.pop(task)
        if error is None:
            self.tasks[task] = TaskFacts(moid=task, state=TaskState.SUCCESS)
            if len(members) < 2:
                self.rules.pop(cluster, None)
            else:
                self.rules[cluster] = members
        else:
            fault = vsphere.VsphereError(error, subject=f"cluster {cluster}")
            self.tasks[task] = TaskFacts(moid=task, state=TaskState.ERROR, error=fault)

    async def task(self, *, task_ref: str) -> TaskFacts:
        if task_ref not in self.tasks:
            raise vsphere.NotFound(f"vCenter no longer knows task {task_ref}", subject=task_ref)
        return self.tasks[task_ref]

    async def follow_task(self, *, task_ref: str) -> None:
        self.followed.append(task_ref)


AGENTS = [
    agent("a1", domain="zone-a", moref="vm-1"),
    agent("a2", domain="zone-a", moref="vm-2"),
    agent("b1", domain="zone-b", moref="vm-3"),
    agent("creating", domain="zone-b", moref=None),
    agent("leaving", domain="zone-b", moref="vm-4", deleting=True),
    agent("unplaced", domain=None, moref="vm-5"),
]


def test_members_are_the_recorded_vms_not_being_deleted_per_domain_cluster() -> None:
    want = spread_rules.members_by_cluster(spread_pool(), AGENTS)
    assert want == {"cluster-a": ("vm-1", "vm-2"), "cluster-b": ("vm-3",)}


def test_a_pool_being_deleted_or_no_longer_spreading_wants_no_rule_anywhere() -> None:
    for pool in (spread_pool(deleting=True), spread_pool(policy="None")):
        assert spread_rules.members_by_cluster(pool, AGENTS) == {
            "cluster-a": (),
            "cluster-b": (),
        }


async def sync(
    sync: spread_rules.RuleSync, vc: Vcenter, want: Mapping[str, tuple[str, ...]]
) -> spread_rules.Outcome:
    return await sync.sync(vc, spread_pool(), want)  # type: ignore[arg-type]


async def test_a_change_is_started_not_waited_for_and_its_outcome_read_on_the_next_pass() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    want = {"cluster-a": ("vm-1", "vm-2"), "cluster-b": ("vm-3",)}
    first = await sync(rules, vc, want)
    assert first.waiting == ["task-1"]  # started, and the pass ends
    assert vc.started == [("cluster-a", ("vm-1", "vm-2"))]

    running = await sync(rules, vc, want)  # woken by something else: still running
    assert running.waiting == ["task-1"]
    assert vc.followed == ["task-1"]
    assert len(vc.started) == 1  # never a second reconfigure for the same change

    vc.finish("task-1")
    done = await sync(rules, vc, want)
    assert (done.waiting, done.failed) == ([], [])
    assert done.changed == ["add in cluster-a"]

    vc.started.clear()
    again = await sync(rules, vc, want)  # confirmed: vCenter is not asked
    assert (again.waiting, again.failed) == ([], [])
    assert not again.changed
    assert vc.started == []


async def test_a_task_the_waiter_follows_is_not_asked_about() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    want = {"cluster-a": ("vm-1", "vm-2")}
    await sync(rules, vc, want)
    outcome = await rules.sync(vc, spread_pool(), want, awaiting=lambda task: True)  # type: ignore[arg-type]
    assert outcome.waiting == ["task-1"]
    assert vc.followed == []


async def test_a_failed_task_is_reported_once_then_started_again() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    want = {"cluster-a": ("vm-1", "vm-2")}
    await sync(rules, vc, want)
    vc.finish("task-1", error="permission to perform this operation was denied")
    failed = await sync(rules, vc, want)
    assert failed.failed == ["cluster cluster-a: permission to perform this operation was denied"]
    assert len(vc.started) == 1  # the retry comes with the next pass (the backoff)

    retried = await sync(rules, vc, want)
    assert retried.waiting == ["task-2"]
    vc.finish("task-2")
    finished = await sync(rules, vc, want)
    assert (finished.waiting, finished.failed) == ([], [])
    assert vc.rules == {"cluster-a": ("vm-1", "vm-2")}


async def test_a_failed_start_names_its_cluster_and_the_others_go_on() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    vc.fail_start["cluster-a"] = "compute cluster cluster-a not found in datacenter dc1"
    want = {"cluster-a": ("vm-1", "vm-2"), "cluster-b": ("vm-3", "vm-4")}
    outcome = await sync(rules, vc, want)
    assert outcome.failed == [
        "cluster cluster-a: compute cluster cluster-a not found in datacenter dc1"
    ]
    assert outcome.waiting == ["task-1"]
    assert vc.started == [("cluster-b", ("vm-3", "vm-4"))]


async def test_a_task_vcenter_forgot_makes_the_rule_be_read_again() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    want = {"cluster-a": ("vm-1", "vm-2")}
    await sync(rules, vc, want)
    vc.rules["cluster-a"] = ("vm-1", "vm-2")  # it succeeded, and vCenter forgot the task
    del vc.tasks["task-1"]
    vc.pending.clear()
    outcome = await sync(rules, vc, want)
    assert (outcome.waiting, outcome.failed) == ([], [])
    assert len(vc.started) == 1  # read again: nothing left to change


async def test_the_members_changing_start_an_edit_then_a_removal() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    await sync(rules, vc, {"cluster-a": ("vm-1", "vm-2")})
    vc.finish("task-1")
    await sync(rules, vc, {"cluster-a": ("vm-1", "vm-2")})
    edit = await sync(rules, vc, {"cluster-a": ("vm-1", "vm-2", "vm-9")})
    assert edit.waiting == ["task-2"]
    vc.finish("task-2")
    assert (await sync(rules, vc, {"cluster-a": ("vm-1", "vm-2", "vm-9")})).changed == [
        "edit in cluster-a"
    ]
    gone = await sync(rules, vc, {"cluster-a": ()})
    assert gone.waiting == ["task-3"]
    vc.finish("task-3")
    assert (await sync(rules, vc, {"cluster-a": ()})).changed == ["remove in cluster-a"]
    assert vc.rules == {}


async def test_settled_only_once_every_cluster_is_confirmed_and_no_task_runs() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    want = {"cluster-a": ("vm-1", "vm-2"), "cluster-b": ()}
    assert not rules.settled("uid-1", want)  # nothing known (a fresh process)
    await sync(rules, vc, want)
    assert not rules.settled("uid-1", want)  # cluster-a's task runs
    vc.finish("task-1")
    await sync(rules, vc, want)
    assert rules.settled("uid-1", want)
    assert not rules.settled("uid-1", {**want, "cluster-b": ("vm-3", "vm-4")})
    rules.forget("uid-1")
    assert not rules.settled("uid-1", want)


async def test_a_cluster_that_is_gone_needs_no_rule_unless_vms_are_recorded_there() -> None:
    vc, rules = Vcenter(), spread_rules.RuleSync()
    vc.fail_start["cluster-b"] = "compute cluster cluster-b not found in datacenter dc1"

    async def start(**kwargs: Any) -> tuple[str, str | None]:
        if kwargs["cluster"] in vc.fail_start:
            raise vsphere.NotFound(vc.fail_start[kwargs["cluster"]], subject="cluster-b")
        return await Vcenter.start_anti_affinity(vc, **kwargs)

    vc.start_anti_affinity = start  # type: ignore[method-assign]
    empty = await sync(rules, vc, {"cluster-b": ()})
    assert (empty.waiting, empty.failed) == ([], [])  # a deleted pool is not held by it
    held = await sync(rules, vc, {"cluster-b": ("vm-3", "vm-4")})
    assert held.failed == [
        "cluster cluster-b: compute cluster cluster-b not found in datacenter dc1"
    ]
