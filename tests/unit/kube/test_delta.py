"""Which handler events an observation produces (the relist-diff rules)."""

from __future__ import annotations

from typing import Any

from agentforge.kube import store
from agentforge.kube.store import ChangeType


def obj(name: str, rv: str, namespace: str = "ns", uid: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
        }
    }


def kinds(changes: list[store.Change]) -> list[tuple[str, str]]:
    return [(c.type.value, c.key) for c in changes]


def test_an_unseen_object_is_added() -> None:
    s = store.Store()
    assert kinds(store.apply_upsert(s, obj("a", "1"))) == [("ADDED", "ns/a")]


def test_an_object_whose_resource_version_did_not_change_produces_no_event() -> None:
    s = store.Store()
    store.apply_upsert(s, obj("a", "1"))
    assert store.apply_upsert(s, obj("a", "1")) == []


def test_a_new_resource_version_is_an_update_with_old_and_new() -> None:
    s = store.Store()
    store.apply_upsert(s, obj("a", "1"))
    (change,) = store.apply_upsert(s, obj("a", "2"))
    assert change.type is ChangeType.UPDATED
    assert change.old is not None
    assert change.old["metadata"]["resourceVersion"] == "1"
    assert change.new is not None
    assert change.new["metadata"]["resourceVersion"] == "2"


def test_a_recreated_object_is_a_delete_then_an_add() -> None:
    s = store.Store()
    store.apply_upsert(s, obj("a", "1", uid="u1"))
    changes = store.apply_upsert(s, obj("a", "5", uid="u2"))
    assert kinds(changes) == [("DELETED", "ns/a"), ("ADDED", "ns/a")]
    assert changes[0].object["metadata"]["uid"] == "u1"
    assert changes[1].object["metadata"]["uid"] == "u2"


def test_a_delete_of_an_uncached_object_produces_no_event() -> None:
    s = store.Store()
    assert store.apply_delete(s, obj("ghost", "3")) == []


def test_a_delete_carries_the_final_state() -> None:
    s = store.Store()
    store.apply_upsert(s, obj("a", "1"))
    (change,) = store.apply_delete(s, obj("a", "4"))
    assert change.type is ChangeType.DELETED
    assert change.object["metadata"]["resourceVersion"] == "4"
    assert "ns/a" not in s


def test_relist_emits_adds_updates_and_deletes_only_for_what_changed() -> None:
    s = store.Store()
    for o in (obj("same", "1"), obj("changed", "1"), obj("gone", "1")):
        store.apply_upsert(s, o)
    relist = store.Relist(s, namespace=None)
    changes = relist.apply([obj("same", "1"), obj("changed", "7")])
    changes += relist.apply([obj("new", "8")])  # a second page
    changes += relist.finish()
    assert kinds(changes) == [
        ("UPDATED", "ns/changed"),
        ("ADDED", "ns/new"),
        ("DELETED", "ns/gone"),
    ]
    assert sorted(s.keys()) == ["ns/changed", "ns/new", "ns/same"]


def test_relist_of_one_namespace_leaves_other_namespaces_alone() -> None:
    s = store.Store()
    store.apply_upsert(s, obj("a", "1", namespace="one"))
    store.apply_upsert(s, obj("b", "1", namespace="two"))
    relist = store.Relist(s, namespace="one")
    changes = relist.apply([]) + relist.finish()
    assert kinds(changes) == [("DELETED", "one/a")]
    assert s.keys() == ["two/b"]
