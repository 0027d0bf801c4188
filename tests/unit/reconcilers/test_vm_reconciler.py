"""The `vm` reconciler over a fake API server: writes per pass, read-your-writes, the bound
Agent guard of a deletion. Only paths that never reach vSphere (`Deps.vsphere` is None)."""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.api import kinds, names
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.vm import create as vm_create
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.reconcilers.vm.context import VcenterHandle
from tests.unit.reconcilers.controller_support import Harness, harness
from tests.unit.reconcilers.planner_support import (
    NS,
    agent_obj,
    ago,
    mac,
    pool_obj,
    uuid,
    vsphere_agent_obj,
)

KEY = ObjectKey(f"{NS}/va1")


def reconciler(h: Harness) -> vm.VmReconciler:
    return vm.VmReconciler(deps=h.deps, ejection=ejection.Ejection())


def conditions(h: Harness) -> dict[str, tuple[str, str]]:
    found = h.api.find(kinds.VSPHERE_AGENT, NS, "va1")
    assert found is not None
    return {c["type"]: (c["status"], c["reason"]) for c in found["status"]["conditions"]}


def status_writes(h: Harness) -> int:
    return sum(1 for c in h.api.calls if c.verb == "update-status" and c.kind == "VsphereAgent")


async def test_the_first_pass_writes_ready_and_the_ejection_controller_waits_for_the_vm() -> None:
    h = harness(pool_obj(), vsphere_agent_obj("va1"))  # no ISO cached yet
    await reconciler(h).reconcile(KEY)
    assert conditions(h) == {"Ready": ("False", "WaitingForISO")}
    assert [(c.verb, c.kind) for c in h.api.calls if c.verb != "get"] == [
        ("patch", "VsphereAgent"),  # the finalizer
        ("update-status", "VsphereAgent"),
    ]
    h.sync()
    step = ejection.Ejection().reconcile
    await vm.VmReconciler(deps=h.deps, name=ejection.CONTROLLER_NAME, step=step).reconcile(KEY)
    assert status_writes(h) == 1  # nothing until the stored VsphereAgent says Ready=True


async def test_a_new_vsphere_agent_waits_quietly_for_its_pools_iso_for_a_few_seconds() -> None:
    # pool and demand made together: the ISO is usually cached before the VsphereAgent
    # needs to say it waits, and its first status write is then its checkpoint
    h = harness(pool_obj(), vsphere_agent_obj("va1", created=ago(seconds=3)))
    result = await reconciler(h).reconcile(KEY)
    assert result is not None
    assert result.requeue_after == pytest.approx(vm_create.WAITING_FOR_ISO_QUIET_S - 3)
    assert status_writes(h) == 0
    found = h.api.find(kinds.VSPHERE_AGENT, NS, "va1")
    assert found is not None
    assert not (found.get("status") or {}).get("conditions")


async def test_a_pass_reports_every_version_it_stored_for_the_read_your_writes_guard() -> None:
    # The controller (kube.controller, tests/unit/kube/test_controller_stale_cache.py)
    # skips a key while its cache shows a version these writes superseded.
    h = harness(pool_obj(), vsphere_agent_obj("va1"))
    cached = h.api.find(kinds.VSPHERE_AGENT, NS, "va1")
    assert cached is not None
    started_from = cached["metadata"]["resourceVersion"]
    r = reconciler(h)
    reported: list[tuple[ObjectKey, str]] = []
    r.bind(lambda key, version: reported.append((key, version)))
    await r.reconcile(KEY)
    stored = h.api.find(kinds.VSPHERE_AGENT, NS, "va1")
    assert stored is not None
    assert [k for k, _ in reported] == [KEY, KEY]  # the finalizer, then the status
    assert reported[-1][1] == stored["metadata"]["resourceVersion"]
    assert started_from not in {v for _, v in reported}
    h.sync()
    h.api.calls.clear()
    reported.clear()
    assert await r.reconcile(KEY) is None  # caught up: steady, nothing to write
    assert h.api.calls == []
    assert reported == []


async def test_a_pass_without_a_pool_writes_its_condition_once() -> None:
    h = harness(vsphere_agent_obj("va1", pool_name="gone"))
    await reconciler(h).reconcile(KEY)
    assert conditions(h) == {"Ready": ("False", "PoolNotFound")}
    assert status_writes(h) == 1


def deleting_va(**vm_status: Any) -> dict[str, Any]:
    va = vsphere_agent_obj("va1", vm_name="vm-1", **vm_status)
    va["metadata"]["finalizers"] = [names.FINALIZER_VSPHERE_AGENT]
    va["metadata"]["deletionTimestamp"] = "2026-03-01T11:00:00Z"
    return va


async def test_a_bound_agent_reporting_the_vms_bios_uuid_holds_the_deletion() -> None:
    # status.vm.agentRef lost (the pool controller cleared it): the cache still knows.
    h = harness(
        pool_obj(),
        deleting_va(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("agent-1", bios_uuid=uuid(1), macs=[mac(1)], bound_to="am-1"),
    )
    result = await reconciler(h).reconcile(KEY)
    assert result is not None
    assert result.requeue_after is not None
    assert conditions(h)["Ready"] == ("False", "VMDeleting")
    warning = next(e for e in h.events.events if e.reason == "VMDeleting")
    assert warning.type == "Warning"
    assert "Agent agent-1 is bound to am-1" in warning.message
    assert f"BIOS UUID {uuid(1)}" in warning.message
    assert [c.verb for c in h.api.calls if c.verb not in ("get", "update-status")] == []


async def test_a_bound_agent_without_bios_uuid_holds_the_deletion_by_mac() -> None:
    h = harness(
        pool_obj(),
        deleting_va(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("agent-1", macs=[mac(1)], cluster="demo"),  # no VMware serial
    )
    await reconciler(h).reconcile(KEY)
    assert conditions(h)["Ready"] == ("False", "VMDeleting")
    assert f"MAC {mac(1)}" in next(e.message for e in h.events.events if e.reason == "VMDeleting")


class VmAlreadyGone:
    """A vSphere service that finds no VM (deleted by hand before the VsphereAgent)."""

    vcenter = "vcenter.example:443"

    async def vm_by_uuid(self, **_: Any) -> None:
        return None

    async def vm_by_name(self, **_: Any) -> None:
        return None


async def test_a_bound_agent_of_another_vm_sharing_the_mac_holds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the VM's own Agent (unbound, tied by BIOS UUID) is deleted, never the
    # Agent of another VM that shares the MAC, bound or not.
    h = harness(
        pool_obj(),
        deleting_va(bios_uuid=uuid(1), mac_address=mac(1)),
        agent_obj("theirs", bios_uuid=uuid(2), macs=[mac(1)], bound_to="am-9"),
        agent_obj("theirs-unbound", bios_uuid=uuid(3), macs=[mac(1)]),
        agent_obj("ours", bios_uuid=uuid(1), macs=[mac(1)]),
    )

    async def service(self: VcenterHandle) -> Any:
        return VmAlreadyGone()

    monkeypatch.setattr(VcenterHandle, "service", service)
    assert await reconciler(h).reconcile(KEY) is None
    deleted = [c.name for c in h.api.calls if c.verb == "delete" and c.kind == "Agent"]
    assert deleted == ["ours"]
    assert "VMDeleting" not in h.events.reasons()
    assert h.api.find(kinds.VSPHERE_AGENT, NS, "va1") is None  # finalizer removed


async def test_the_vm_controllers_queue_takes_turns_between_pools() -> None:
    """A pool's one VsphereAgent queued behind another pool's burst is handed out
    second, not after the burst (the queue's fairness key is the VsphereAgent's pool)."""
    burst = [vsphere_agent_obj(f"big{i}", pool_name="big") for i in range(50)]
    h = harness(*burst, vsphere_agent_obj("one", pool_name="small"))
    built = vm.controller(h.deps)
    for i in range(50):
        built.enqueue(ObjectKey(f"{NS}/big{i}"))
    built.enqueue(ObjectKey(f"{NS}/one"))
    built.enqueue(ObjectKey(f"{NS}/gone"))  # not cached: the group of no pool
    order = [await built.queue.get() for _ in range(len(built.queue))]
    assert order[:3] == [ObjectKey(f"{NS}/big0"), ObjectKey(f"{NS}/one"), ObjectKey(f"{NS}/gone")]
    assert order[3:] == [ObjectKey(f"{NS}/big{i}") for i in range(1, 50)]
