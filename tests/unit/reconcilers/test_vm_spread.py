"""The vm controller's spread inputs (`vm_spread`): counts from the VsphereAgents'
records and this process's pending choices, ties between domains broken by their free
storage, a domain without a usable host skipped and the choice made again, and no
usable domain refused with every reason.

The vCenter side is a stand-in answering `inspect_storage` and `cluster_hosts` (a pure unit:
the real calls are shown in tests/kube/test_reconcilers_spread.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.vm import spread_choice as vm_spread
from agentforge.vsphere.vm.compute_cluster import HostState
from tests.unit.api.support import MINIMAL_SPEC, pool_object

DOMAINS = [
    {"name": "zone-a", "computeCluster": "cluster-a", "datastore": "ds-a"},
    {"name": "zone-b", "computeCluster": "cluster-b", "datastore": "ds-b"},
]


def spread_pool(domains: list[dict[str, Any]] = DOMAINS) -> VsphereAgentPool:
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec["vsphere"] |= {"spreadPolicy": "Spread", "failureDomains": domains}
    return VsphereAgentPool.model_validate(pool_object(spec))


class Vcenter:
    def __init__(
        self,
        hosts: dict[str, list[HostState]],
        broken: frozenset[str] = frozenset(),
        free: dict[str, int] | None = None,
    ) -> None:
        self.hosts = hosts
        self.broken = broken
        self.free = free or {}
        """Free bytes per datastore (0 when not named)."""

    async def inspect_storage(
        self, *, placement: vsphere.Placement
    ) -> tuple[list[vsphere.Problem], int]:
        cluster = placement.resource_pool.removesuffix("/Resources")
        if cluster in self.broken:
            return [vsphere.Problem(f"resource pool {cluster}/Resources", "not found", "fix")], 0
        return [], self.free.get(placement.datastore, 0)

    async def cluster_hosts(
        self, *, datacenter: str, cluster: str, host_group: str | None = None
    ) -> list[HostState]:
        return self.hosts[cluster]


def up(name: str) -> HostState:
    return HostState(name=name, unusable=None, free_mib=1024)


def down(name: str) -> HostState:
    return HostState(name=name, unusable=f"host {name} is disconnected", free_mib=0)


def agent(name: str, *, creation: dict[str, Any] | None = None, **placed: str) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if creation is not None:
        status["creation"] = creation
    if placed:
        status["placement"] = placed
    return {"metadata": {"name": name}, "status": status}


async def choose(
    vc: Vcenter, agents: list[dict[str, Any]], ledger: vm_spread.SpreadLedger | None = None
) -> vm_spread.Spot:
    return await vm_spread.choose(
        vc,  # type: ignore[arg-type]
        spread_pool(),
        agents=agents,
        ledger=ledger or vm_spread.SpreadLedger(),
        pool_key="ns/pool",
    )


HOSTS = {"cluster-a": [up("a1"), up("a2")], "cluster-b": [up("b1"), up("b2")]}


async def test_the_least_loaded_domain_and_host_counted_from_records_and_creations() -> None:
    agents = [
        agent("x", failureDomain="zone-a", host="a1"),
        agent("y", creation={"failureDomain": "zone-a", "host": "a2"}),
        agent("z", failureDomain="zone-b", host="b1"),
        agent("me"),
    ]
    spot = await choose(Vcenter(HOSTS), agents)
    assert (spot.domain.name, spot.host) == ("zone-b", "b2")


async def test_pending_choices_count_until_the_cache_shows_them() -> None:
    ledger = vm_spread.SpreadLedger()
    first = await choose(Vcenter(HOSTS), [agent("one"), agent("two")], ledger)
    ledger.note("ns/pool", "one", first)
    second = await choose(Vcenter(HOSTS), [agent("one"), agent("two")], ledger)
    assert (first.domain.name, second.domain.name) == ("zone-a", "zone-b")
    # once the cache shows "one" recorded, its pending entry is forgotten (not counted twice)
    shown = agent("one", failureDomain="zone-a", host=str(first.host))
    assert ledger.pending("ns/pool", {"one": ("zone-a", first.host), "two": None}) == {}
    third = await choose(Vcenter(HOSTS), [shown, agent("two")], ledger)
    assert third.domain.name == "zone-b"


async def test_tied_domains_go_to_the_one_with_the_most_free_storage() -> None:
    gib = 1 << 30
    # by name zone-a would win the tie; zone-b's datastore has more free space
    spot = await choose(Vcenter(HOSTS, free={"ds-a": 10 * gib, "ds-b": 50 * gib}), [agent("me")])
    assert spot.domain.name == "zone-b"
    tied = [agent("x", failureDomain="zone-a", host="a1"), agent("me")]
    # free space only breaks ties: the domain holding fewer of the pool's VMs still wins
    spot = await choose(Vcenter(HOSTS, free={"ds-a": 50 * gib, "ds-b": 10 * gib}), tied)
    assert spot.domain.name == "zone-b"
    spot = await choose(Vcenter(HOSTS, free={"ds-a": 50 * gib, "ds-b": 10 * gib}), [agent("me")])
    assert spot.domain.name == "zone-a"


async def test_a_domain_without_a_usable_host_is_skipped_and_another_chosen() -> None:
    hosts = {"cluster-a": [down("a1"), down("a2")], "cluster-b": [up("b1"), down("b2")]}
    spot = await choose(Vcenter(hosts), [agent("me")])
    assert (spot.domain.name, spot.host) == ("zone-b", "b1")


async def test_no_usable_domain_is_refused_naming_each_reason() -> None:
    hosts = {"cluster-a": [down("a1")], "cluster-b": []}
    with pytest.raises(vm_spread.NoUsableDomain) as refused:
        await choose(Vcenter(hosts), [agent("me")])
    message = str(refused.value)
    assert "zone-a: no host of compute cluster cluster-a can take a VM" in message
    assert "host a1 is disconnected" in message
    assert "zone-b: no host of compute cluster cluster-b can take a VM (it has no hosts)" in message


async def test_an_unusable_domain_is_reported_with_the_choice() -> None:
    spot = await choose(Vcenter(HOSTS, broken=frozenset({"cluster-a"})), [agent("me")])
    assert spot.domain.name == "zone-b"
    assert [b.name for b in spot.skipped] == ["zone-a"]
    assert "skipped: zone-a: resource pool cluster-a/Resources: not found" in spot.describe()


def test_recorded_spot_reads_the_creation_record_then_the_placement() -> None:
    assert vm_spread.recorded_spot(agent("a")) is None
    assert vm_spread.recorded_spot(agent("a", failureDomain="d", host="h")) == ("d", "h")
    assert vm_spread.recorded_spot(agent("a", creation={"failureDomain": "d"})) == ("d", None)
