"""A LIST page decoded to what a kind's trim keeps caches the same as one decoded whole."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agentforge.api import trim
from agentforge.kube import pages
from tests.unit.api.support import read_fixture

TRIMS = {
    "agent.yaml": trim.trim_agent,
    "agentmachine.yaml": trim.trim_agent_machine,
    "machine.yaml": trim.trim_machine,
    "infraenv.yaml": trim.trim_infra_env,
    "go_pool.yaml": trim.trim_vsphere_agent_pool,
    "go_vsphereagent.yaml": trim.trim_vsphere_agent,
}


def _page(*items: dict[str, Any]) -> bytes:
    """A LIST answer of `items`, padded past `pages.SMALL` (smaller ones are read whole)."""
    meta = {"resourceVersion": "42", "continue": "token", "padding": "x" * pages.SMALL}
    return json.dumps({"kind": "List", "metadata": meta, "items": list(items)}).encode()


@pytest.mark.parametrize("name", sorted(TRIMS))
def test_a_decoded_page_trims_to_what_the_whole_page_trims_to(name: str) -> None:
    kept = TRIMS[name]
    obj = copy.deepcopy(read_fixture(name))
    raw = _page(obj, obj)
    decoded = pages.decoder(kept.keep)(raw)
    whole = json.loads(raw)
    assert decoded["metadata"] == whole["metadata"]
    assert [kept(o) for o in decoded["items"]] == [kept(o) for o in whole["items"]]


def test_the_decoder_skips_what_the_trim_drops() -> None:
    agent = copy.deepcopy(read_fixture("agent.yaml"))
    (item,) = pages.decoder(trim.AGENT)(_page(agent))["items"]
    assert "managedFields" not in item["metadata"]
    assert set(item["status"]["inventory"]) <= {"hostname", "interfaces", "systemVendor"}


@pytest.mark.parametrize(
    "odd",
    [
        {"status": {"inventory": {"interfaces": "not a list"}}},
        {"status": {"conditions": None}},
        {"spec": ["not", "a", "mapping"]},
        {"metadata": {"name": "a", "namespace": "b", "labels": {"n": 1}}},
    ],
)
def test_a_page_of_another_shape_is_decoded_whole_and_trimmed_as_before(
    odd: dict[str, Any],
) -> None:
    agent = copy.deepcopy(read_fixture("agent.yaml"))
    agent.update(odd)
    raw = _page(agent)
    decoded = pages.decoder(trim.AGENT)(raw)
    assert [trim.trim_agent(o) for o in decoded["items"]] == [
        trim.trim_agent(o) for o in json.loads(raw)["items"]
    ]


@pytest.mark.parametrize("size", [16, pages.SMALL])
def test_an_answer_that_is_not_json_fails_as_json_loads_does(size: int) -> None:
    with pytest.raises(ValueError):
        pages.decoder(trim.AGENT)(b"<html>502</html>".ljust(size))


def test_a_small_answer_is_read_whole_with_json_loads() -> None:
    agent = copy.deepcopy(read_fixture("agent.yaml"))
    raw = json.dumps({"metadata": {}, "items": [agent]}).encode()
    assert len(raw) < pages.SMALL
    assert pages.decoder(trim.AGENT)(raw) == json.loads(raw)
