"""Stand-ins for the ISO ejection tests: raw objects, a scripted VM and a vSphere service.

`FakeVm` behaves as DOMAIN.md section 4 says a vCenter VM does: a disconnect of a
CD-ROM whose door the guest locked keeps its task running and raises the
`msg.cdromdisconnect.locked` question; only that question's id answered "0" completes
it. `FakeVsphere` is a fake vCenter with the whole `VcenterApi` seam the `vm` and
`ejection` controllers call (`reconcilers.vm.context`): it creates, powers on and off
and destroys VMs, checks markers, media and question ids as the real layer does, and
records every call together with the VsphereAgent's status stored in the `FakeApi` at
that moment (`calls`: the phase of `status.isoEjection`; `statuses`: the whole status),
so a test can prove a checkpoint came before the vSphere call it guards.

Tasks run as vCenter runs them for the operator (docs/design/0005): a start takes a
slot of the registry, reports the task `IN_PROGRESS` and returns; the task's end (or
the lock question) is news through the registry, which wakes the key through the
controller's `TaskWaits`. A task ends right after it started (or was found running),
unless `FakeVm.slow`: then it runs on until the test calls `FakeVsphere.end`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agentforge import identity, vsphere
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
    name: str = VM,
    moid: str = "vm-42",
    power: vsphere.PowerState = vsphere.PowerState.ON,
) -> vsphere.VmFacts:
    return vsphere.VmFacts(
        moid=moid,
        name=name,
        bios_uuid=bios_uuid,
        instance_uuid=ps.uuid(99),
        primary_mac=mac,
        macs=(mac,),
        power_state=power,
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
    name: str = VM
    bios_uuid: str = UUID
    moid: str = "vm-42"
    power: vsphere.PowerState = vsphere.PowerState.ON
    busy: str | None = None
    """A power-on, power-off or destroy task running on the VM (vCenter runs one at a
    time: another one started meanwhile fails with `TaskInProgress`)."""

    def facts(self) -> vsphere.VmFacts:
        return vm_facts(
            cdroms=tuple(self.cdroms[k] for k in sorted(self.cdroms)),
            owner=self.owner,
            unmarked=self.owner is None,
            pending=self.questions[0] if self.questions else None,
            bios_uuid=self.bios_uuid,
            name=self.name,
            moid=self.moid,
            power=self.power,
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
    """A fake vCenter with the whole `VcenterApi` surface (`reconcilers.vm.context`).

    The inventory is `vm` (the VM the ejection tests script; None: none) and `more`
    (VMs created while `vm` exists: a second `CreateVM_Task` lands here). A create
    reserves its name while it runs and its VM appears (powered off) when it ends; a
    power-on, power-off or destroy started while another of them runs on the VM fails
    with `TaskInProgress`, as vCenter answers. `slow`: every task runs on until `end`."""

    api: FakeApi
    registry: vsphere.SessionRegistry
    vm: FakeVm | None = field(default_factory=FakeVm)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    fail: dict[str, vsphere.VsphereError] = field(default_factory=dict)
    credentials: Any = field(default_factory=lambda: SimpleNamespace(netloc=SERVER))
    tasks: dict[str, vsphere.TaskState] = field(default_factory=dict)
    """Every task started (or found running), by moref."""
    _ending: dict[str, Callable[[], None]] = field(default_factory=dict)
    more: list[FakeVm] = field(default_factory=list)
    slow: bool = False
    """Every task runs on until `end` (not only those of a slow `FakeVm`)."""
    hosts: list[vsphere.HostState] = field(default_factory=list)
    """What `cluster_hosts` reports (any cluster)."""
    creates: dict[str, str] = field(default_factory=dict)
    """Every `CreateVM_Task` started, by moref: the VM name it makes."""
    results: dict[str, str] = field(default_factory=dict)
    """The moref of the VM a task made (`TaskInfo.result`)."""
    faults: dict[str, vsphere.VsphereError] = field(default_factory=dict)
    """The error each task that fails ends with."""
    statuses: list[tuple[str, JsonObj]] = field(default_factory=list)
    """Every call with the VsphereAgent's stored status at that moment (checkpoints)."""
    not_ours: list[str] = field(default_factory=list)
    """Changes asked of a VM that does not carry the markers they name."""
    _ids: Any = field(default_factory=lambda: itertools.count(100))

    @property
    def vcenter(self) -> str:
        return SERVER

    def _stored_phase(self) -> str | None:
        obj = self.api.find(kinds.VSPHERE_AGENT, ps.NS, VA) or {}
        return ((obj.get("status") or {}).get("isoEjection") or {}).get("phase")

    def _record(self, method: str) -> None:
        self.calls.append((method, self._stored_phase()))
        obj = self.api.find(kinds.VSPHERE_AGENT, ps.NS, VA) or {}
        status = copy.deepcopy(obj.get("status") or {})
        status["deleting"] = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        self.statuses.append((method, status))

    def _call(self, method: str) -> FakeVm:
        self._record(method)
        if method in self.fail:
            raise self.fail.pop(method)
        if self.vm is None:
            raise vsphere.NotFound("no such VM")
        return self.vm

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    # --- the inventory ---------------------------------------------------------------------

    def inventory(self) -> list[FakeVm]:
        return ([self.vm] if self.vm is not None else []) + self.more

    def place(self, vm: FakeVm) -> None:
        """`vm` appears in the inventory."""
        if self.vm is None:
            self.vm = vm
        else:
            self.more.append(vm)

    def remove(self, vm: FakeVm) -> None:
        if self.vm is vm:
            self.vm = self.more.pop(0) if self.more else None
        else:
            self.more.remove(vm)

    def named(self, name: str) -> list[FakeVm]:
        return [v for v in self.inventory() if v.name == name]

    def _by_uuid(self, bios_uuid: str) -> FakeVm | None:
        wanted = identity.normalize_uuid(bios_uuid)
        return next(
            (v for v in self.inventory() if identity.normalize_uuid(v.bios_uuid) == wanted), None
        )

    def _by_moid(self, moid: str) -> FakeVm | None:
        return next((v for v in self.inventory() if v.moid == moid), None)

    # --- tasks ---------------------------------------------------------------------------

    def claim_task_slot(self, *, group: str, token: str, keep: bool = False) -> vsphere.Slot:
        return self.registry.claim_task_slot(SERVER, group=group, token=token, keep=keep)

    def _started(
        self,
        task: str,
        slot: vsphere.Slot | None,
        effect: Callable[[], None],
        *,
        vm: FakeVm | None = None,
        fault: vsphere.VsphereError | None = None,
    ) -> None:
        """`task` runs (in `slot`); `effect` is what its end does (none when it ends with
        `fault`). It ends at once unless the service or the VM is slow."""
        if slot is not None:
            slot.bind(task)
        self.tasks[task] = vsphere.TaskState.RUNNING
        self._ending[task] = effect
        if fault is not None:
            self.faults[task] = fault
        on = vm if vm is not None else self.vm
        if not (self.slow or (on is not None and on.slow)):
            self.end(task)

    def running(self) -> list[str]:
        """The tasks still running, oldest first."""
        return [t for t, state in self.tasks.items() if state is vsphere.TaskState.RUNNING]

    def end(self, task: str) -> None:
        """The task ends: its effect, its slot freed, and the news (as `Session.follow`)."""
        effect = self._ending.pop(task)
        if task in self.faults:
            self.tasks[task] = vsphere.TaskState.ERROR
        else:
            effect()
            self.tasks[task] = vsphere.TaskState.SUCCESS
        self.registry.task_slots(SERVER).finished(task)
        self.registry._task_ended(SERVER, task)

    async def task(self, *, task_ref: str) -> vsphere.TaskFacts:
        self._record("task")
        if task_ref not in self.tasks:
            raise vsphere.NotFound(f"vCenter no longer knows task {task_ref}")
        return vsphere.TaskFacts(
            moid=task_ref,
            state=self.tasks[task_ref],
            description_id=vfacts.CREATE_VM if task_ref in self.creates else "",
            result_moid=self.results.get(task_ref),
            error=self.faults.get(task_ref),
        )

    async def follow_task(self, *, task_ref: str) -> None:
        self._record("follow_task")

    async def creates_in_flight(self, *, placement: vsphere.Placement) -> list[vsphere.TaskFacts]:
        self._record("creates_in_flight")
        return [
            vsphere.TaskFacts(
                moid=t, state=vsphere.TaskState.RUNNING, description_id=vfacts.CREATE_VM
            )
            for t in self.creates
            if self.tasks.get(t) is vsphere.TaskState.RUNNING
        ]

    def _busy(self, vm: FakeVm, task: str) -> vsphere.VsphereError | None:
        """vCenter's answer to a task on a VM another one still runs on: none when free
        (`task` now runs on it)."""
        if vm.busy is not None and self.tasks.get(vm.busy) is vsphere.TaskState.RUNNING:
            return vsphere.TransientError(f"TaskInProgress: {vm.busy} runs on VM {vm.name}")
        vm.busy = task
        return None

    def _claimed(self, vm: FakeVm, expected: vsphere.OwnershipMarkers, method: str) -> None:
        if vm.owner != expected:
            self.not_ours.append(f"{method} {vm.name}")

    # --- the VM ----------------------------------------------------------------------

    async def inspect_storage(
        self, *, placement: vsphere.Placement
    ) -> tuple[list[vsphere.Problem], int]:
        self._record("inspect_storage")
        return [], 1 << 40

    async def cluster_hosts(
        self, *, datacenter: str, cluster: str, host_group: str | None = None
    ) -> list[vsphere.HostState]:
        self._record("cluster_hosts")
        return list(self.hosts)

    async def vm_by_moid(self, *, moid: str) -> vsphere.VmFacts | None:
        self._record("vm_by_moid")
        found = self._by_moid(moid)
        return None if found is None else found.facts()

    async def vm_by_uuid(self, *, datacenter: str, bios_uuid: str) -> vsphere.VmFacts | None:
        self._record("vm_by_uuid")
        if "vm_by_uuid" in self.fail:
            raise self.fail.pop("vm_by_uuid")
        found = self._by_uuid(bios_uuid)
        return None if found is None else found.facts()

    async def vm_by_name(
        self, *, placement: vsphere.Placement, name: str
    ) -> vsphere.VmFacts | None:
        self._record("vm_by_name")
        found = self.named(name)
        return found[0].facts() if found else None

    async def start_create(
        self, *, request: vsphere.VmRequest, slot: vsphere.Slot
    ) -> vsphere.Started:
        """`CreateVM_Task`, as `provision.start` starts it: a name held by our VM is
        handed back to converge, by another's refused; a name a running create reserves
        is `CreationInFlight`."""
        self._record("start_create")
        try:
            if "start_create" in self.fail:
                raise self.fail.pop("start_create")
            holder = next(iter(self.named(request.name)), None)
            if holder is not None:
                if holder.owner != request.markers:
                    raise vsphere.AlreadyExists(f"VM {request.name} exists and is not ours")
                return vsphere.Started(existing=holder.facts())
            reserved = [
                t
                for t, name in self.creates.items()
                if name == request.name and self.tasks[t] is vsphere.TaskState.RUNNING
            ]
            if reserved:
                raise vsphere.CreationInFlight(f"a creation of VM {request.name} runs")
            n = next(self._ids)
            task = f"task-{n}"
            vm = FakeVm(
                cdroms={3000: cdrom(backing=request.iso_file)},
                owner=request.markers,
                name=request.name,
                bios_uuid=request.bios_uuid or ps.uuid(n),
                moid=f"vm-{n}",
                power=vsphere.PowerState.OFF,
            )
            self.creates[task] = request.name
            self.results[task] = vm.moid
            self._started(task, slot, lambda: self.place(vm), vm=vm)
            return vsphere.Started(task=task)
        finally:
            if slot.task is None:
                slot.release()

    async def converge_vm(
        self, *, request: vsphere.VmRequest, vm_moid: str, slot: vsphere.Slot
    ) -> str | None:
        """Tags, then `PowerOnVM_Task` (None when the VM runs already)."""
        self._record("converge_vm")
        try:
            vm = self._by_moid(vm_moid)
            if vm is None:
                raise vsphere.NotFound(f"no VM {vm_moid}")
            self._claimed(vm, request.markers, "converge_vm")
            if vm.power is vsphere.PowerState.ON:
                return None
            task = f"task-{next(self._ids)}"
            fault = self._busy(vm, task)

            def on() -> None:
                vm.power, vm.busy = vsphere.PowerState.ON, None

            self._started(task, slot, on, vm=vm, fault=fault)
            return task
        finally:
            if slot.task is None:
                slot.release()

    async def start_delete(
        self,
        *,
        datacenter: str,
        bios_uuid: str,
        markers: vsphere.OwnershipMarkers,
        slot: vsphere.Slot,
    ) -> vsphere.DeleteStep:
        """As `vms.start_delete`: power off while not off, then destroy; a VM not ours is
        refused."""
        self._record("start_delete")
        try:
            vm = self._by_uuid(bios_uuid)
            if vm is None:
                return vsphere.DeleteStep("")
            self._claimed(vm, markers, "start_delete")
            if vm.owner != markers:
                raise vsphere.OwnershipMismatch(f"VM {vm.name} is not ours")
            facts = vm.facts()
            task = f"task-{next(self._ids)}"
            fault = self._busy(vm, task)
            if vm.power is not vsphere.PowerState.OFF:

                def off() -> None:
                    vm.power, vm.busy = vsphere.PowerState.OFF, None

                self._started(task, slot, off, vm=vm, fault=fault)
                return vsphere.DeleteStep("power off", task, facts)
            self._started(task, slot, lambda: self.remove(vm), vm=vm, fault=fault)
            return vsphere.DeleteStep("destroy", task, facts)
        finally:
            if slot.task is None:
                slot.release()

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
            _service=self.service,
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
