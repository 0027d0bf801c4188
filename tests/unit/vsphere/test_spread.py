"""Spreading a pool over failure domains and hosts: the pure choice (`model.spread`).

Properties: after N VMs placed one by one over H usable hosts no host holds more than
ceil(N/H), so a lost host costs at most that many; unusable buckets are never chosen
and always reported; the anti-affinity rule is only ever one the pool proves it owns.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentforge.vsphere.model import spread
from agentforge.vsphere.model.spread import Bucket


def fair_share(vms: int, hosts: int) -> int:
    """ceil(vms / hosts): the most any host holds when the pool is spread."""
    return math.ceil(vms / hosts)


def _place(buckets: list[Bucket], n: int) -> list[Bucket]:
    """Place n VMs one at a time, each where `choose` says."""
    for _ in range(n):
        choice = spread.choose(buckets)
        assert choice.chosen is not None
        buckets = [
            dataclasses.replace(b, vms=b.vms + 1) if b.name == choice.chosen.name else b
            for b in buckets
        ]
    return buckets


frees = st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=12)


@given(frees=frees, n=st.integers(min_value=0, max_value=200))
def test_no_host_holds_more_than_its_fair_share(frees: list[int], n: int) -> None:
    hosts = [Bucket(name=f"esx-{i}", vms=0, free=f) for i, f in enumerate(frees)]
    placed = _place(hosts, n)
    assert sum(b.vms for b in placed) == n
    assert max(b.vms for b in placed) <= fair_share(n, len(hosts))
    # one disconnected host costs at most the fair share
    assert all(b.vms <= fair_share(n, len(hosts)) for b in placed)


@given(
    frees=frees,
    down=st.data(),
    before=st.integers(min_value=0, max_value=60),
    after=st.integers(min_value=0, max_value=60),
)
def test_after_a_host_is_lost_the_rest_stay_fair(
    frees: list[int], down: st.DataObject, before: int, after: int
) -> None:
    hosts = _place([Bucket(name=f"esx-{i}", vms=0, free=f) for i, f in enumerate(frees)], before)
    lost = down.draw(st.integers(min_value=0, max_value=len(hosts) - 1))
    assert hosts[lost].vms <= fair_share(before, len(hosts))
    hosts[lost] = dataclasses.replace(hosts[lost], unusable="host disconnected")
    if len(hosts) == 1:
        assert spread.choose(hosts).chosen is None
        return
    spread_before = [b.vms for b in hosts if not b.unusable]
    placed = _place(hosts, after)
    assert placed[lost].vms == hosts[lost].vms  # nothing goes to the lost host
    live = [b.vms for i, b in enumerate(placed) if i != lost]
    assert max(live) - min(live) <= max(1, max(spread_before) - min(spread_before))


@given(
    domains=st.integers(min_value=1, max_value=4),
    per_domain=st.integers(min_value=1, max_value=5),
    n=st.integers(min_value=0, max_value=120),
)
def test_domains_then_hosts_keep_every_host_within_ceil_n_over_h(
    domains: int, per_domain: int, n: int
) -> None:
    """The two-step choice (domain, then host in it) over equal domains: the global bound."""
    load = {
        d: [Bucket(f"d{d}-esx{h}", 0, free=h) for h in range(per_domain)] for d in range(domains)
    }
    for _ in range(n):
        domain = spread.choose_domain(
            Bucket(f"d{d}", sum(b.vms for b in hosts)) for d, hosts in load.items()
        ).chosen
        assert domain is not None
        d = int(domain.name[1:])
        host = spread.choose_host(load[d]).chosen
        assert host is not None
        load[d] = [dataclasses.replace(b, vms=b.vms + (b == host)) for b in load[d]]
    every = [b.vms for hosts in load.values() for b in hosts]
    assert max(every) <= fair_share(n, domains * per_domain)


def test_ties_go_to_the_most_free_then_the_name() -> None:
    a, b, c = Bucket("a", 1, free=5), Bucket("b", 1, free=9), Bucket("c", 0, free=0)
    assert spread.choose([a, b, c]).chosen == c
    assert spread.choose([a, b]).chosen == b
    assert spread.choose([Bucket("y", 1, 3), Bucket("x", 1, 3)]).chosen == Bucket("x", 1, 3)


def test_unusable_buckets_are_skipped_with_their_reason() -> None:
    full = Bucket("zone-b", 0, free=0, unusable="datastore ds-b is full")
    gone = Bucket("zone-c", 0, unusable="cluster c not found")
    choice = spread.choose([Bucket("zone-a", 7, free=1), gone, full])
    assert choice.chosen is not None
    assert choice.chosen.name == "zone-a"
    assert [(b.name, b.unusable) for b in choice.skipped] == [
        ("zone-b", "datastore ds-b is full"),
        ("zone-c", "cluster c not found"),
    ]
    none = spread.choose([full])
    assert none.chosen is None
    assert none.skipped == (full,)


UID = "0b1c2d3e-0000-4000-8000-000000000001"


@pytest.mark.parametrize("pool", ["a-b", "a--------------------------------------b", "x" * 63])
def test_a_cut_rule_name_keeps_the_uid_and_ends_on_no_separator(pool: str) -> None:
    for namespace in ("ns", "clusters-c34-94709-a", "n" * 63):
        name = spread.rule_name(pool_uid=UID, namespace=namespace, pool=pool)
        assert len(name) <= 80
        assert not name.endswith("-")
        assert spread.owned_rule([name], pool_uid=UID) == name


def test_only_a_rule_with_prefix_and_uid_is_ours() -> None:
    ours = spread.rule_name(pool_uid=UID, namespace="ns", pool="workers")
    assert ours.startswith(spread.RULE_PREFIX)
    assert UID in ours
    assert len(ours) <= 80
    assert (
        spread.owned_rule([ours, "admin-rule", f"{spread.RULE_PREFIX}-other"], pool_uid=UID) == ours
    )
    assert (
        spread.owned_rule(["admin-rule", f"agent-forge-spread-{UID[:-1]}x-ns-p"], pool_uid=UID)
        is None
    )
    assert spread.owned_rule([ours], pool_uid="") is None
    twice = [ours, ours + "-copy"]
    assert spread.owned_rule(twice, pool_uid=UID) is None  # ambiguous: touch neither


def test_rule_follows_the_vms_and_goes_below_two() -> None:
    assert spread.rule_change(existing=None, members=["vm-1"]).action == "none"
    assert spread.rule_change(existing=None, members=["vm-2", "vm-1"]) == spread.RuleChange(
        "add", ("vm-1", "vm-2")
    )
    assert spread.rule_change(existing=["vm-2", "vm-1"], members=["vm-1", "vm-2"]).action == "none"
    assert spread.rule_change(existing=["vm-1", "vm-2"], members=["vm-1", "vm-3"]).action == "edit"
    assert spread.rule_change(existing=["vm-1", "vm-2"], members=["vm-1"]).action == "remove"
