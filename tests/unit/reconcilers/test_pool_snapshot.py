"""The pool's view of the cache: indexes, the records parsed at cache time, the snapshot."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from agentforge.api import kinds, names
from agentforge.kube.informer import Informer
from agentforge.kube.store import key_for
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.planning.snapshot import AgentFacts, vsphere_agent_facts
from agentforge.reconcilers.pool import observed as pool_snapshot
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


def test_the_snapshot_reads_the_record_of_each_objects_current_version() -> None:
    """Records are parsed at cache time: the snapshot sees a changed object's new
    version and no longer sees a deleted one, without parsing anything itself."""
    h = harness(pool_obj(), infra_env_obj(), agent_obj("a1", bios_uuid=uuid(1)), agent_obj("a2"))
    source = pool_snapshot.SnapshotSource(h.deps)
    informer = h.informers[kinds.AGENT]
    before = records.record(informer, key_for(namespace=NS, name="a1"), AgentFacts)
    assert before is not None
    assert [a.bios_uuid for a in source.snapshot(pool(), now=NOW).agents if a.name == "a1"] == [
        before.bios_uuid
    ]
    changed = copy.deepcopy(h.api.objects[("Agent", NS, "a1")])
    changed["spec"]["hostname"] = "renamed"
    changed["metadata"]["resourceVersion"] = "999"
    h.api.objects[("Agent", NS, "a1")] = changed
    del h.api.objects[("Agent", NS, "a2")]
    h.sync()
    after = records.record(informer, key_for(namespace=NS, name="a1"), AgentFacts)
    assert after is not None
    assert after is not before
    assert after.spec_hostname == "renamed"
    assert records.record(informer, key_for(namespace=NS, name="a2"), AgentFacts) is None
    assert [(a.name, a.spec_hostname) for a in source.snapshot(pool(), now=NOW).agents] == [
        ("a1", "renamed")
    ]


def test_an_object_that_cannot_be_read_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    unreadable = agent_obj("odd")
    unreadable["spec"]["approved"] = "maybe"
    with caplog.at_level("WARNING"):
        h = harness(pool_obj(), infra_env_obj(), agent_obj("a1"), unreadable)
    assert h.informers[kinds.AGENT].get(namespace=NS, name="odd") is not None, "still cached"
    snapshot = pool_snapshot.SnapshotSource(h.deps).snapshot(pool(), now=NOW)
    assert [a.name for a in snapshot.agents] == ["a1"]
    (logged,) = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert f"Agent {NS}/odd" in logged


def test_an_informer_built_without_the_kinds_parser_is_a_wiring_mistake() -> None:
    h = harness(agent_obj("a1"))
    bare = Informer(client=h.api, kind=kinds.AGENT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Agent informer keeps no records"):
        records.record(bare, key_for(namespace=NS, name="a1"), AgentFacts)


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


def test_claims_are_kept_until_a_vsphere_agent_changes_and_differ_per_pool() -> None:
    theirs = vsphere_agent_obj("theirs", pool_name="other", bios_uuid=uuid(9), agent_ref="x")
    h = harness(
        pool_obj(),
        pool_obj(name="other"),
        infra_env_obj(),
        vsphere_agent_obj("am-1", bios_uuid=uuid(1), agent_ref="mine"),
        theirs,
    )
    source = pool_snapshot.SnapshotSource(h.deps)
    first = source.snapshot(pool(), now=NOW).claims
    assert source.snapshot(pool(), now=NOW).claims is first  # nothing changed: reused
    assert [c.vsphere_agent for c in first.by_agent["x"]] == ["theirs"]
    assert "mine" not in first.by_agent  # its own VsphereAgent is no claim
    other = source.snapshot(pool(name="other"), now=NOW).claims
    assert [c.vsphere_agent for c in other.by_agent["mine"]] == ["am-1"]
    assert "x" not in other.by_agent
    changed = copy.deepcopy(h.api.objects[("VsphereAgent", NS, "theirs")])
    changed["status"]["vm"]["agentRef"] = {"kind": "Agent", "name": "y", "namespace": NS}
    changed["metadata"]["resourceVersion"] = "999"
    h.api.objects[("VsphereAgent", NS, "theirs")] = changed
    h.sync()
    after = source.snapshot(pool(), now=NOW).claims
    assert after is not first
    assert [c.vsphere_agent for c in after.by_agent["y"]] == ["theirs"]
    assert "x" not in after.by_agent
