"""The simulated world on its own (no operator): each actor keeps its counterpart's rules.

VMs are made by hand with govc, as an administrator would, booting the InfraEnv's
discovery ISO uploaded to the ISO datastore under its content-addressed name; the
tests then play the operator's part by hand where needed (approving and labelling
an Agent) and check what HyperShift, CAPI and the Assisted Installer stand-ins do.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentforge import identity
from agentforge.api import kinds, names
from sim.actors import Timings, consistently, eventually
from sim.actors.assisted import INSTALLED_STATES
from sim.actors.capi import AGENT_MACHINE_FINALIZER
from sim.actors.inventory import serial_number
from sim.actors.nodepool import MACHINE_FINALIZER
from sim.actors.vcenter import VmFact
from sim.controlplane import ControlPlane
from sim.vcsim import Vcsim
from sim.world import Snapshot, World
from sim.world.snapshot import condition_of

FAST = Timings(tick=0.1, boot=0.2, install_start=0.4, install=1.2, drain=0.3, reclaim=0.6)
WITHIN = 20.0
NODEPOOL = "workers"


@pytest.fixture
async def world(controlplane: ControlPlane, vcsim: Vcsim, namespace: str) -> AsyncIterator[World]:
    async with World(
        controlplane=controlplane,
        vcsim=vcsim,
        namespace=namespace,
        timings=FAST,
        iso_size=256 * 1024,
    ) as sim_world:
        yield sim_world
        leftovers = [f"VirtualMachine:{vm.moref}" for vm in (await sim_world.snapshot()).vms]
    if leftovers:  # with the world stopped, so no actor sees them go
        await asyncio.to_thread(vcsim.govc, "vm.destroy", *leftovers)
    sim_world.check()


async def boot_vm(
    world: World, vcsim: Vcsim, tmp_path: Path, *, infraenv: str = "discovery"
) -> VmFact:
    """A powered-on VM (made with govc) whose CD-ROM holds the InfraEnv's current ISO."""
    image = world.iso_server.publish(world.namespace, infraenv)
    return await boot_vm_from(world, vcsim, tmp_path, file_name=image.file_name, data=image.data)


async def boot_vm_from(
    world: World, vcsim: Vcsim, tmp_path: Path, *, file_name: str, data: bytes
) -> VmFact:
    """A powered-on VM (made with govc) whose CD-ROM holds `data` named `file_name`."""
    local = tmp_path / file_name
    local.write_bytes(data)
    remote = f"sim-tests/{world.namespace}/{file_name}"
    name = f"vm-{uuid.uuid4().hex[:10]}"
    await asyncio.to_thread(
        vcsim.govc, "datastore.mkdir", "-ds", "iso-ds", "-p", f"sim-tests/{world.namespace}"
    )
    await asyncio.to_thread(vcsim.govc, "datastore.upload", "-ds", "iso-ds", str(local), remote)
    await asyncio.to_thread(
        vcsim.govc, "vm.create", "-on=true", "-ds", "ds1", "-pool", "cluster/Resources",
        "-net", "VM Network", "-net.adapter", "vmxnet3", "-iso", remote, "-iso-datastore", "iso-ds",
        "-c", "2", "-m", "4096", "-disk", "20GB", name,
    )  # fmt: skip
    vms = await world.vcenter.vms()
    return next(vm for vm in vms if vm.name == name)


async def agent_of(world: World, vm: VmFact) -> dict[str, Any] | None:
    return (await world.snapshot()).agent_of_vm(vm)


async def registered_agent(world: World, vm: VmFact) -> dict[str, Any]:
    found: dict[str, Any] | None = await eventually(
        lambda: agent_of(world, vm),
        lambda a: a is not None,
        within=WITHIN,
        what=f"an Agent for {vm.name}",
    )
    assert found is not None
    return found


async def prepare(world: World, agent: dict[str, Any], *, approve: bool = True) -> None:
    """What the operator would do: label the Agent for the NodePool and approve it."""
    await world.client.patch_merge(
        kinds.AGENT,
        namespace=world.namespace,
        name=agent["metadata"]["name"],
        patch={
            "metadata": {"labels": world.nodepool_labels(NODEPOOL)},
            "spec": {"approved": approve},
        },
    )


def ready_reason(obj: dict[str, Any] | None, type_: str = "Ready") -> tuple[str, str] | None:
    found = condition_of(obj, type_)
    return (found["status"], found["reason"]) if found else None


def installed_is(status: str, reason: str) -> Callable[[dict[str, Any] | None], bool]:
    return lambda agent: ready_reason(agent, "Installed") == (status, reason)


def waiting(snap: Snapshot) -> list[dict[str, Any]]:
    return [am for am in snap.agent_machines if ready_reason(am) == ("False", "NoSuitableAgents")]


# --- NodePool driver -------------------------------------------------------------------


async def test_scaled_up_agent_machines_wait_for_an_agent(world: World) -> None:
    await world.nodepool(NODEPOOL).scale(2)
    snap = await eventually(
        world.snapshot, lambda s: len(waiting(s)) == 2, within=WITHIN, what="2 waiting AMs"
    )
    key = f"{world.namespace}/{NODEPOOL}"
    for am in snap.agent_machines:
        assert am["metadata"]["annotations"][names.ANNOTATION_NODEPOOL] == key
        assert am["spec"]["agentLabelSelector"]["matchLabels"] == world.nodepool_labels(NODEPOOL)
        assert am["metadata"]["ownerReferences"][0]["kind"] == "Machine"
    await world.settle()
    snap = await world.snapshot()
    assert len(waiting(snap)) == 2, "nothing binds without Agents"
    assert {m["metadata"]["name"] for m in snap.machines} == {
        am["metadata"]["name"] for am in snap.agent_machines
    }


async def test_machines_read_as_v1beta1_name_their_agent_machine(world: World) -> None:
    """The operator reads Machines as v1beta1; the v1beta2 objects must answer its questions."""
    (name,) = await world.nodepool(NODEPOOL).scale(1)
    machine = await world.client.get(
        kinds.MACHINE, namespace=world.control_plane_namespace, name=name
    )
    assert machine["apiVersion"] == "cluster.x-k8s.io/v1beta1"
    assert machine["spec"]["infrastructureRef"]["name"] == name
    assert machine["spec"]["infrastructureRef"]["kind"] == "AgentMachine"
    assert machine["spec"]["clusterName"] == world.hosted_cluster
    assert machine["metadata"]["annotations"][names.ANNOTATION_NODEPOOL].endswith(f"/{NODEPOOL}")
    assert MACHINE_FINALIZER in machine["metadata"]["finalizers"]


async def test_scale_down_deletes_the_newest_machines_first(world: World) -> None:
    driver = world.nodepool(NODEPOOL)
    created = await driver.scale(3)
    deleted = await driver.scale(1)
    assert deleted == [created[2], created[1]]
    snap = await eventually(
        world.snapshot, lambda s: len(s.machines) == 1 and len(s.agent_machines) == 1,
        within=WITHIN, what="one Machine + AgentMachine left",
    )  # fmt: skip
    assert snap.machines[0]["metadata"]["name"] == created[0]


# --- Assisted Installer ----------------------------------------------------------------


async def test_vm_booting_the_discovery_iso_registers_an_agent_with_its_serial_and_mac(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    infraenv = await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    agent = await registered_agent(world, vm)
    inventory = agent["status"]["inventory"]
    assert inventory["systemVendor"]["serialNumber"] == serial_number(vm.bios_uuid)
    assert inventory["systemVendor"]["serialNumber"].startswith("VMware-")
    assert identity.bios_uuid_from_serial(inventory["systemVendor"]["serialNumber"]) == vm.bios_uuid
    assert [i["macAddress"] for i in inventory["interfaces"]] == list(vm.macs)
    assert inventory["hostname"] == vm.name
    assert inventory["cpu"]["count"] == 2
    assert inventory["memory"]["physicalBytes"] == 4096 * 1024 * 1024
    assert any(d["sizeBytes"] == 20 * 1024**3 for d in inventory["disks"])
    assert agent["metadata"]["labels"][names.LABEL_INFRAENV] == "discovery"
    assert agent["metadata"]["ownerReferences"][0]["uid"] == infraenv["metadata"]["uid"]
    assert agent["spec"]["approved"] is False
    conditions = {c["type"]: c["status"] for c in agent["status"]["conditions"]}
    assert conditions == {
        "SpecSynced": "True", "Connected": "True", "RequirementsMet": "True",
        "Validated": "True", "Installed": "False", "Bound": "False",
    }  # fmt: skip


async def test_vm_booting_an_older_iso_of_the_infraenv_still_registers(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    # assisted-service registers a host booted from any discovery ISO of an InfraEnv that
    # still exists, not only from the newest: an operator that cached v1 and created a
    # VM from it just before the image changed gets an Agent for it.
    await world.create_infraenv("discovery")
    old = world.iso_server.publish(world.namespace, "discovery")
    new = await world.infraenvs.change_image("discovery")  # v1 is no longer current ...
    assert new.sha256 != old.sha256
    vm = await boot_vm_from(world, vcsim, tmp_path, file_name=old.file_name, data=old.data)
    agent = await registered_agent(world, vm)  # ... and still registers
    assert agent["metadata"]["labels"][names.LABEL_INFRAENV] == "discovery"


async def test_vm_booting_an_iso_no_infraenv_ever_had_registers_nothing(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    image = world.iso_server.publish(world.namespace, "discovery")
    # The image's bytes under a content-addressed name no image has had (a misnamed
    # upload): the name is what the Assisted Installer stand-in goes by.
    never = hashlib.sha256(image.data[:-1]).hexdigest()
    assert world.iso_server.by_sha256(never) is None
    vm = await boot_vm_from(world, vcsim, tmp_path, file_name=f"{never}.iso", data=image.data)
    await consistently(
        lambda: agent_of(world, vm), lambda a: a is None, duration=FAST.boot * 5, what="no Agent"
    )


# --- CAPI agent provider + installation ------------------------------------------------


async def test_an_approved_labelled_agent_gets_bound_and_installs(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    (am_name,) = await world.nodepool(NODEPOOL).scale(1)
    agent = await registered_agent(world, vm)
    await prepare(world, agent)
    installing = await eventually(
        lambda: agent_of(world, vm), installed_is("False", "InstallationInProgress"),
        within=WITHIN, what="installation in progress", interval=0.05,
    )  # fmt: skip
    assert installing is not None
    assert installing["metadata"]["labels"][names.LABEL_AGENT_MACHINE_REF] == am_name
    assert installing["spec"]["clusterDeploymentName"] == {
        "name": world.hosted_cluster,
        "namespace": world.control_plane_namespace,
    }
    assert ready_reason(installing, "Bound") == ("True", "Bound")
    installed = await eventually(
        lambda: agent_of(world, vm), installed_is("True", "InstallationCompleted"),
        within=WITHIN, what="installation completed",
    )  # fmt: skip
    assert installed is not None
    assert installed["status"]["debugInfo"]["state"] in INSTALLED_STATES
    snap = await world.snapshot()
    (am,) = snap.agent_machines
    assert am["status"]["agentRef"]["name"] == installed["metadata"]["name"]
    assert am["spec"]["providerID"] == f"agent://{installed['metadata']['uid']}"
    assert ready_reason(am) == ("True", "AgentBound")
    assert AGENT_MACHINE_FINALIZER in am["metadata"]["finalizers"]
    machine = await eventually(
        world.snapshot,
        lambda s: s.machines[0]["status"]["phase"] == "Running",
        within=WITHIN,
        what="Running",
    )
    assert machine is not None


async def test_an_unapproved_agent_is_never_bound(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    await world.nodepool(NODEPOOL).scale(1)
    await prepare(world, await registered_agent(world, vm), approve=False)
    await consistently(
        world.snapshot, lambda s: not s.bound_agents() and len(waiting(s)) == 1,
        duration=1.5, what="the AgentMachine keeps waiting",
    )  # fmt: skip


async def test_only_waiting_agent_machines_are_bound(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    await prepare(world, await registered_agent(world, vm))
    am = {
        "apiVersion": kinds.AGENT_MACHINE.api_version,
        "kind": "AgentMachine",
        "metadata": {"name": "no-status", "namespace": world.control_plane_namespace},
        "spec": {"agentLabelSelector": {"matchLabels": world.nodepool_labels(NODEPOOL)}},
    }
    await world.client.create(kinds.AGENT_MACHINE, am)
    await consistently(
        world.snapshot, lambda s: not s.bound_agents(), duration=1.0, what="no binding"
    )
    await world.client.patch_status(
        kinds.AGENT_MACHINE, namespace=world.control_plane_namespace, name="no-status",
        patch={"status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "NoSuitableAgents", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}},
    )  # fmt: skip
    await eventually(
        world.snapshot, lambda s: len(s.bound_agents()) == 1, within=WITHIN, what="bound"
    )


async def test_machine_deletion_unbinds_and_reclaims_the_agent(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    driver = world.nodepool(NODEPOOL)
    await driver.scale(1)
    await prepare(world, await registered_agent(world, vm))
    await eventually(
        world.snapshot, lambda s: len(s.installed_agents()) == 1, within=WITHIN, what="installed"
    )
    await driver.scale(0)
    snap = await eventually(
        world.snapshot, lambda s: not s.machines and not s.agent_machines,
        within=WITHIN, what="Machine and AgentMachine gone",
    )  # fmt: skip
    (agent,) = snap.agents
    assert names.LABEL_AGENT_MACHINE_REF not in (agent["metadata"].get("labels") or {})
    assert not agent["spec"].get("clusterDeploymentName")
    reclaimed = await eventually(
        lambda: agent_of(world, vm), lambda a: ready_reason(a, "Bound") == ("False", "Unbound"),
        within=WITHIN, what="reclaimed and available",
    )  # fmt: skip
    assert reclaimed is not None
    assert ready_reason(reclaimed, "Installed") == ("False", "InstallationNotStarted")


async def test_vm_deletion_removes_its_agent(world: World, vcsim: Vcsim, tmp_path: Path) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    await registered_agent(world, vm)
    await asyncio.to_thread(vcsim.govc, "vm.destroy", vm.name)
    await eventually(world.snapshot, lambda s: not s.agents, within=WITHIN, what="the Agent gone")


# --- rule checks the e2e suite relies on -----------------------------------------------


async def test_deleting_a_bound_agent_is_reported_as_a_violation(
    world: World, vcsim: Vcsim, tmp_path: Path
) -> None:
    await world.create_infraenv("discovery")
    vm = await boot_vm(world, vcsim, tmp_path)
    await world.nodepool(NODEPOOL).scale(1)
    agent = await registered_agent(world, vm)
    await prepare(world, agent)
    await eventually(
        world.snapshot, lambda s: len(s.bound_agents()) == 1, within=WITHIN, what="bound"
    )
    await asyncio.to_thread(vcsim.govc, "vm.destroy", vm.name)
    await eventually(
        lambda: asyncio.sleep(0, world.violations),
        lambda v: len(v) >= 2,
        within=WITHIN,
        what="2 violations",
    )
    assert any("deleted while the Agent was bound" in v for v in world.violations)
    assert any("was deleted while bound to AgentMachine" in v for v in world.violations)
    world.violations.clear()  # seen: the fixture's check must not fail the test


# --- world checks ----------------------------------------------------------------------


async def test_the_world_check_names_a_cached_iso_whose_name_lies(
    world: World, vcsim: Vcsim
) -> None:
    image = world.iso_server.publish(world.namespace, "discovery")
    assert vcsim.workdir is not None
    folder = vcsim.workdir / "datastores/dc1/iso-ds/agent-forge" / world.namespace / "workers"
    folder.mkdir(parents=True)
    true = folder / image.file_name
    true.write_bytes(image.data)
    lying = folder / f"{hashlib.sha256(image.data[:-1]).hexdigest()}.iso"
    lying.write_bytes(image.data)
    (folder / ".upload-0123.iso").write_bytes(b"partial")  # a temporary, not named by content
    try:
        assert world.untrue_isos() == [
            f"[iso-ds] agent-forge/{world.namespace}/workers/{lying.name} holds bytes with "
            f"sha256 {image.sha256}"
        ]
        with pytest.raises(AssertionError, match=lying.name):
            world.check()
    finally:
        lying.unlink()
    assert world.untrue_isos() == []
