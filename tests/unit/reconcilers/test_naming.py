"""Deterministic names: stable across restarts, valid where they are used."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from agentforge.reconcilers.planning import naming

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
names_ = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,200}[a-z0-9])?", fullmatch=True)


def test_the_vsphere_agent_for_an_agent_machine_is_named_after_it() -> None:
    assert naming.vsphere_agent_name(agent_machine="workers-7d9f8-x2x4q") == "workers-7d9f8-x2x4q"


def test_the_fallback_name_is_stable_and_differs_per_pool() -> None:
    a = naming.vsphere_agent_fallback_name(namespace="demo", pool="p1", agent_machine="am")
    b = naming.vsphere_agent_fallback_name(namespace="demo", pool="p2", agent_machine="am")
    assert a == naming.vsphere_agent_fallback_name(namespace="demo", pool="p1", agent_machine="am")
    assert a != b
    assert re.fullmatch(r"am-p1-[0-9a-f]{10}", a)


@given(names_, names_)
def test_the_fallback_name_is_a_valid_object_name(pool: str, agent_machine: str) -> None:
    name = naming.vsphere_agent_fallback_name(
        namespace="ns", pool=pool, agent_machine=agent_machine
    )
    assert len(name) <= naming.MAX_OBJECT_NAME
    assert SUBDOMAIN.fullmatch(name)


@given(st.text(min_size=0, max_size=80), names_)
def test_vm_names_are_dns_labels_and_deterministic(prefix: str, vsphere_agent: str) -> None:
    name = naming.vm_name(name_prefix=prefix, namespace="demo", vsphere_agent=vsphere_agent)
    assert DNS_LABEL.fullmatch(name)
    assert name == naming.vm_name(name_prefix=prefix, namespace="demo", vsphere_agent=vsphere_agent)


def test_vm_names_carry_the_prefix_and_a_digest_of_namespace_and_vsphere_agent() -> None:
    one = naming.vm_name(name_prefix="demo-worker", namespace="a", vsphere_agent="x")
    other = naming.vm_name(name_prefix="demo-worker", namespace="b", vsphere_agent="x")
    assert re.fullmatch(r"demo-worker-[0-9a-f]{8}", one)
    assert one != other


def test_a_short_agent_machine_name_is_its_own_selection_label_value() -> None:
    assert naming.selection_label_value(agent_machine="workers-abc") == "workers-abc"


@given(names_)
def test_selection_label_values_are_valid_label_values_and_stable(agent_machine: str) -> None:
    value = naming.selection_label_value(agent_machine=agent_machine)
    assert LABEL_VALUE.fullmatch(value)
    assert len(value) <= 63
    assert value == naming.selection_label_value(agent_machine=agent_machine)
    if len(agent_machine) <= 63:
        assert value == agent_machine


def test_long_agent_machine_names_get_distinct_selection_values() -> None:
    a = naming.selection_label_value(agent_machine="x" * 70 + "a")
    b = naming.selection_label_value(agent_machine="x" * 70 + "b")
    assert a != b
