"""What wakes the pool controller: event -> pool key mapping and the update filters."""

from __future__ import annotations

import copy

from agentforge.api import kinds, names
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.pool import watches as pool_watches
from tests.unit.reconcilers.controller_support import harness
from tests.unit.reconcilers.planner_support import (
    NS,
    POOL,
    agent_machine_obj,
    agent_obj,
    infra_env_obj,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/{POOL}")


def mappers() -> pool_watches.Mappers:
    other = pool_obj(name="sharing-infra-env", node_pool="blue")
    unrelated = pool_obj(name="unrelated", node_pool="green")
    unrelated["spec"]["infraEnvRef"] = {"name": "another"}
    h = harness(pool_obj(), other, unrelated)
    return pool_watches.Mappers(pools=h.informers[kinds.VSPHERE_AGENT_POOL])


def test_agent_machines_map_to_the_pool_of_their_nodepool() -> None:
    m = mappers()
    assert list(m.control_plane_object(agent_machine_obj("am"))) == [KEY]
    assert list(m.control_plane_object(agent_machine_obj("am", node_pool="demo/x"))) == []


def test_agents_and_infra_envs_map_to_every_pool_of_the_infra_env() -> None:
    m = mappers()
    expected = {KEY, ObjectKey(f"{NS}/sharing-infra-env")}
    assert set(m.agent(agent_obj("a"))) == expected
    assert set(m.infra_env(infra_env_obj())) == expected


def test_vsphere_agents_map_to_their_pool_and_the_pools_they_may_claim_from() -> None:
    m = mappers()
    assert set(m.vsphere_agent(vsphere_agent_obj("va"))) == {
        KEY,
        ObjectKey(f"{NS}/sharing-infra-env"),
    }


def test_a_vsphere_agents_task_chain_wakes_only_its_own_pool() -> None:
    m = mappers()
    assert list(m.vsphere_agent_pool(vsphere_agent_obj("va"))) == [KEY]
    old = vsphere_agent_obj("va")
    new = copy.deepcopy(old)
    new["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "PoweringOn"}]
    new["status"]["creation"] = {"task": "task-1"}
    new["metadata"]["finalizers"] = [names.FINALIZER_VSPHERE_AGENT]
    assert pool_watches.vsphere_agent_changed(old, new)  # its own pool replans
    assert not pool_watches.claim_changed(old, new)  # the pools sharing the InfraEnv do not


def test_a_vsphere_agents_claim_wakes_the_pools_sharing_the_infra_env() -> None:
    old = vsphere_agent_obj("va")
    for change in (
        {"biosUUID": uuid(1)},
        {"macAddress": "00:50:56:00:00:01"},
        {"agentRef": {"name": "agent-1"}},
        {"name": "renamed-vm"},
    ):
        new = copy.deepcopy(old)
        new["status"]["vm"].update(change)
        assert pool_watches.claim_changed(old, new), change
    deleted = copy.deepcopy(old)
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pool_watches.claim_changed(old, deleted)
    moved = copy.deepcopy(old)
    moved["metadata"]["labels"][names.LABEL_POOL] = "another"
    assert pool_watches.claim_changed(old, moved)
    unreadable = copy.deepcopy(old)
    unreadable["metadata"]["labels"] = ["not", "a", "map"]
    assert pool_watches.claim_changed(unreadable, copy.deepcopy(unreadable))


def test_agent_condition_churn_does_not_replan() -> None:
    old = agent_obj("a", bios_uuid=uuid(1))
    new = copy.deepcopy(old)
    new["status"]["conditions"] = [{"type": "Connected", "status": "True", "reason": "x"}]
    assert not pool_watches.agent_changed(old, new)
    new["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] = "am"
    assert pool_watches.agent_changed(old, new)


def test_the_pools_own_vm_fields_do_not_replan_but_the_vm_identity_does() -> None:
    old = vsphere_agent_obj("va")
    new = copy.deepcopy(old)
    new["status"]["vm"].update(phase="Available", reason="AgentAvailable")
    assert not pool_watches.vsphere_agent_changed(old, new)
    new["status"]["vm"]["biosUUID"] = uuid(1)
    assert pool_watches.vsphere_agent_changed(old, new)


def test_pool_status_writes_replan_only_for_the_infra_conditions() -> None:
    old = pool_obj()
    new = copy.deepcopy(old)
    new["status"] = {"agentMachines": 3, "ownedVMs": []}
    assert not pool_watches.pool_changed(old, new)
    new["status"]["conditions"] = [{"type": "VsphereReady", "status": "True", "reason": "OK"}]
    assert pool_watches.pool_changed(old, new)
