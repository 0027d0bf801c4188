"""The `vm` controller's crash and resume table, as fast unit tests over the `VcenterApi`
seam (docs/design/0005 "Crash points"; the same story against vcsim: `tests/vcsim`).

Each row is a crash point: the VsphereAgent's status as the crashed process left it
(its last checkpoint) and what that process had sent to vCenter before it died (staged
on the fake vCenter by the same calls, with a slot of the dead process's registry).
A fresh process (a new `VmReconciler` and its `TaskWaits`, built after the crash, so it
heard none of the dead process's news) runs one pass; then the tasks running end (the
news wakes the key) and passes run until one asks vCenter nothing and writes nothing.

Every row must end the same way: a creation with exactly one VM of that name and BIOS
UUID, ours and running, recorded in status (never a second `CreateVM_Task` while a VM or
a create task exists); a deletion with no VM and the VsphereAgent gone (its finalizer
removed). No change is asked of a VM without our markers, and every `CreateVM_Task` and
power-on saw the creation record stored before it, every deletion step the deletion.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentforge import identity, vsphere
from agentforge.api import kinds, names
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube.controller import Result
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.common import pool_specs
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.reconcilers.vm.context import VcenterApi, VcenterHandle
from agentforge.reconcilers.waits import TASK_RECHECK_S
from tests.unit.reconcilers import ejection_support as es
from tests.unit.reconcilers import planner_support as ps
from tests.unit.reconcilers.controller_support import Harness, harness

JsonObj = dict[str, Any]
KEY = es.KEY
VM, UUID = es.VM, es.UUID
ISO_PATH = f"{es.PREFIX}/{es.SHA}.iso"
WAITING = Result(requeue_after=TASK_RECHECK_S)
MAX_PASSES = 12
CHANGES = ("start_create", "converge_vm", "start_delete", "start_stamp")


def pool_obj() -> JsonObj:
    return ps.pool_obj(status={"iso": {"path": ISO_PATH}})


def pool() -> VsphereAgentPool:
    return VsphereAgentPool.model_validate(pool_obj())


def request() -> vsphere.VmRequest:
    """The create request the dead process sent (as `vm_create` builds it)."""
    p = pool()
    return vsphere.VmRequest(
        name=VM,
        placement=pool_specs.placement(p),
        hardware=pool_specs.hardware(p),
        iso_file=pool_specs.iso_backing(p, ISO_PATH),
        markers=es.markers(),
        tag_ids=(),
        bios_uuid=UUID,
    )


def creation(phase: str, task_ref: str | None) -> JsonObj:
    """`status.creation` as the operator writes it (phase and moref as the row says)."""
    p = pool()
    record: JsonObj = {
        "vmName": VM,
        "biosUUID": UUID,
        "ownership": es.record()["ownership"],
        "datacenter": p.spec.vsphere.datacenter,
        "folder": p.effective_folder(),
        "isoPath": pool_specs.iso_backing(p, ISO_PATH),
        "phase": phase,
        "startedAt": "2026-03-01T11:59:00Z",
    }
    if task_ref:
        record["taskRef"] = task_ref
    return record


def deletion(phase: str, task_ref: str) -> JsonObj:
    return {
        "vmName": VM,
        "biosUUID": UUID,
        "phase": phase,
        "taskRef": task_ref,
        "startedAt": "2026-03-01T11:59:00Z",
    }


# --- the world: API server, fake vCenter, and the process that resumes -----------------------


@dataclass
class World:
    h: Harness
    fake: es.FakeVsphere
    sent: dict[str, str] = field(default_factory=dict)
    """The dead process's tasks, by what they do ("create", "power-on", ...)."""
    woken: list[ObjectKey] = field(default_factory=list)
    reconciler: vm.VmReconciler | None = None

    def dead_slot(self) -> vsphere.Slot:
        """A task slot of the dead process (its registry died with it)."""
        return vsphere.SessionRegistry().claim_task_slot(es.SERVER, group="dead", token="dead")

    def stored(self) -> JsonObj | None:
        return self.h.api.find(kinds.VSPHERE_AGENT, ps.NS, es.VA)

    def writes(self) -> int:
        return sum(1 for c in self.h.api.calls if c.verb != "get")

    def restart(self) -> vm.VmReconciler:
        """The fresh process: its reconciler and task waits hear only news from now on."""
        self.fake.calls.clear()
        self.fake.statuses.clear()
        self.h.sync()
        self.reconciler = vm.VmReconciler(deps=self.h.deps, ejection=ejection.Ejection())
        self.reconciler.tasks.bind(self.woken.append)
        return self.reconciler

    async def run_until_quiet(self) -> list[Result | None]:
        """One pass; then, while tasks run, they end (waking the key) and the next pass
        runs, until a pass asks vCenter nothing and writes nothing."""
        assert self.reconciler is not None
        results: list[Result | None] = []
        for _ in range(MAX_PASSES):
            self.h.sync()
            calls, writes = len(self.fake.calls), self.writes()
            result = await self.reconciler.reconcile(KEY)
            results.append(result)
            running = self.fake.running()
            if running:
                self.woken.clear()
                for task in running:
                    self.fake.end(task)
                if result == WAITING:  # a pass that waits for a task is woken by its end
                    assert KEY in self.woken, f"{running} ended and nobody woke {KEY}"
                continue
            if len(self.fake.calls) == calls and self.writes() == writes:
                return results
        raise AssertionError(f"not quiet after {MAX_PASSES} passes: {self.fake.methods()}")


async def send(w: World, action: str) -> None:
    """What the dead process sent (or what vCenter did meanwhile: "... ends")."""
    fake = w.fake
    if action.endswith(" ends"):
        fake.end(w.sent[action.removesuffix(" ends")])
    elif action == "create":
        started = await fake.start_create(request=request(), slot=w.dead_slot())
        assert started.task is not None
        w.sent["create"] = started.task
    elif action == "power-on":
        vm_now = fake.named(VM)[0]
        task = await fake.converge_vm(request=request(), vm_moid=vm_now.moid, slot=w.dead_slot())
        assert task is not None
        w.sent["power-on"] = task
    elif action in ("power-off", "destroy"):
        step = await fake.start_delete(
            datacenter="dc1", bios_uuid=UUID, markers=es.markers(), slot=w.dead_slot()
        )
        assert (step.action.replace(" ", "-"), step.task is not None) == (action, True)
        assert step.task is not None
        w.sent[action] = step.task
    elif action == "forgotten":  # vCenter no longer knows the create task
        del fake.tasks[w.sent["create"]]
    else:
        raise AssertionError(action)


def world(va: JsonObj, monkeypatch: pytest.MonkeyPatch) -> World:
    h = harness(pool_obj(), va)
    fake = es.FakeVsphere(api=h.api, registry=h.deps.vsphere, vm=None, slow=True)

    async def service(self: VcenterHandle) -> VcenterApi:
        return fake

    monkeypatch.setattr(VcenterHandle, "service", service)
    return World(h=h, fake=fake)


def vsphere_agent(*, deleting: bool = False, **vm_status: Any) -> JsonObj:
    obj = ps.vsphere_agent_obj(es.VA, vm_name=VM, deleting=deleting, **vm_status)
    obj["metadata"]["generation"] = 1
    obj["metadata"]["finalizers"] = [names.FINALIZER_VSPHERE_AGENT]
    return obj


def checkpoints(w: World, method: str) -> list[JsonObj]:
    """The stored status at each call of `method` (what the process had written)."""
    return [status for m, status in w.fake.statuses if m == method]


def same(a: str | None, b: str | None) -> bool:
    return (
        a is not None and b is not None and identity.normalize_uuid(a) == identity.normalize_uuid(b)
    )


# --- creation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Creation:
    phase: str | None
    """The checkpoint's `status.creation.phase` (None: nothing recorded yet)."""
    recorded: str | None = None
    """The dead process's task whose moref the record holds."""
    sent: tuple[str, ...] = ()
    identity: bool = False
    """`status.vm` holds the VM's identity too (recorded with a `PowerOnIssued`)."""


CREATION_ROWS = {
    "nothing recorded yet": Creation(None),
    "intent recorded, CreateVM not sent": Creation("CreateIssued"),
    "intent recorded (Recorded, earlier version), CreateVM not sent": Creation("Recorded"),
    "CreateVM sent, moref not recorded, task running": Creation("CreateIssued", sent=("create",)),
    "CreateVM sent, moref not recorded, task done": Creation(
        "CreateIssued", sent=("create", "create ends")
    ),
    "CreateIssued and moref recorded, task running": Creation(
        "CreateIssued", "create", ("create",)
    ),
    "create succeeded, Created not recorded": Creation(
        "CreateIssued", "create", ("create", "create ends")
    ),
    "create recorded, vCenter forgot the task, VM there": Creation(
        "CreateIssued", "create", ("create", "create ends", "forgotten")
    ),
    "Created recorded (earlier version), power-on not sent": Creation(
        "Created", "create", ("create", "create ends")
    ),
    "power-on sent, not noted, still running": Creation(
        "CreateIssued", "create", ("create", "create ends", "power-on")
    ),
    "power-on sent and done, not noted": Creation(
        "CreateIssued", "create", ("create", "create ends", "power-on", "power-on ends")
    ),
    "PowerOnIssued recorded (earlier version), power-on running": Creation(
        "PowerOnIssued", "power-on", ("create", "create ends", "power-on"), identity=True
    ),
    "PowerOnIssued recorded (earlier version), power-on done": Creation(
        "PowerOnIssued",
        "power-on",
        ("create", "create ends", "power-on", "power-on ends"),
        identity=True,
    ),
}


@pytest.mark.parametrize("row", CREATION_ROWS.values(), ids=CREATION_ROWS.keys())
async def test_a_creation_resumed_from_any_crash_point_makes_exactly_one_vm(
    row: Creation, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world(vsphere_agent(), monkeypatch)
    for action in row.sent:
        await send(w, action)
    stored = w.stored()
    assert stored is not None
    if row.phase is not None:
        task_ref = w.sent[row.recorded] if row.recorded else None
        stored["status"]["creation"] = creation(row.phase, task_ref)
    if row.identity:
        made = w.fake.named(VM)[0]
        stored["status"]["vm"].update(
            biosUUID=UUID, macAddress=es.MAC.replace(":", "-"), moRef=made.moid
        )
    w.restart()

    await w.run_until_quiet()

    made_vms = w.fake.named(VM)
    assert len(made_vms) == 1, [v.moid for v in w.fake.inventory()]
    made = made_vms[0]
    assert len(w.fake.inventory()) == 1
    assert len(w.fake.creates) == 1, "a second CreateVM_Task"
    if "create" in row.sent:  # not even asked for (vCenter's name reservation is no excuse)
        assert "start_create" not in w.fake.methods()
    assert w.h.events.reasons().count("VMCreated") == 1
    assert [e.reason for e in w.h.events.events if e.type == "Warning"] == []
    assert (made.owner, made.power) == (es.markers(), vsphere.PowerState.ON)
    final = w.stored()
    assert final is not None
    status = final["status"]
    assert "creation" not in status
    assert same(status["vm"].get("biosUUID"), made.bios_uuid)
    if row.phase is not None:
        assert same(made.bios_uuid, UUID)  # the recorded UUID, never a new one
    ready = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert ready["Ready"] == ("True", "VMReady")
    assert w.fake.not_ours == []
    for before in checkpoints(w, "start_create") + checkpoints(w, "converge_vm"):
        recorded = before.get("creation") or {}
        assert recorded.get("vmName") == VM
        assert same(recorded.get("biosUUID"), made.bios_uuid)


# --- deletion --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deletion:
    sent: tuple[str, ...] = ()
    recorded: tuple[str, str] | None = None
    """(`status.deletion.phase`, the dead process's task its moref names)."""
    creating: str | None = None
    """A creation record left too (its phase; its moref: the create sent)."""
    warnings: tuple[str, ...] = ()
    """The Warning events the resumed deletion reports on its way."""


DELETION_ROWS = {
    "deletion asked, nothing sent": Deletion(),
    "power-off sent, not noted, running": Deletion(("power-off",)),
    "power-off sent and done, not noted": Deletion(("power-off", "power-off ends")),
    "PowerOffIssued recorded (earlier version), running": Deletion(
        ("power-off",), ("PowerOffIssued", "power-off")
    ),
    # The second Destroy_Task meets the first one (TaskInProgress): reported as a failed
    # destroy once (attempts counted), then the VM is found gone.
    "destroy sent, not recorded, running": Deletion(
        ("power-off", "power-off ends", "destroy"), warnings=("VMDeleteFailed",)
    ),
    "DestroyIssued recorded, destroy running": Deletion(
        ("power-off", "power-off ends", "destroy"), ("DestroyIssued", "destroy")
    ),
    "DestroyIssued recorded, destroy done, record not cleared": Deletion(
        ("power-off", "power-off ends", "destroy", "destroy ends"), ("DestroyIssued", "destroy")
    ),
    "destroy done, nothing recorded": Deletion(
        ("power-off", "power-off ends", "destroy", "destroy ends")
    ),
    "deleted while the recorded CreateVM runs": Deletion(("create",), creating="CreateIssued"),
}


@pytest.mark.parametrize("row", DELETION_ROWS.values(), ids=DELETION_ROWS.keys())
async def test_a_deletion_resumed_from_any_crash_point_leaves_no_vm(
    row: Deletion, monkeypatch: pytest.MonkeyPatch
) -> None:
    if row.creating:
        va = vsphere_agent(deleting=True)
    else:
        va = vsphere_agent(deleting=True, bios_uuid=UUID, mac_address=es.MAC)
    w = world(va, monkeypatch)
    if not row.creating:
        w.fake.place(es.FakeVm(power=vsphere.PowerState.ON))  # ours, running
    for action in row.sent:
        await send(w, action)
    stored = w.stored()
    assert stored is not None
    if row.recorded is not None:
        phase, task = row.recorded
        stored["status"]["deletion"] = deletion(phase, w.sent[task])
    if row.creating:
        stored["status"]["creation"] = creation(row.creating, w.sent["create"])
    w.restart()

    await w.run_until_quiet()

    assert w.fake.named(VM) == []
    assert w.fake.inventory() == []
    assert w.stored() is None  # the finalizer went, and with it the record
    assert w.fake.not_ours == []
    assert len(w.fake.creates) == (1 if row.creating else 0)
    assert "start_create" not in w.fake.methods()
    assert tuple(e.reason for e in w.h.events.events if e.type == "Warning") == row.warnings
    for before in checkpoints(w, "start_delete"):
        assert before["deleting"]
        recorded = (before.get("vm") or {}).get("biosUUID") or (
            (before.get("creation") or {}).get("biosUUID")
        )
        assert same(recorded, UUID)


# --- a VM that is not ours: found at a crash point, never touched ----------------------------


async def test_a_resumed_creation_leaves_a_vm_of_another_owner_holding_the_name_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(vsphere_agent(), monkeypatch)
    theirs = es.FakeVm(owner=es.markers("someone-else"), bios_uuid=ps.uuid(8), moid="vm-8")
    w.fake.place(theirs)
    stored = w.stored()
    assert stored is not None
    stored["status"]["creation"] = creation("CreateIssued", None)
    resumed = w.restart()
    before = copy.deepcopy(theirs)
    for _ in range(3):  # retried with backoff: the same answer every time
        w.h.sync()
        assert await resumed.reconcile(KEY) == Result(requeue=True)
    assert not {m for m in w.fake.methods() if m in CHANGES}
    assert w.fake.inventory() == [before]
    final = w.stored()
    assert final is not None
    ready = {c["type"]: c["reason"] for c in final["status"]["conditions"]}
    assert ready["Ready"] == "VMNameConflict"


async def test_a_deletion_leaves_a_vm_of_another_owner_with_the_recorded_uuid_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world(vsphere_agent(deleting=True, bios_uuid=UUID, mac_address=es.MAC), monkeypatch)
    theirs = es.FakeVm(owner=es.markers("someone-else"))
    w.fake.place(theirs)
    w.restart()
    await w.run_until_quiet()
    assert not {m for m in w.fake.methods() if m in CHANGES}
    assert w.fake.inventory() == [theirs]
    assert w.stored() is None  # the finalizer went; the VM stays
    assert "VMOwnershipMismatch" in w.h.events.reasons()
