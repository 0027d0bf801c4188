"""ISO ejection end to end: opt-in, Installed=True only, only our media, the locked door.

The real operator process (its ServiceAccount, `config/rbac`) against the real control
plane and vcsim; the actors bind and install the workers (installation can be held
back, so a test acts while Agents are Bound but not Installed). Every wait is for a
named state within a deadline; "stays" is checked over a few seconds with
`consistently`.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from agentforge.api import kinds
from sim.vcsim import VcsimControl
from sim.world import Snapshot, World
from tests.e2e import ejection_support as ej
from tests.e2e.support import OperatorHarness, consistently, eventually

POOL = ej.POOL
LOCK = "msg.cdromdisconnect.locked"
STAYS_S = 3.0


def all_hold_the_pool_iso(snap: Snapshot) -> bool:
    iso = ej.pool_iso(snap)
    return all(iso in ej.vm_of(snap, va).iso_files for va in ej.vas_of(snap))


def none_holds_the_pool_iso(snap: Snapshot) -> bool:
    iso = ej.pool_iso(snap)
    return all(iso not in ej.vm_of(snap, va).iso_files for va in ej.vas_of(snap))


async def disconnect_counts(control: VcsimControl, snap: Snapshot, *, since: int = 0) -> list[int]:
    return [
        len(await ej.disconnects(control, ej.vm_of(snap, va).moref, since=since))
        for va in ej.vas_of(snap)
    ]


async def test_off_by_default_then_enabling_ejects_the_existing_installed_workers(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.set_up(world)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(2)
    snap = await ej.bound(world, 2)
    first, second = (ej.vm_of(snap, va) for va in ej.vas_of(snap))
    world.assisted.added_to_existing.add(first.name)
    world.assisted.installed_only.add(second.name)
    ej.release_installation(world)
    snap = await eventually(
        world.snapshot, lambda s: len(s.installed_agents()) == 2, within=60, what="2 installed"
    )
    states = sorted(a["status"]["debugInfo"]["state"] for a in snap.installed_agents())
    assert states == ["added-to-existing-cluster", "installed"]

    await ej.wait_reasons(world, {"Disabled"})
    await consistently(
        world.snapshot,
        lambda s: set(ej.ejected_reasons(s).values()) == {"Disabled"} and all_hold_the_pool_iso(s),
        duration=STAYS_S,
        what="default off: installed workers keep their discovery ISO",
    )
    assert await disconnect_counts(vcsim_control, snap) == [0, 0]

    await ej.set_ejection(world, True)
    snap = await ej.wait_reasons(world, {"Ejected"})
    assert none_holds_the_pool_iso(snap)
    assert await disconnect_counts(vcsim_control, snap) == [1, 1]
    for va in ej.vas_of(snap):
        condition = ej.iso_ejected(va)
        assert condition["status"] == "True"
        assert "isoEjection" not in (va.get("status") or {})
    snap = await eventually(
        world.snapshot,
        lambda s: (s.pool_status(POOL).get("isoEjections") or {}).get("ejected") == 2,
        within=60,
        what="the pool counts 2 ejected",
    )
    assert operator.process is not None
    gauge = await operator.process.metric(
        "agent_forge_pool_iso_ejections", namespace=world.namespace, pool=POOL, reason="Ejected"
    )
    assert gauge == 2
    ejects = await operator.process.metric(
        "agent_forge_iso_operations_total", operation="eject", result="Ejected"
    )
    assert ejects is not None
    assert ejects >= 2


async def test_bound_but_not_installed_keeps_its_media_until_installed(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(1)
    await ej.bound(world, 1)
    snap = await ej.wait_reasons(world, {"WaitingForInstallation"})

    def bound_waiting_attached(s: Snapshot) -> bool:
        agents = s.bound_agents()
        return (
            len(agents) == 1
            and not s.installed_agents()
            and set(ej.ejected_reasons(s).values()) == {"WaitingForInstallation"}
            and all_hold_the_pool_iso(s)
        )

    snap = await consistently(
        world.snapshot, bound_waiting_attached, duration=STAYS_S, what="Bound is not enough"
    )
    assert await disconnect_counts(vcsim_control, snap) == [0]

    ej.release_installation(world)
    snap = await ej.wait_reasons(world, {"Ejected"})
    assert none_holds_the_pool_iso(snap)
    assert await disconnect_counts(vcsim_control, snap) == [1]


async def _second_cdrom(world: World, bios_uuid: str, datastore: str, path: str, tmp: Path) -> None:
    """Attach `[datastore] path` (uploaded first) on a new CD-ROM of the VM, as a person would."""
    local = tmp / hashlib.sha256(path.encode()).hexdigest()[:12]
    local.write_bytes(b"not a discovery image")
    govc = world.vcsim.govc
    await asyncio.to_thread(govc, "datastore.upload", "-ds", datastore, str(local), path)
    device = (await asyncio.to_thread(govc, "device.cdrom.add", "-vm.uuid", bios_uuid)).strip()
    await asyncio.to_thread(
        govc,
        "device.cdrom.insert",
        "-vm.uuid",
        bios_uuid,
        "-device",
        device,
        "-ds",
        datastore,
        path,
    )


async def test_unrelated_media_stays_attached_while_the_discovery_iso_is_ejected(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl, tmp_path: Path
) -> None:
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(3)
    snap = await ej.bound(world, 3)
    prefix = f"agent-forge/{world.namespace}/{POOL}"
    sha = "0f" * 32
    unrelated = {
        "outside the prefix": ("iso-ds", f"agent-forge/elsewhere/{sha}.iso"),
        "outside the ISO datastore": ("ds1", f"{prefix}/{sha}.iso"),
        "not content-addressed": ("iso-ds", f"{prefix}/tools.iso"),
    }
    vms = [ej.vm_of(snap, va) for va in ej.vas_of(snap)]
    for vm, (datastore, path) in zip(vms, unrelated.values(), strict=True):
        await _second_cdrom(world, vm.bios_uuid, datastore, path, tmp_path)
    mark = await vcsim_control.last_seq()  # attaching media changed CD-ROMs too
    ej.release_installation(world)

    snap = await ej.wait_reasons(world, {"Ejected"})
    assert none_holds_the_pool_iso(snap)
    for vm, (datastore, path) in zip(vms, unrelated.values(), strict=True):
        now = snap.vm(vm.name)
        assert now is not None
        assert now.iso_files == (f"[{datastore}] {path}",), f"{vm.name} lost unrelated media"
    assert await disconnect_counts(vcsim_control, snap, since=mark) == [1, 1, 1]


async def test_an_identity_mismatch_is_ejection_failed_and_changes_nothing(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(1)
    snap = await ej.bound(world, 1)
    (va,) = ej.vas_of(snap)
    vm = ej.vm_of(snap, va)
    agent = snap.agent_of_vm(vm)
    assert agent is not None
    inventory = dict(agent["status"]["inventory"])
    inventory["interfaces"] = [
        {**i, "macAddress": "00:50:56:3f:ff:fe"} for i in inventory.get("interfaces") or []
    ]
    await world.client.patch_status(
        kinds.AGENT,
        namespace=world.namespace,
        name=agent["metadata"]["name"],
        patch={"status": {"inventory": inventory}},
    )
    ej.release_installation(world)

    snap = await ej.wait_reasons(world, {"EjectionFailed"})
    message = ej.iso_ejected(ej.vas_of(snap)[0])["message"]
    assert "MAC" in message
    assert "nothing was touched" in message
    snap = await consistently(
        world.snapshot,
        lambda s: (
            set(ej.ejected_reasons(s).values()) == {"EjectionFailed"} and all_hold_the_pool_iso(s)
        ),
        duration=STAYS_S,
        what="a mismatched identity keeps its media",
    )
    assert await disconnect_counts(vcsim_control, snap) == [0]
    assert "isoEjection" not in (ej.vas_of(snap)[0].get("status") or {})


async def test_a_locked_door_is_answered_once_and_an_unrelated_question_is_left_alone(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl
) -> None:
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(1)
    snap = await ej.bound(world, 1)
    vm = ej.vm_of(snap, ej.vas_of(snap)[0])
    await vcsim_control.lock_cdrom(vm.moref)
    await vcsim_control.set_delay("AnswerVM", 3000)  # the answer is on its way meanwhile
    ej.release_installation(world)

    asked = await eventually(
        lambda: ej.pending_questions(vcsim_control, vm.moref),
        lambda qs: any(q["message_id"] == LOCK for q in qs),
        within=60,
        what="the guest's CD-ROM lock question",
    )
    lock_id = next(q["id"] for q in asked if q["message_id"] == LOCK)
    unrelated_id = await vcsim_control.raise_question(
        vm.moref, "msg.hbacommon.outofspace", "There is no more space for virtual disk"
    )

    snap = await ej.wait_reasons(world, {"Ejected"})
    assert none_holds_the_pool_iso(snap)
    answered = await ej.answers(vcsim_control, vm.moref)
    assert [(a["question_id"], a["answer_choice"]) for a in answered] == [(lock_id, "0")]
    assert [q["id"] for q in await ej.pending_questions(vcsim_control, vm.moref)] == [unrelated_id]
    assert len(await ej.disconnects(vcsim_control, vm.moref)) == 1
    now = snap.vm(vm.name)
    assert now is not None
    assert not [k for k in now.extra_config if k.startswith("answer.")], "no automatic answers"
    reasons = [
        e.get("reason")
        for e in snap.events_about("VsphereAgent", ej.vas_of(snap)[0]["metadata"]["name"])
    ]
    assert "ISOLockQuestionAnswered" in reasons


async def _replace_medium(world: World, bios_uuid: str, datastore: str, path: str) -> None:
    """Put `[datastore] path` into the VM's existing CD-ROM, as a person would in vCenter."""
    govc = world.vcsim.govc
    listed = await asyncio.to_thread(govc, "device.ls", "-vm.uuid", bios_uuid)
    (device,) = [line.split()[0] for line in listed.splitlines() if line.startswith("cdrom-")]
    await asyncio.to_thread(
        govc,
        "device.cdrom.insert",
        "-vm.uuid",
        bios_uuid,
        "-device",
        device,
        "-ds",
        datastore,
        path,
    )


async def test_a_look_alike_medium_is_reported_no_owned_media_never_ejected(
    world: World, operator: OperatorHarness, vcsim_control: VcsimControl, tmp_path: Path
) -> None:
    """The pool's own ISO, byte for byte, under a name the pool's cache did not make: in
    another pool's folder, on another datastore, in a sub-folder of the prefix. Nothing
    is ejected, nothing is counted as ejected, and the message says what is attached."""
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(POOL).scale(3)
    snap = await ej.bound(world, 3)
    cached = ej.pool_iso(snap).removeprefix("[iso-ds] ")
    prefix, _, name = cached.rpartition("/")
    image = tmp_path / name
    image.write_bytes(world.iso_server.current()[name.removesuffix(".iso")].data)
    look_alikes = {
        "another pool's folder": (
            "iso-ds",
            f"agent-forge/{world.namespace}/other-pool/{name}",
            f"in folder agent-forge/{world.namespace}/other-pool/, not directly in the pool's "
            f"pathPrefix {prefix}/",
        ),
        "another datastore": (
            "ds1",
            cached,
            "on datastore ds1, not the pool's isoDatastore iso-ds",
        ),
        "a sub-folder": (
            "iso-ds",
            f"{prefix}/old/{name}",
            f"in sub-folder {prefix}/old/, not directly in the pool's pathPrefix {prefix}/",
        ),
    }
    vms = [ej.vm_of(snap, va) for va in ej.vas_of(snap)]
    govc = world.vcsim.govc
    for vm, (datastore, path, _) in zip(vms, look_alikes.values(), strict=True):
        await asyncio.to_thread(govc, "datastore.upload", "-ds", datastore, str(image), path)
        await _replace_medium(world, vm.bios_uuid, datastore, path)
    mark = await vcsim_control.last_seq()
    ej.release_installation(world)

    snap = await ej.wait_reasons(world, {"NoOwnedMedia"})
    by_vm = {ej.vm_of(snap, va).name: ej.iso_ejected(va) for va in ej.vas_of(snap)}
    for vm, (datastore, path, why) in zip(vms, look_alikes.values(), strict=True):
        condition = by_vm[vm.name]
        assert condition["status"] == "False"
        assert f" holds [{datastore}] {path}: {why}" in condition["message"]
        assert "nothing was ejected" in condition["message"]

    def untouched(s: Snapshot) -> bool:
        counts = s.pool_status(POOL).get("isoEjections") or {}
        held = all(
            (now := s.vm(vm.name)) is not None and now.iso_files == (f"[{ds}] {path}",)
            for vm, (ds, path, _) in zip(vms, look_alikes.values(), strict=True)
        )
        return held and counts.get("ejected") == 0 and counts.get("noOwnedMedia") == 3

    snap = await eventually(world.snapshot, untouched, within=60, what="3 NoOwnedMedia, 0 ejected")
    snap = await consistently(
        world.snapshot, untouched, duration=STAYS_S, what="look-alikes stay, none counted"
    )
    assert await disconnect_counts(vcsim_control, snap, since=mark) == [0, 0, 0]
    assert operator.process is not None
    gauge = await operator.process.metric(
        "agent_forge_pool_iso_ejections",
        namespace=world.namespace,
        pool=POOL,
        reason="NoOwnedMedia",
    )
    assert gauge == 3
    ejected = await operator.process.metric(
        "agent_forge_pool_iso_ejections", namespace=world.namespace, pool=POOL, reason="Ejected"
    )
    assert ejected == 0
