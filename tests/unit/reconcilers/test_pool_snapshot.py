"""The pool's view of the cache: indexes, memoised facts, and the snapshot built from them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from agentforge.api import kinds, names
from agentforge.reconcilers.common import indexes
from agentforge.reconcilers.planning.snapshot import agent_facts, vsphere_agent_facts
from agentforge.reconcilers.pool import pool_snapshot
from agentforge.reconcilers.pool.memo import FactsMemo
from tests.unit.reconcilers.controller_support import harness
from tests.unit.reconcilers.planner_support import (
    CPNS,
    NS,
    agent_machine_obj,
    agent_obj,
    infra_env_obj,
    machine_obj,
    pool,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def test_an_agent_machine_and_its_pool_share_one_index_key() -> None:
    key = indexes.pool_node_pool_key(pool_obj())
    assert key == f"{CPNS}/{NS}/workers"
    assert indexes.control_plane_object_key(agent_machine_obj("am")) == key
    assert indexes.control_plane_object_key(agent_machine_obj("am", node_pool="garbage")) is None


def test_an_agent_belongs_to_its_infra_env_by_label_or_owner() -> None:
    by_owner = agent_obj("a")
    del by_owner["metadata"]["labels"][names.LABEL_INFRAENV]
    by_owner["metadata"]["ownerReferences"] = [
        {"apiVersion": kinds.INFRA_ENV.api_version, "kind": "InfraEnv", "name": "other"}
    ]
    assert indexes.infra_env_of_agent(agent_obj("a")) == "demo"
    assert indexes.infra_env_of_agent(by_owner) == "other"


def test_installing_the_indexes_twice_is_harmless() -> None:
    h = harness(pool_obj())
    indexes.install(h.informers)
    pools = h.informers[kinds.VSPHERE_AGENT_POOL]
    assert len(pools.by_index(indexes.POOLS_BY_NODE_POOL, f"{CPNS}/{NS}/workers")) == 1


def test_facts_are_extracted_once_per_version_and_forgotten_on_change() -> None:
    h = harness(agent_obj("a", bios_uuid=uuid(1)))
    informer = h.informers[kinds.AGENT]
    calls: list[str] = []

    def extract(obj: dict) -> object:  # type: ignore[type-arg]
        calls.append(obj["metadata"]["resourceVersion"])
        return agent_facts(obj)

    memo = FactsMemo(informer=informer, extract=extract)
    (cached,) = informer.list()
    first = memo.facts(cached)
    assert memo.facts(cached) is first
    changed = copy.deepcopy(h.api.objects[("Agent", NS, "a")])
    changed["metadata"]["resourceVersion"] = "999"
    h.api.objects[("Agent", NS, "a")] = changed
    h.sync()
    assert len(memo) == 0
    memo.facts(informer.list()[0])
    assert calls == [cached["metadata"]["resourceVersion"], "999"]


def test_an_object_that_cannot_be_read_is_skipped() -> None:
    h = harness(vsphere_agent_obj("va"))

    def broken(obj: dict) -> object:  # type: ignore[type-arg]
        raise ValueError("unreadable")

    memo = FactsMemo(informer=h.informers[kinds.VSPHERE_AGENT], extract=broken)
    assert memo.all(h.informers[kinds.VSPHERE_AGENT].list()) == []


def test_the_snapshot_holds_the_pools_world_and_other_pools_claims() -> None:
    theirs = vsphere_agent_obj("theirs", pool_name="other", bios_uuid=uuid(9), agent_ref="x")
    h = harness(
        pool_obj(),
        pool_obj(name="twin"),
        infra_env_obj(),
        agent_machine_obj("am-1"),
        agent_machine_obj("elsewhere", node_pool="demo/other"),
        machine_obj("am-1"),
        agent_obj("a1"),
        vsphere_agent_obj("am-1"),
        theirs,
    )
    snapshot = pool_snapshot.SnapshotSource(h.deps).snapshot(pool(), now=NOW)
    assert [am.name for am in snapshot.agent_machines] == ["am-1"]
    assert [m.name for m in snapshot.machines] == ["am-1"]
    assert [a.name for a in snapshot.agents] == ["a1"]
    assert [va.name for va in snapshot.vsphere_agents] == ["am-1"]
    assert [c.vsphere_agent for c in snapshot.claims.by_agent["x"]] == ["theirs"]
    assert snapshot.infra_env is not None
    assert snapshot.competing_pools == ["twin"]
    assert vsphere_agent_facts(theirs).pool == "other"
