"""Store and index rules: keys, the namespace index, custom indexes kept current."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.kube import store


def obj(name: str, namespace: str | None = "ns", rv: str = "1", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return {"metadata": meta}


def by_pool(o: dict[str, Any]) -> list[str]:
    pool = o["metadata"].get("labels", {}).get("pool")
    return [pool] if pool else []


def test_keys_are_namespace_slash_name_or_bare_name_for_cluster_scoped() -> None:
    assert store.object_key(obj("a", "ns")) == "ns/a"
    assert store.object_key(obj("n", None)) == "n"
    assert store.split_key(store.ObjectKey("ns/a")) == ("ns", "a")
    assert store.split_key(store.ObjectKey("n")) == (None, "n")
    assert store.key_for(namespace=None, name="n") == "n"


def test_namespace_index_lists_objects_of_one_namespace() -> None:
    s = store.Store()
    s.put(obj("a", "one"))
    s.put(obj("b", "one"))
    s.put(obj("c", "two"))
    assert sorted(o["metadata"]["name"] for o in s.list(namespace="one")) == ["a", "b"]
    assert sorted(s.keys(namespace="two")) == ["two/c"]
    assert len(s.list()) == 3


def test_custom_index_follows_updates_and_deletes() -> None:
    s = store.Store()
    s.add_index("pool", by_pool)
    s.put(obj("a", pool="p1"))
    s.put(obj("b", pool="p1"))
    assert {o["metadata"]["name"] for o in s.by_index("pool", "p1")} == {"a", "b"}
    s.put(obj("a", rv="2", pool="p2"))  # moved to another pool
    assert {o["metadata"]["name"] for o in s.by_index("pool", "p1")} == {"b"}
    assert [o["metadata"]["resourceVersion"] for o in s.by_index("pool", "p2")] == ["2"]
    s.pop(store.ObjectKey("ns/b"))
    assert s.by_index("pool", "p1") == []


def test_index_added_late_files_existing_objects() -> None:
    s = store.Store()
    s.put(obj("a", pool="p1"))
    s.add_index("pool", by_pool)
    assert [o["metadata"]["name"] for o in s.by_index("pool", "p1")] == ["a"]


def test_an_object_can_be_filed_under_several_index_values() -> None:
    s = store.Store()
    s.add_index("letters", lambda o: list(o["metadata"]["name"]))
    s.put(obj("abba"))
    assert s.index_keys("letters", "a") == {"ns/abba"}
    assert s.index_keys("letters", "b") == {"ns/abba"}


def test_unknown_index_and_duplicate_index_are_errors() -> None:
    s = store.Store()
    with pytest.raises(KeyError, match="nope"):
        s.by_index("nope", "x")
    with pytest.raises(ValueError, match="namespace"):
        s.add_index("namespace", by_pool)


def test_put_returns_the_replaced_object_and_pop_the_removed_one() -> None:
    s = store.Store()
    first = obj("a")
    assert s.put(first) is None
    assert s.put(obj("a", rv="2")) is first
    popped = s.pop(store.ObjectKey("ns/a"))
    assert popped is not None
    assert popped["metadata"]["resourceVersion"] == "2"
    assert s.pop(store.ObjectKey("ns/a")) is None
    assert "ns/a" not in s


def test_an_index_value_moves_between_one_and_several_keys_without_losing_any() -> None:
    # One key per value is stored bare (memory); sharing and unsharing must be exact.
    s = store.Store()
    s.add_index("pool", by_pool)
    s.put(obj("a", pool="p"))
    assert s.index_keys("pool", "p") == {"ns/a"}
    s.put(obj("b", pool="p"))
    s.put(obj("c", pool="p"))
    assert s.index_keys("pool", "p") == {"ns/a", "ns/b", "ns/c"}
    s.pop(store.ObjectKey("ns/b"))
    s.pop(store.ObjectKey("ns/a"))
    assert s.index_keys("pool", "p") == {"ns/c"}
    s.put(obj("c", rv="2", pool="p"))  # re-filed under the same value
    assert [o["metadata"]["name"] for o in s.by_index("pool", "p")] == ["c"]
    s.put(obj("d", pool="p"))
    assert s.index_keys("pool", "p") == {"ns/c", "ns/d"}
    s.pop(store.ObjectKey("ns/c"))
    s.pop(store.ObjectKey("ns/d"))
    assert s.index_keys("pool", "p") == set()


def test_the_revision_changes_on_every_write_and_only_then() -> None:
    s = store.Store()
    start = s.revision
    s.put(obj("a"))
    after_put = s.revision
    assert after_put != start
    assert s.get(store.key_for(namespace="ns", name="a")) is not None
    assert s.revision == after_put  # reads change nothing
    s.put(obj("a", rv="2"))
    assert s.revision != after_put
    before_pop = s.revision
    assert s.pop(store.key_for(namespace="ns", name="missing")) is None
    assert s.revision == before_pop  # removing nothing is no change
    s.pop(store.key_for(namespace="ns", name="a"))
    assert s.revision != before_pop
