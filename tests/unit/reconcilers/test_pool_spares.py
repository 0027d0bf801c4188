"""The pool controller with warm spares (`spec.spares`): the calls it makes, in order.

Against the fake API of `controller_support`: spares are created with their own
label and a spare selection value; a ready spare is handed to a waiting AgentMachine
(record, label, then its Agent gets the pool labels) and replaced, with no
VsphereAgent made for the AgentMachine; a name held by an object of someone else is
skipped; the surplus is cleaned up under `cleanupPolicy: Delete` only; kept spares
at rest cost no request; status and metrics show them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from agentforge.api import kinds, names
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.pool import reconcile as pool
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    LABELS,
    NS,
    POOL,
    agent_machine_obj,
    agent_obj,
    ago,
    infra_env_obj,
    machine_obj,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/{POOL}")
SPARE_0 = naming.spare_name(pool=POOL, index=0)
SPARE_1 = naming.spare_name(pool=POOL, index=1)


async def reconcile(h: Harness) -> object:
    return await pool.PoolReconciler(h.deps).reconcile(KEY)


def spare_obj(name: str, n: int, **kw: object) -> dict[str, Any]:
    return vsphere_agent_obj(
        name,
        vm_name=f"vm-{n}",
        bios_uuid=uuid(n),
        created=ago(minutes=5),
        agent_machine=naming.spare_selection(vsphere_agent=name),
        created_for=names.CreatedFor.SPARE.value,
        **kw,  # type: ignore[arg-type]
    )


def created(h: Harness) -> list[str]:
    return [c.name for c in h.api.calls if c.verb == "create"]


def status(h: Harness) -> dict[str, Any]:
    found = h.api.find(kinds.VSPHERE_AGENT_POOL, NS, POOL)
    assert found is not None
    return found.get("status") or {}


async def test_a_pool_creates_its_spares_labelled_for_no_agent_machine() -> None:
    h = harness(pool_obj(spares=2), infra_env_obj())
    await reconcile(h)
    spares = [h.api.find(kinds.VSPHERE_AGENT, NS, n) for n in (SPARE_0, SPARE_1)]
    for name, va in zip((SPARE_0, SPARE_1), spares, strict=True):
        assert va is not None
        labels = va["metadata"]["labels"]
        assert labels[names.LABEL_CREATED_FOR] == "spare"
        assert labels[names.LABEL_AGENT_MACHINE] == naming.spare_selection(vsphere_agent=name)
        assert va["metadata"]["ownerReferences"][0]["uid"] == "pool-uid"
    assert status(h)["spares"] == {"wanted": 2, "ready": 0, "creating": 2}
    assert status(h)["availableAgents"] == 0
    assert "SparesCreated" in h.events.reasons()
    labels = {"namespace": NS, "pool": POOL}
    assert REGISTRY.get_sample_value("agent_forge_pool_spares", {**labels, "state": "wanted"}) == 2
    assert REGISTRY.get_sample_value("agent_forge_pool_spares", {**labels, "state": "ready"}) == 0


async def test_a_ready_spares_agent_gets_only_the_spare_label_and_stays_unbindable() -> None:
    h = harness(pool_obj(spares=1), infra_env_obj(), spare_obj(SPARE_0, 1),
                agent_obj("a1", bios_uuid=uuid(1)))  # fmt: skip
    await reconcile(h)
    agent = h.api.find(kinds.AGENT, NS, "a1")
    assert agent is not None
    labels = agent["metadata"]["labels"]
    assert naming.is_spare_selection(labels[names.LABEL_AGENT_MACHINE])
    assert not set(LABELS) & set(labels)
    assert names.LABEL_NODEPOOL not in labels
    assert (agent["spec"]["hostname"], agent["spec"]["approved"]) == ("vm-1", True)
    assert created(h) == []
    assert status(h)["spares"] == {"wanted": 1, "ready": 1, "creating": 0}
    assert status(h)["availableAgents"] == 0

    # at rest: no request, no event
    h.sync()
    await reconcile(h)
    h.sync()
    h.api.calls.clear()
    h.events.events.clear()
    assert await reconcile(h) is None
    assert h.api.calls == []
    assert h.events.events == []


async def test_a_waiting_agent_machine_gets_the_ready_spare_and_a_replacement_is_made() -> None:
    h = harness(pool_obj(spares=1), infra_env_obj(), spare_obj(SPARE_0, 1, phase="Available",
                reason="AgentAvailable", agent_ref="a1", transition=ago(minutes=4)),
                agent_obj("a1", bios_uuid=uuid(1)))  # fmt: skip
    await reconcile(h)  # the spare's Agent prepared as a spare
    h.sync()
    h.api.put(agent_machine_obj("am-1"), machine_obj("am-1"))
    h.sync()
    h.api.calls.clear()
    await reconcile(h)
    verbs = h.api.verbs()
    label_moved = verbs.index(("patch", "VsphereAgent", SPARE_0))
    assert verbs.index(("update-status", "VsphereAgent", SPARE_0)) < label_moved
    assert label_moved < verbs.index(("patch", "Agent", "a1"))
    va = h.api.find(kinds.VSPHERE_AGENT, NS, SPARE_0)
    assert va is not None
    assert va["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-1"
    agent = h.api.find(kinds.AGENT, NS, "a1")
    assert agent is not None
    assert {k: agent["metadata"]["labels"].get(k) for k in LABELS} == LABELS
    assert agent["metadata"]["labels"][names.LABEL_AGENT_MACHINE] == "am-1"
    assert created(h) == [SPARE_1]  # the replacement; nothing for am-1
    assert h.api.find(kinds.VSPHERE_AGENT, NS, "am-1") is None
    assert {"VsphereAgentHandedOver", "SparesCreated"} <= set(h.events.reasons())
    handed = [e.message for e in h.events.events if e.reason == "VsphereAgentHandedOver"]
    assert "warm spare" in handed[0]


async def test_a_spare_name_held_by_someone_else_is_skipped() -> None:
    foreign = vsphere_agent_obj(SPARE_0, pool_name="other", agent_machine="x")
    h = harness(pool_obj(spares=1), infra_env_obj(), foreign)
    await reconcile(h)
    assert created(h) == [SPARE_1]
    theirs = h.api.find(kinds.VSPHERE_AGENT, NS, SPARE_0)
    assert theirs is not None
    assert theirs["metadata"]["labels"][names.LABEL_POOL] == "other"


async def test_surplus_spares_go_under_delete_and_stay_under_retain() -> None:
    for policy, deleted in (("Delete", [SPARE_1]), ("Retain", [])):
        h = harness(pool_obj(spares=1, cleanupPolicy=policy), infra_env_obj(),
                    spare_obj(SPARE_0, 1), agent_obj("a1", bios_uuid=uuid(1)),
                    spare_obj(SPARE_1, 2))  # fmt: skip
        await reconcile(h)
        assert [c.name for c in h.api.calls if c.verb == "delete"] == deleted, policy
        assert created(h) == [], policy
