"""Spreading over failure domains, end to end: the vm, spread-rules and infra controllers
(and for the pool's deletion the whole operator) on the real control plane and a
simulator of its own with two clusters of two hosts each.

What it shows (issue 15): after creating N VMs over H hosts no host holds more than
ceil(N/H) of the pool's VMs; a disconnected host held at most that many and receives no
new VM; a domain that cannot take VMs is skipped with a condition, never silently; each
VM's domain and host are recorded before it is created, and kept; the pool's DRS rule
per cluster follows its VMs, and deleting the pool removes it from every cluster and
leaves everyone else's rules alone.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentforge.api import kinds, wire
from agentforge.api.vsphereagent import CreationPhase, CreationRecord, Ownership
from agentforge.kube import client, events
from agentforge.vsphere import vmomi
from agentforge.vsphere.vmomi import vim
from sim.actors.waiting import eventually
from sim.controlplane.controlplane import ControlPlane
from sim.vcsim.launcher import Vcsim
from tests.kube.reconcilers_support import Operator, running_operator
from tests.kube.reconcilers_world import DEADLINE, SECRET, World, world_for

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

VA = kinds.VSPHERE_AGENT
POOL = kinds.VSPHERE_AGENT_POOL
DOMAINS = [
    {"name": "zone-a", "computeCluster": "cluster", "datastoreCluster": "dsc1"},
    {"name": "zone-b", "computeCluster": "cluster2", "datastore": "ds2"},
]


@pytest.fixture
async def spread_world(
    current_crds: None,
    kube: client.KubeClient,
    namespace: str,
    vcsim_factory: Callable[..., Vcsim],
) -> AsyncIterator[World]:
    sim = vcsim_factory(clusters=2, hosts=2)
    async with world_for(kube=kube, namespace=namespace, vcsim=sim) as built:
        yield built


async def spread_pool(world: World, domains: list[dict[str, Any]]) -> str:
    """Create a spread pool (ISO ready); return the prefix of its DRS rules' names."""
    await world.create_secret()
    await world.create_infra_env()
    await world.create_pool(vsphere={"spreadPolicy": "Spread", "failureDomains": domains})
    await world.condition(POOL, "pool", "ISOReady", status="True")
    pool = await world.get(POOL, "pool")
    assert pool is not None
    return f"agent-forge-spread-{pool['metadata']['uid']}-"


async def create_all(world: World, names: list[str]) -> list[dict[str, Any]]:
    await asyncio.gather(*(world.create_vsphere_agent(n) for n in names))
    return [await world.condition(VA, n, "Ready", status="True", reason="VMReady") for n in names]


async def hosts_of_vms(world: World) -> dict[str, str]:
    """VM name -> the name of the host vCenter runs it on (read from vCenter)."""
    session = await world.service.session()
    content = session.content

    def read() -> dict[str, str]:
        view = content.viewManager.CreateContainerView(
            content.rootFolder, [vim.VirtualMachine], True
        )
        try:
            found = vmomi.retrieve(
                content,
                objects=vmomi.object_specs(view.view),
                props=[(vim.VirtualMachine, ["name", "runtime.host"])],
            )
        finally:
            view.Destroy()
        return {
            str(f.props["name"]): str(f.props["runtime.host"].name)
            for f in found
            if f.props.get("runtime.host") is not None
        }

    return await asyncio.to_thread(read)


def placement_of(va: dict[str, Any]) -> dict[str, Any]:
    return (va.get("status") or {}).get("placement") or {}


async def test_n_vms_over_h_hosts_hold_at_most_ceil_n_over_h_each_and_a_lost_host_costs_that_many(
    spread_world: World,
) -> None:
    world = spread_world
    cluster_of = {
        h.name: cluster
        for cluster in ("cluster", "cluster2")
        for h in await world.service.cluster_hosts(datacenter="dc1", cluster=cluster)
    }
    all_hosts = sorted(cluster_of)
    assert len(all_hosts) == 4
    first = [f"va{i}" for i in range(6)]
    async with world.run():
        await spread_pool(world, DOMAINS)
        vas = await create_all(world, first)
        where = await hosts_of_vms(world)
        ours = {world.vm_name(n): where[world.vm_name(n)] for n in first}
        per_host = Counter(ours.values())
        bound = math.ceil(len(first) / len(all_hosts))
        assert max(per_host.values()) <= bound, per_host
        assert set(per_host) == set(all_hosts)  # every host used: fewest first
        # the choice was recorded and kept (the creation record is gone), and it is true
        per_domain = Counter(placement_of(va)["failureDomain"] for va in vas)
        assert per_domain == {"zone-a": 3, "zone-b": 3}
        for name, va in zip(first, vas, strict=True):
            assert (va["status"]).get("creation") is None
            assert placement_of(va)["host"] == ours[world.vm_name(name)]

        # a host fails: it held at most the bound, and no new VM goes to it
        lost = per_host.most_common(1)[0][0]
        assert per_host[lost] <= bound
        await world.govc("host.disconnect", f"/dc1/host/{cluster_of[lost]}/{lost}")
        more = ["va6", "va7", "va8"]
        created = await create_all(world, more)
        where = await hosts_of_vms(world)
        new_hosts = Counter(where[world.vm_name(n)] for n in more)
        assert lost not in new_hosts, new_hosts
        assert lost not in {placement_of(va)["host"] for va in created}


async def test_an_unusable_domain_is_skipped_with_a_condition_and_said_in_the_event(
    spread_world: World,
) -> None:
    world = spread_world
    domains = [DOMAINS[0], {"name": "zone-gone", "computeCluster": "gone", "datastore": "ds1"}]
    async with world.run():
        await spread_pool(world, domains)
        ready = await world.condition(
            POOL, "pool", "VsphereReady", status="True", reason="FailureDomainUnusable"
        )
        message = next(c for c in ready["status"]["conditions"] if c["type"] == "VsphereReady")[
            "message"
        ]
        assert "zone-gone" in message
        assert "new VMs go to zone-a only" in message
        vas = await create_all(world, ["va0", "va1"])
        assert {placement_of(va)["failureDomain"] for va in vas} == {"zone-a"}

        async def skip_said() -> bool:
            events = await world.events("VMCreating")
            return any("skipped: zone-gone" in e.get("message", "") for e in events)

        # two VMs in a burst: one Event on the pool, created 30 s after the second
        await eventually(
            skip_said,
            what="a VMCreating event naming the skipped domain",
            within=events.FLUSH_INTERVAL_S + DEADLINE,
        )


async def test_a_resumed_creation_uses_the_recorded_domain_and_host_never_a_new_choice(
    spread_world: World,
) -> None:
    """A record left by a crash before CreateVM names zone-b and its last host; a fresh
    choice would take zone-a (a tie goes by name). The VM is created where recorded."""
    world = spread_world
    hosts = await world.service.cluster_hosts(datacenter="dc1", cluster="cluster2")
    target = hosts[-1].name
    async with world.run(vm_controller=False):
        await spread_pool(world, DOMAINS)
    pool = await world.get(POOL, "pool")
    assert pool is not None
    await world.create_vsphere_agent("va0")
    record = CreationRecord(
        vm_name=world.vm_name("va0"),
        bios_uuid=str(uuid.uuid4()),
        ownership=Ownership(
            pool_namespace=world.namespace,
            pool_name="pool",
            pool_uid=pool["metadata"]["uid"],
            vsphere_agent="va0",
        ),
        datacenter="dc1",
        folder=world.folder,
        iso_path=f"[iso-ds] {pool['status']['iso']['path']}",
        phase=CreationPhase.CREATE_ISSUED,
        started_at=pool["metadata"]["creationTimestamp"],
        failure_domain="zone-b",
        host=target,
    )

    def crashed_after_checkpoint(obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("status", {})["creation"] = wire.to_wire(record)
        obj["status"]["vm"] = {"name": record.vm_name}
        return obj

    await world.kube.update_status(
        VA, namespace=world.namespace, name="va0", mutate=crashed_after_checkpoint
    )
    async with world.run():
        va = await world.condition(VA, "va0", "Ready", status="True", reason="VMReady")
    assert placement_of(va) == {"failureDomain": "zone-b", "host": target}
    assert va["status"]["vm"]["biosUUID"] == record.bios_uuid
    assert (await hosts_of_vms(world))[record.vm_name] == target


async def anti_affinity_rules(world: World, cluster: str) -> dict[str, set[str]]:
    """Rule name -> VM morefs of every anti-affinity rule of a cluster (read from vCenter)."""
    session = await world.service.session()
    content = session.content

    def read() -> dict[str, set[str]]:
        ref = content.searchIndex.FindByInventoryPath(inventoryPath=f"dc1/host/{cluster}")
        found = vmomi.retrieve(
            content,
            objects=vmomi.object_specs([ref]),
            props=[(vim.ClusterComputeResource, ["configurationEx"])],
        )
        rules = getattr(found[0].props.get("configurationEx"), "rule", None) or []
        return {
            r.name: {v._moId for v in r.vm or []}
            for r in rules
            if isinstance(r, vim.cluster.AntiAffinityRuleSpec)
        }

    return await asyncio.to_thread(read)


async def test_the_pools_anti_affinity_rule_follows_its_vms_and_goes_with_them(
    spread_world: World,
) -> None:
    world = spread_world
    names = [f"va{i}" for i in range(4)]
    async with world.run():
        marker = await spread_pool(world, DOMAINS)
        vas = await create_all(world, names)
        moref = {va["metadata"]["name"]: va["status"]["vm"]["moRef"] for va in vas}
        domain = {va["metadata"]["name"]: placement_of(va)["failureDomain"] for va in vas}
        cluster = {"zone-a": "cluster", "zone-b": "cluster2"}

        async def rules_hold(want: dict[str, set[str]]) -> bool:
            for where, members in want.items():
                mine = {
                    n: m
                    for n, m in (await anti_affinity_rules(world, where)).items()
                    if n.startswith(marker)
                }
                if list(mine.values()) != ([members] if len(members) >= 2 else []):
                    return False
            return True

        def members(zone: str, gone: str = "") -> set[str]:
            return {moref[n] for n in names if domain[n] == zone and n != gone}

        want = {cluster[z]: members(z) for z in ("zone-a", "zone-b")}
        assert all(len(m) == 2 for m in want.values())
        await eventually(
            lambda: rules_hold(want), what="one rule per cluster holding the pool's VMs there"
        )

        # one VM of zone-a goes: a rule of one VM means nothing, so it is removed
        leaving = next(n for n in names if domain[n] == "zone-a")
        await world.kube.delete(VA, namespace=world.namespace, name=leaving)
        want = {cluster[z]: members(z, leaving) for z in ("zone-a", "zone-b")}
        await eventually(lambda: rules_hold(want), what="the zone-a rule removed, zone-b's kept")
        assert len(want["cluster"]) == 1

        # the pool's VsphereAgents go (as the pool controller deletes them with the pool,
        # cleanupPolicy Delete): their VMs go, and the pool's rules with them
        for name in names:
            if name != leaving:
                await world.kube.delete(VA, namespace=world.namespace, name=name)
        empty: dict[str, set[str]] = {"cluster": set(), "cluster2": set()}
        await eventually(lambda: rules_hold(empty), what="no rule of the pool left")


@pytest.fixture
async def spread_operator(
    spread_world: World, controlplane: ControlPlane
) -> AsyncIterator[tuple[World, Operator]]:
    """The whole operator in-process (scaleup, pool, infra, vm, spread-rules), as the app
    runs it, over the spread world's namespace and simulator."""
    world = spread_world
    await world.create_secret()
    async with running_operator(
        controlplane,
        namespaces=[world.namespace],
        vsphere_controllers=True,
        registry=world.registry,  # its session is up before the test body
    ) as op:
        await op.deps.credentials.get(
            namespace=world.namespace, name=SECRET, for_namespace=world.namespace
        )
        yield world, op


async def test_deleting_the_pool_removes_its_rules_from_every_cluster_and_no_other(
    spread_operator: tuple[World, Operator],
) -> None:
    """The pool controller's deletion path (cleanupPolicy Delete): its VsphereAgents and
    VMs go, the `spread-rules` finalizer holds the pool until the rule named with its UID
    is gone from every domain cluster; a rule of someone else (another name, or the
    prefix with another pool's UID) is untouched."""
    world, _ = spread_operator
    names = [f"va{i}" for i in range(4)]
    await world.create_infra_env()
    await world.create_pool(vsphere={"spreadPolicy": "Spread", "failureDomains": DOMAINS})
    await world.condition(POOL, "pool", "ISOReady", status="True")
    pool = await world.get(POOL, "pool")
    assert pool is not None
    marker = f"agent-forge-spread-{pool['metadata']['uid']}-"
    theirs = "agent-forge-spread-00000000-0000-0000-0000-000000000000-other-pool"
    for i in (1, 2):
        await world.unmarked_vm(f"other{i}", folder="other-team")
    for rule in ("someone-elses-rule", theirs):
        await world.govc(
            "cluster.rule.create",
            "-cluster",
            "/dc1/host/cluster",
            "-name",
            rule,
            "-enable",
            "-anti-affinity",
            "other1",
            "other2",
        )
    before = await anti_affinity_rules(world, "cluster")
    foreign = {n: m for n, m in before.items() if not n.startswith(marker)}
    assert set(foreign) == {"someone-elses-rule", theirs}
    await create_all(world, names)

    async def mine_in_both() -> bool:
        for where in ("cluster", "cluster2"):
            rules = await anti_affinity_rules(world, where)
            if not any(n.startswith(marker) for n in rules):
                return False
        return True

    await eventually(mine_in_both, what="the pool's rule in both clusters")
    held = await world.get(POOL, "pool")
    assert held is not None
    assert "agent-forge.containeroo.ch/spread-rules" in held["metadata"]["finalizers"]

    await world.kube.delete(POOL, namespace=world.namespace, name="pool")

    async def pool_gone() -> bool:
        return await world.get(POOL, "pool") is None

    await eventually(pool_gone, what="the pool to be gone (its finalizers released)")
    for where in ("cluster", "cluster2"):
        left = await anti_affinity_rules(world, where)
        assert not [n for n in left if n.startswith(marker)], (where, left)
    after = await anti_affinity_rules(world, "cluster")
    assert {n: after.get(n) for n in foreign} == foreign  # untouched, members too
    assert await world.events("SpreadRuleUpdated")
    assert not await world.events("SpreadRuleFailed")


async def test_a_failed_rule_change_is_said_on_the_pool_and_retried_until_the_rule_holds(
    spread_world: World,
) -> None:
    """vCenter refuses the first two rule changes (NoPermission): a Warning on the pool
    names the cluster and the fix, and the rule converges by the controller's own retry,
    with no VM created or deleted after the failure."""
    world = spread_world
    names = [f"va{i}" for i in range(4)]
    async with world.run():
        marker = await spread_pool(world, DOMAINS)
        await world.vcsim.control.fail_next_tasks(
            "ReconfigureComputeResource_Task", n=2, fault="NoPermission"
        )
        vas = await create_all(world, names)
        morefs: dict[str, set[str]] = {"cluster": set(), "cluster2": set()}
        for va in vas:
            where = {"zone-a": "cluster", "zone-b": "cluster2"}[placement_of(va)["failureDomain"]]
            morefs[where].add(va["status"]["vm"]["moRef"])

        async def failed() -> list[dict[str, Any]]:
            return await world.events("SpreadRuleFailed")

        warnings = await eventually(failed, what="a SpreadRuleFailed event")
        assert warnings[0]["type"] == "Warning"
        assert warnings[0]["involvedObject"]["kind"] == "VsphereAgentPool"
        message = warnings[0]["message"]
        assert "cluster cluster" in message
        assert "Modify cluster" in message
        assert "retried with backoff" in message

        async def rules_hold() -> bool:
            for where, members in morefs.items():
                mine = [
                    m
                    for n, m in (await anti_affinity_rules(world, where)).items()
                    if n.startswith(marker)
                ]
                if mine != [members]:
                    return False
            return True

        await eventually(rules_hold, what="both rules to hold the pool's VMs after the retries")
        assert (await world.vcsim.control.fault_rules())["rules"] == []  # both failures used
        assert sorted(v.name for v in await world.vms()) == sorted(world.vm_name(n) for n in names)
