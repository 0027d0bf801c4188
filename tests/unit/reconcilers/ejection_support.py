"""Stand-ins for the ISO ejection tests: raw objects, a scripted VM and a vSphere service.

`FakeVm` behaves as DOMAIN.md section 4 says a vCenter VM does: a disconnect of a
CD-ROM whose door the guest locked keeps its task running and raises the
`msg.cdromdisconnect.locked` question; only that question's id answered "0" completes
it. `FakeVsphere` has the `VsphereService` surface the ejection uses, checks markers,
media and question ids as the real layer does, and records every call together with
the phase of `status.isoEjection` stored in the `FakeApi` at that moment, so a test
can prove a checkpoint came before the vSphere call it guards.

Tasks run as vCenter runs them for the operator (docs/design/0005): a start takes a
slot of the registry, reports the task `IN_PROGRESS` and returns; the task's end (or
the lock question) is news through the registry, which wakes the key through the
controller's `TaskWaits`. A task ends right after it started (or was found running),
unless `FakeVm.slow`: then it runs on until the test calls `FakeVsphere.end`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agentforge import vsphere
from agentforge.api import kinds
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vsphereagent import ISOEjectionRecord, VsphereAgent
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.ejection import decide
from agentforge.reconcilers.ejection.decide import Device, Observation
from agentforge.reconcilers.vm.context import StatusWriter, VcenterHandle, VmInputs
from agentforge.reconcilers.waits import TaskWaits
from agentforge.vsphere.vm import read_facts as vfacts
from tests.unit.reconcilers import planner_support as ps
from tests.unit.reconcilers.controller_support import FakeApi, Harness, harness

JsonObj = dict[str, Any]

UUID = ps.uuid(7)
MAC = ps.mac(7)
VA = "va1"
VM = "vm-va1"
AGENT = "agent1"
DATACENTER = "dc1"
PREFIX = f"agent-forge/{ps.NS}/{ps.POOL}"
SHA = "ab" * 32
ISO = f"[iso-ds] {PREFIX}/{SHA}.iso"
SERVER = "vc.example.test:443"
LOCK = vfacts.CDROM_LOCK_MESSAGE


def markers(vsphere_agent: str = VA) -> vsphere.OwnershipMarkers:
    return vsphere.OwnershipMarkers(
        pool_namespace=ps.NS, pool_name=ps.POOL, pool_uid="pool-uid", vsphere_agent=vsphere_agent
    )


def cdrom(key: int = 3000, backing: str | None = ISO, *, connected: bool = True) -> vsphere.Cdrom:
    return vsphere.Cdrom(
        key=key,
        controller_key=200,
        unit_number=key - 3000,
        kind=vsphere.MediumKind.ISO if backing else vsphere.MediumKind.CLIENT,
        backing_file=backing,
        connected=connected if backing else False,
        start_connected=connected if backing else False,
    )


def question(qid: str = "_vmx1", message: str = LOCK) -> vsphere.Question:
    return vsphere.Question(
        id=qid,
        text="question text",
        message_ids=(message,),
        choices=(vsphere.Choice("0", "Yes"), vsphere.Choice("1", "No")),
    )


def vm_facts(
    *,
    cdroms: tuple[vsphere.Cdrom, ...] = (),
    owner: vsphere.OwnershipMarkers | None = None,
    unmarked: bool = False,
    pending: vsphere.Question | None = None,
    bios_uuid: str = UUID,
    mac: str = MAC,
) -> vsphere.VmFacts:
    return vsphere.VmFacts(
        moid="vm-42",
        name=VM,
        bios_uuid=bios_uuid,
        instance_uuid=ps.uuid(99),
        primary_mac=mac,
        macs=(mac,),
        power_state=vsphere.PowerState.ON,
        markers={} if unmarked else (owner or markers()).to_extra_config(),
        cdroms=cdroms or (cdrom(),),
        question=pending,
    )


def installed_agent(
    name: str = AGENT,
    *,
    installed: str = "True",
    bios_uuid: str = UUID,
    macs: tuple[str, ...] = (MAC,),
    deleting: bool = False,
) -> JsonObj:
    obj = ps.agent_obj(
        name, bios_uuid=bios_uuid, macs=macs, bound_to="am-1", approved=True, deleting=deleting
    )
    reason = "InstallationCompleted" if installed == "True" else "InstallationInProgress"
    obj["status"]["conditions"] = [
        {"type": "Bound", "status": "True", "reason": "Bound"},
        {"type": "Installed", "status": installed, "reason": reason},
    ]
    return obj


def vsphere_agent(**kw: Any) -> JsonObj:
    kw.setdefault("vm_name", VM)
    kw.setdefault("bios_uuid", UUID)
    kw.setdefault("mac_address", MAC)
    kw.setdefault("agent_ref", AGENT)
    kw.setdefault("ready_since", ps.ago(hours=1))
    kw.setdefault("phase", "Bound")
    record = kw.pop("record", None)
    obj = ps.vsphere_agent_obj(VA, **kw)
    obj["metadata"]["generation"] = 1
    obj["metadata"]["finalizers"] = ["agent-forge.containeroo.ch/vsphere-agent"]
    if record is not None:
        obj["status"]["isoEjection"] = record
    return obj


def seen(**kw: Any) -> Observation:
    """An observation of our VM with the recorded CD-ROM attached, unless told otherwise."""
    kw.setdefault("verdict", vsphere.Verdict.OURS)
    kw.setdefault("device", Device.ATTACHED)
    return Observation(**kw)


def step(rec: ISOEjectionRecord, obs: Observation, *, finalizing: bool = False) -> decide.Step:
    """The pure decision for `rec` given `obs`, on the recorded vCenter."""
    return decide.next_step(rec, obs, server=SERVER, finalizing=finalizing)


def record(**fields: Any) -> JsonObj:
    """A stored `status.isoEjection`, as this operator writes it."""
    base: JsonObj = {
        "vmName": VM,
        "biosUUID": UUID,
        "ownerUID": f"uid-va-{VA}",
        "ownership": {
            "poolNamespace": ps.NS,
            "poolName": ps.POOL,
            "poolUID": "pool-uid",
            "vsphereAgent": VA,
        },
        "server": SERVER,
        "datacenter": DATACENTER,
        "deviceKey": 3000,
        "isoPath": ISO,
        "phase": "Recorded",
        "disconnectStarted": False,
        "startedAt": "2026-03-01T11:59:00Z",
        "attempts": 0,
    }
    base.update(fields)
    if base["phase"] != "Recorded":
        base["disconnectStarted"] = True
    return base


# --- the scripted VM and service -----------------------------------------------------------


@dataclass
class FakeVm:
    cdroms: dict[int, vsphere.Cdrom] = field(default_factory=lambda: {3000: cdrom()})
    owner: vsphere.OwnershipMarkers | None = field(default_factory=markers)
    """None: an unmarked VM (made by the Go operator)."""
    questions: list[vsphere.Question] = field(default_factory=list)
    locked: bool = False
    running: int | None = None
    """Device key of our reconfigure while it runs."""
    slow: bool = False
    """Its tasks run on until `FakeVsphere.end` (else they end right after starting)."""
    next_question: int = 1
    task: str = "task-7"
    """The reconfigure running (or last run) on the VM."""
    next_task: int = 7

    def facts(self) -> vsphere.VmFacts:
        return vm_facts(
            cdroms=tuple(self.cdroms[k] for k in sorted(self.cdroms)),
            owner=self.owner,
            unmarked=self.owner is None,
            pending=self.questions[0] if self.questions else None,
        )

    def finish(self, key: int) -> None:
        self.cdroms[key] = dataclasses.replace(
            self.cdroms[key],
            kind=vsphere.MediumKind.CLIENT,
            backing_file=None,
            connected=False,
            start_connected=False,
        )
        self.running = None


@dataclass
class FakeVsphere:
    api: FakeApi
    registry: vsphere.SessionRegistry
    vm: FakeVm | None = field(default_factory=FakeVm)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    fail: dict[str, vsphere.VsphereError] = field(default_factory=dict)
    credentials: Any = field(default_factory=lambda: SimpleNamespace(netloc=SERVER))
    tasks: dict[str, vsphere.TaskState] = field(default_factory=dict)
    """Every task started (or found running), by moref."""
    _ending: dict[str, Callable[[], None]] = field(default_factory=dict)

    @property
    def vcenter(self) -> str:
        return SERVER

    def _stored_phase(self) -> str | None:
        obj = self.api.find(kinds.VSPHERE_AGENT, ps.NS, VA) or {}
        return ((obj.get("status") or {}).get("isoEjection") or {}).get("phase")

    def _call(self, method: str) -> FakeVm:
        self.calls.append((method, self._stored_phase()))
        if method in self.fail:
            raise self.fail.pop(method)
        if self.vm is None:
            raise vsphere.NotFound("no such VM")
        return self.vm

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    # --- tasks ---------------------------------------------------------------------------

    def claim_task_slot(self, *, group: str, token: str, keep: bool = False) -> vsphere.Slot:
        return self.registry.claim_task_slot(SERVER, group=group, token=token, keep=keep)

    def _started(self, task: str, slot: vsphere.Slot | None, effect: Callable[[], None]) -> None:
        """`task` runs (in `slot`); `effect` is what its end does to the VM. It ends at
        once unless the VM is slow."""
        if slot is not None:
            slot.bind(task)
        self.tasks[task] = vsphere.TaskState.RUNNING
        self._ending[task] = effect
        assert self.vm is not None
        if not self.vm.slow:
            self.end(task)

    def end(self, task: str) -> None:
        """The task ends: its effect, its slot freed, and the news (as `Session.follow`)."""
        self._ending.pop(task)()
        self.tasks[task] = vsphere.TaskState.SUCCESS
        self.registry.task_slots(SERVER).finished(task)
        self.registry._task_ended(SERVER, task)

    async def task(self, *, task_ref: str) -> vsphere.TaskFacts:
        self.calls.append(("task", self._stored_phase()))
        if task_ref not in self.tasks:
            raise vsphere.NotFound(f"vCenter no longer knows task {task_ref}")
        return vsphere.TaskFacts(moid=task_ref, state=self.tasks[task_ref])

    async def follow_task(self, *, task_ref: str) -> None:
        self.calls.append(("follow_task", self._stored_phase()))

    # --- the VM ----------------------------------------------------------------------

    async def vm_by_uuid(self, *, datacenter: str, bios_uuid: str) -> vsphere.VmFacts | None:
        self.calls.append(("vm_by_uuid", self._stored_phase()))
        if "vm_by_uuid" in self.fail:
            raise self.fail.pop("vm_by_uuid")
        return None if self.vm is None else self.vm.facts()

    async def start_stamp(
        self,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> tuple[vsphere.VmFacts, str | None]:
        try:
            vm = self._call("start_stamp")
            if vm.owner == markers:
                return vm.facts(), None
            if vm.owner is not None:
                raise vsphere.OwnershipMismatch("another owner's markers")
            facts = vm.facts()
            self._started("task-stamp", slot, lambda: setattr(vm, "owner", markers))
            return facts, "task-stamp"
        finally:
            if slot.task is None:
                slot.release()

    async def eject_cdrom(
        self,
        *,
        datacenter: str,
        vm_uuid: str,
        device_key: int,
        expected_backing: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> vsphere.EjectOutcome:
        try:
            vm = self._call("eject_cdrom")
            if vm.owner != markers:
                raise vsphere.OwnershipMismatch("not ours")
            if vm.running is not None and vm.questions and vm.questions[0].is_cdrom_lock:
                return self._resumed(vm, device_key)
            device = vm.cdroms[device_key]
            if device.backing_file != expected_backing:
                raise vsphere.MediaMismatch("media changed")
            vm.task = f"task-{vm.next_task}"
            vm.next_task += 1
            vm.running = device_key
            if vm.locked:  # the reconfigure runs on, the VM asks: news too
                slot.bind(vm.task)
                self.tasks[vm.task] = vsphere.TaskState.RUNNING
                self._ending[vm.task] = lambda: vm.finish(device_key)
                vm.questions.append(question(f"_vmx{vm.next_question}"))
                vm.next_question += 1
                self.registry._task_ended(SERVER, vm.task)
            else:
                self._started(vm.task, slot, lambda: vm.finish(device_key))
            return vsphere.EjectOutcome(
                vsphere.EjectState.IN_PROGRESS, "vm-42", device_key, task_id=vm.task
            )
        finally:
            if slot.task is None:
                slot.release()

    async def answer_cdrom_lock_question(
        self, *, datacenter: str, vm_uuid: str, question_id: str, markers: vsphere.OwnershipMarkers
    ) -> None:
        vm = self._call(f"answer:{question_id}")
        shown = vm.questions[0] if vm.questions else None
        if shown is None or shown.id != question_id or not shown.is_cdrom_lock:
            raise vsphere.QuestionRefused("not the recorded lock question")
        vm.questions.pop(0)
        vm.locked = False
        if vm.running is not None and not vm.slow:
            self.end(self._reconfigure(vm))

    def _reconfigure(self, vm: FakeVm) -> str:
        """The reconfigure running on the VM (one an earlier process started, too)."""
        key = vm.running
        assert key is not None
        if vm.task not in self._ending:
            self._ending[vm.task] = lambda: vm.finish(key)
            self.tasks[vm.task] = vsphere.TaskState.RUNNING
        return vm.task

    async def resume_eject(
        self, *, datacenter: str, vm_uuid: str, device_key: int
    ) -> vsphere.EjectOutcome:
        return self._resumed(self._call("resume_eject"), device_key)

    def _resumed(self, vm: FakeVm, device_key: int) -> vsphere.EjectOutcome:
        if vm.running is not None and vm.questions:
            return vsphere.EjectOutcome(
                vsphere.EjectState.QUESTION_PENDING,
                "vm-42",
                device_key,
                task_id=vm.task,
                question=vm.questions[0],
            )
        if vm.running is not None:  # followed; its end is news
            task = self._reconfigure(vm)
            if not vm.slow:
                self.end(task)
            return vsphere.EjectOutcome(
                vsphere.EjectState.IN_PROGRESS, "vm-42", device_key, task_id=task
            )
        found = vm.cdroms.get(device_key)
        if found is not None and found.backing_file is None:
            return vsphere.EjectOutcome(
                vsphere.EjectState.EJECTED, "vm-42", device_key, cdrom=found
            )
        return vsphere.EjectOutcome(
            vsphere.EjectState.NOT_EJECTED,
            "vm-42",
            device_key,
            cdrom=found,
            question=vm.questions[0] if vm.questions else None,
        )


# --- a reconcile's context over the fakes ----------------------------------------------------


KEY = ObjectKey(f"{ps.NS}/{VA}")


@dataclass
class Setup:
    h: Harness
    service: FakeVsphere
    waits: TaskWaits
    woken: list[ObjectKey]
    """Keys the registry's news woke (the controller would reconcile them)."""

    @property
    def api(self) -> FakeApi:
        return self.h.api

    def stored(self) -> JsonObj:
        obj = self.api.find(kinds.VSPHERE_AGENT, ps.NS, VA)
        assert obj is not None
        return obj

    def stored_record(self) -> JsonObj | None:
        return (self.stored().get("status") or {}).get("isoEjection")

    def condition(self) -> JsonObj | None:
        for c in (self.stored().get("status") or {}).get("conditions") or []:
            if c["type"] == "ISOEjected":
                return dict(c)
        return None

    def reason(self) -> str | None:
        found = self.condition()
        return found["reason"] if found else None

    def ctx(self) -> tuple[VmInputs, StatusWriter]:
        """Fresh inputs from the cache (sync first) and their writer, as each reconcile
        builds them."""
        self.h.sync()
        raw = copy.deepcopy(self.stored())
        pool_raw = self.api.find(kinds.VSPHERE_AGENT_POOL, ps.NS, ps.POOL)
        pool = VsphereAgentPool.model_validate(pool_raw) if pool_raw else None
        vcenter = VcenterHandle(
            deps=self.h.deps,
            pool=pool,
            key=KEY,
            waits=self.waits,
            _service=self.service,  # type: ignore[arg-type]
        )
        inputs = VmInputs(
            deps=self.h.deps,
            raw=raw,
            agent=VsphereAgent.model_validate(raw),
            pool=pool,
            now=ps.NOW,
            vcenter=vcenter,
        )
        return inputs, StatusWriter.of(self.h.deps, inputs)

    def vsphere_writes(self) -> list[str]:
        reads = {"vm_by_uuid", "resume_eject", "task", "follow_task"}
        return [m for m in self.service.methods() if m not in reads]


def setup(
    *objs: JsonObj, vm: FakeVm | None = None, eject: bool = True, no_vm: bool = False
) -> Setup:
    pool = ps.pool_obj(iso={"ejectAfterInstall": eject})
    h = harness(pool, *objs)
    registry = vsphere.SessionRegistry()
    service = FakeVsphere(api=h.api, registry=registry, vm=None if no_vm else (vm or FakeVm()))
    waits = TaskWaits(registry, controller="vm")
    woken: list[ObjectKey] = []
    waits.bind(woken.append)
    return Setup(h=h, service=service, waits=waits, woken=woken)
