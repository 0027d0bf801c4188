"""vcsim-af over the network: inventory, TLS, files, tags, launcher, CLI and faults.

Every test talks to a real simulator process through pyVmomi (TLS verified against the
simulator's CA, never "insecure"), HTTP or govc; the second half drives the fault
injection: the guest-locked CD-ROM door and its question, unrelated questions, scripted
task failures, ended sessions, counters, the request log and delays.
"""

from __future__ import annotations

import ipaddress
import os
import re
import selectors
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim, vmodl

from sim.actors.waiting import eventually
from sim.controlplane.processes import wait_for
from sim.paths import REPO_ROOT, MissingBinaryError
from sim.vcsim import Vcsim, VcsimControl, VcsimControlError

pytestmark = pytest.mark.vcsim

DEADLINE_S = 15.0


# --- helpers -------------------------------------------------------------------------


def connect(simulator: Vcsim) -> vim.ServiceInstance:
    return SmartConnect(
        host=simulator.host,
        port=simulator.port,
        user=simulator.username,
        pwd=simulator.password,
        sslContext=simulator.ssl_context(),
    )


@pytest.fixture
def si(vcsim: Vcsim) -> Iterator[vim.ServiceInstance]:
    service_instance = connect(vcsim)
    yield service_instance
    Disconnect(service_instance)


def find(si: vim.ServiceInstance, path: str) -> vim.ManagedEntity:
    found = si.content.searchIndex.FindByInventoryPath(path)
    assert found is not None, f"{path} not in the inventory"
    return found


def task_info(task: vim.Task, *paths: str) -> dict[str, object]:
    """Read only the named `info.*` paths of a task through the property collector.

    Reading the whole `task.info` makes pyVmomi type-check `info.entity`, and vcsim names
    a datastore-search task's entity with a DatastoreBrowser, which is no ManagedEntity:
    that check failed now and then. The operator reads only these paths too
    (agentforge/vsphere/tasks/waiter.py).
    """
    content = vim.ServiceInstance("ServiceInstance", task._stub).RetrieveContent()
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=task, skip=False)],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=list(paths))],
    )
    found = content.propertyCollector.RetrieveContents([spec])
    return {prop.name: prop.val for result in found for prop in result.propSet}


def wait_task(task: vim.Task, timeout: float = DEADLINE_S) -> vim.TaskInfo.State:
    """The task's end state, polled until it ends (failing past the deadline)."""
    seen: list[object] = []

    def ended() -> bool:
        seen.append(task_info(task, "info.state")["info.state"])
        return seen[-1] in (vim.TaskInfo.State.success, vim.TaskInfo.State.error)

    wait_for(ended, what=f"task {task} to end", timeout=timeout, interval=0.02)
    return seen[-1]


def read_until(process: subprocess.Popen[bytes], marker: bytes, timeout: float = DEADLINE_S) -> str:
    """Read a child's stdout until `marker` shows up, failing past the deadline."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while marker not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {marker!r} within {timeout}s; got {data!r}")
            if selector.select(timeout=remaining):
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"output ended before {marker!r}; got {data!r}")
                data += chunk
    return data.decode()


def folder_url(simulator: Vcsim, path: str, datastore: str) -> str:
    return f"https://{simulator.server}/folder/{path}?dcPath=dc1&dsName={datastore}"


def http(
    simulator: Vcsim,
    method: str,
    url: str,
    si: vim.ServiceInstance,
    data: bytes | None = None,
    *,
    cookie: str | None = None,
) -> tuple[int, bytes]:
    """One request on the datastore file service, with si's session cookie (or `cookie`)."""
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Cookie": cookie or si._stub.cookie}
    )
    try:
        with urllib.request.urlopen(request, context=simulator.ssl_context()) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# --- inventory -------------------------------------------------------------------------


def test_default_inventory_has_the_names_tests_and_demo_rely_on(
    vcsim_factory: Callable[..., Vcsim],
) -> None:
    simulator = vcsim_factory()
    si = connect(simulator)
    try:
        assert isinstance(find(si, "dc1"), vim.Datacenter)
        cluster = find(si, "dc1/host/cluster")
        assert isinstance(cluster, vim.ClusterComputeResource)
        assert len(cluster.host) >= 2
        pool = find(si, "dc1/host/cluster/Resources")
        assert isinstance(pool, vim.ResourcePool)
        assert pool == cluster.resourcePool
        assert isinstance(find(si, "dc1/vm"), vim.Folder)

        pod = find(si, "dc1/datastore/dsc1")
        assert isinstance(pod, vim.StoragePod)
        assert pod.podStorageDrsEntry.storageDrsConfig.podConfig.enabled is True
        assert sorted(ds.name for ds in pod.childEntity) == ["ds1", "ds2"]
        assert pod.summary.name == "dsc1"
        assert pod.summary.capacity > 0
        iso = find(si, "dc1/datastore/iso-ds")
        assert isinstance(iso, vim.Datastore)
        assert iso not in pod.childEntity

        assert isinstance(find(si, "dc1/network/VM Network"), vim.Network)
        assert isinstance(find(si, "dc1/network/dvpg1"), vim.dvs.DistributedVirtualPortgroup)

        view = si.content.viewManager.CreateContainerView(
            si.content.rootFolder, [vim.VirtualMachine], True
        )
        try:
            assert list(view.view) == [], "no VM exists unless a flag asks for one"
        finally:
            view.DestroyView()
    finally:
        Disconnect(si)


def test_inventory_flags_shape_the_inventory(vcsim_factory: Callable[..., Vcsim]) -> None:
    simulator = vcsim_factory(hosts=3, datastores=3, vms=2, folders=1, dvportgroups=2)
    si = connect(simulator)
    try:
        assert len(find(si, "dc1/host/cluster").host) == 3
        assert sorted(ds.name for ds in find(si, "dc1/datastore/dsc1").childEntity) == [
            "ds1",
            "ds2",
            "ds3",
        ]
        assert isinstance(find(si, "dc1/vm/folder1"), vim.Folder)
        assert isinstance(find(si, "dc1/network/dvpg2"), vim.dvs.DistributedVirtualPortgroup)
        for name in ("vm1", "vm2"):
            vm = find(si, f"dc1/vm/{name}")
            assert vm.runtime.powerState == vim.VirtualMachine.PowerState.poweredOn
            assert vm.summary.runtime.faultToleranceState == "notConfigured"
    finally:
        Disconnect(si)


def test_vms_connect_to_the_standard_and_the_distributed_port_group(
    si: vim.ServiceInstance,
) -> None:
    pool = find(si, "dc1/host/cluster/Resources")
    for network in ("VM Network", "dvpg1"):
        portgroup = find(si, f"dc1/network/{network}")
        if isinstance(portgroup, vim.dvs.DistributedVirtualPortgroup):
            backing = vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
                port=vim.dvs.PortConnection(
                    portgroupKey=portgroup.key,
                    switchUuid=portgroup.config.distributedVirtualSwitch.uuid,
                )
            )
        else:
            backing = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName=network)
        nic = vim.vm.device.VirtualVmxnet3(key=-1, backing=backing)
        spec = vim.vm.ConfigSpec(
            name=f"net-{uuid.uuid4().hex[:8]}",
            numCPUs=1,
            memoryMB=128,
            files=vim.vm.FileInfo(vmPathName="[ds1]"),
            deviceChange=[vim.vm.device.VirtualDeviceSpec(operation="add", device=nic)],
        )
        task = find(si, "dc1").vmFolder.CreateVM_Task(config=spec, pool=pool)
        assert wait_task(task) == vim.TaskInfo.State.success, task.info.error
        assert [n.name for n in task.info.result.network] == [network]
        assert wait_task(task.info.result.Destroy_Task()) == vim.TaskInfo.State.success


# --- NIC MAC addresses ---------------------------------------------------------------------

VCENTER_MAC = re.compile(r"00:50:56:[89ab][0-9a-f]:[0-9a-f]{2}:[0-9a-f]{2}")  # 4th octet 0x80-0xBF


def nics_by_vm(si: vim.ServiceInstance) -> dict[str, list[tuple[int, str, str, str | None]]]:
    """Every VM's NICs, as (key, MAC, addressType, MAC in guest.net), in one collector read."""
    content = si.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
    pc = vmodl.query.PropertyCollector
    spec = pc.FilterSpec(
        objectSet=[
            pc.ObjectSpec(
                obj=view,
                skip=True,
                selectSet=[pc.TraversalSpec(name="v", path="view", type=vim.view.ContainerView)],
            )
        ],
        propSet=[
            pc.PropertySpec(
                type=vim.VirtualMachine, pathSet=["name", "config.hardware.device", "guest.net"]
            )
        ],
    )
    out: dict[str, list[tuple[int, str, str, str | None]]] = {}
    try:
        result = content.propertyCollector.RetrievePropertiesEx([spec], pc.RetrieveOptions())
        while result is not None:
            for obj in result.objects:
                props = {p.name: p.val for p in obj.propSet}
                guest = {n.deviceConfigId: n.macAddress for n in props.get("guest.net") or []}
                out[props["name"]] = [
                    (d.key, d.macAddress, d.addressType, guest.get(d.key))
                    for d in props["config.hardware.device"]
                    if isinstance(d, vim.vm.device.VirtualEthernetCard)
                ]
            token = result.token
            result = (
                content.propertyCollector.ContinueRetrievePropertiesEx(token) if token else None
            )
    finally:
        view.DestroyView()
    return out


def nic_spec(
    operation: str = "add", *, mac: str | None = None, address_type: str = "generated"
) -> vim.vm.device.VirtualDeviceSpec:
    nic = vim.vm.device.VirtualVmxnet3(
        key=-1,
        addressType=address_type,
        macAddress=mac,
        backing=vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName="VM Network"),
    )
    return vim.vm.device.VirtualDeviceSpec(operation=operation, device=nic)


def test_nic_macs_are_unique_vcenter_addresses_across_creates_clones_and_reconfigures(
    vcsim_factory: Callable[..., Vcsim],
) -> None:
    # The simulator alone derives a MAC from 3 hex digits of the BIOS UUID: 300 VMs would
    # share about 10 of them. vCenter assigns unique ones from 00:50:56:80:00:00-bf:ff:ff.
    simulator = vcsim_factory(vms=300)
    si = connect(simulator)
    try:
        before = nics_by_vm(si)
        assert len(before) == 300
        macs = [nic[1] for nics in before.values() for nic in nics]
        assert len(macs) == 300, "one NIC per VM"
        assert len(set(macs)) == 300, "no MAC twice"
        for nics in before.values():
            for _key, mac, address_type, guest_mac in nics:
                assert VCENTER_MAC.fullmatch(mac), mac
                assert address_type == "assigned"
                assert guest_mac == mac, "guest.net shows the NIC's MAC"

        # A manual MAC is kept as given, and never handed out: one just outside vCenter's
        # generated range, and the very address the counter would hand out next.
        highest = max(int(m.replace(":", ""), 16) for m in macs)
        upcoming = ":".join(f"{highest + 1:012x}"[i : i + 2] for i in range(0, 12, 2))
        manual = {"manual-a": "00:50:56:3f:00:07", "manual-b": upcoming}
        root = find(si, "dc1").vmFolder
        pool = find(si, "dc1/host/cluster/Resources")

        def create(name: str, *changes: vim.vm.device.VirtualDeviceSpec) -> vim.Task:
            spec = vim.vm.ConfigSpec(
                name=name,
                numCPUs=1,
                memoryMB=128,
                files=vim.vm.FileInfo(vmPathName="[ds1]"),
                deviceChange=list(changes),
            )
            return root.CreateVM_Task(config=spec, pool=pool)

        tasks = [create(n, nic_spec(mac=m, address_type="manual")) for n, m in manual.items()]
        # Creations, clones and NICs added by reconfigure, all in flight at once.
        tasks += [create(f"created-{i}", nic_spec(), nic_spec()) for i in range(20)]
        # A non-manual MAC in the spec is vCenter's to choose, even one already in use.
        tasks.append(
            create("taken-mac", nic_spec(mac=before["vm1"][0][1], address_type="assigned"))
        )
        vm1 = find(si, "dc1/vm/vm1")
        tasks += [
            vm1.CloneVM_Task(
                folder=root,
                name=f"clone-{i}",
                spec=vim.vm.CloneSpec(location=vim.vm.RelocateSpec()),
            )
            for i in range(10)
        ]
        reconfigured = [find(si, f"dc1/vm/vm{i}") for i in range(10, 20)]
        tasks += [
            vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(deviceChange=[nic_spec()]))
            for vm in reconfigured
        ]
        for task in tasks:
            assert wait_task(task, timeout=60) == vim.TaskInfo.State.success, task.info.error

        # Editing a NIC (macAddress left empty) keeps its MAC, as on vCenter.
        vm2 = find(si, "dc1/vm/vm2")
        (nic,) = [
            d
            for d in vm2.config.hardware.device
            if isinstance(d, vim.vm.device.VirtualEthernetCard)
        ]
        nic.macAddress = None
        nic.connectable = vim.vm.device.VirtualDevice.ConnectInfo(
            startConnected=True, connected=True, allowGuestControl=True
        )
        edit = vim.vm.device.VirtualDeviceSpec(operation="edit", device=nic)
        assert (
            wait_task(vm2.ReconfigVM_Task(spec=vim.vm.ConfigSpec(deviceChange=[edit])))
            == vim.TaskInfo.State.success
        )

        # A destroyed VM's MAC is not handed to the next VM.
        vm3 = find(si, "dc1/vm/vm3")
        assert wait_task(vm3.PowerOffVM_Task()) == vim.TaskInfo.State.success
        assert wait_task(vm3.Destroy_Task()) == vim.TaskInfo.State.success
        assert wait_task(create("after-destroy", nic_spec())) == vim.TaskInfo.State.success

        after = nics_by_vm(si)
        assert len(after) == 300 - 1 + 2 + 20 + 1 + 10 + 1
        assert after["vm2"] == before["vm2"]
        for name, mac in manual.items():
            assert [(n[1], n[2]) for n in after[name]] == [(mac, "manual")]
        assert [n[1] for n in after["after-destroy"]] != [before["vm3"][0][1]]
        assert len(after["taken-mac"]) == 1
        assert after["taken-mac"][0][1] != before["vm1"][0][1]
        for i in range(10):
            assert len(after[f"clone-{i}"]) == 1
        for vm in reconfigured:
            assert len(after[vm.name]) == 2
        assigned_macs = [
            mac for name, nics in after.items() if name not in manual for _k, mac, _t, _g in nics
        ]
        assert len(assigned_macs) == 299 + 20 * 2 + 1 + 10 + 10 + 1
        assert len(set(assigned_macs)) == len(assigned_macs), "no MAC twice"
        assert not set(assigned_macs) & set(manual.values()), "a manual MAC is never handed out"
        for name, nics in after.items():
            for _key, mac, address_type, guest_mac in nics:
                if name not in manual:
                    assert VCENTER_MAC.fullmatch(mac), (name, mac)
                    assert address_type in ("assigned", "generated"), (name, address_type)
                assert guest_mac == mac, (name, mac, guest_mac)
    finally:
        Disconnect(si)


# --- TLS ---------------------------------------------------------------------------------


def test_tls_verifies_against_the_ca_file_and_nothing_else(vcsim: Vcsim) -> None:
    context = vcsim.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    with urllib.request.urlopen(
        f"https://{vcsim.server}/sdk/vimServiceVersions.xml", context=context
    ) as response:
        assert b"urn:vim25" in response.read()

    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(
            f"https://{vcsim.server}/sdk/vimServiceVersions.xml",
            context=ssl.create_default_context(),
        )
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def test_a_given_certificate_is_served_and_becomes_the_ca_file(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "given")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    simulator = vcsim_factory(
        extra_args=[f"-tlscert={tmp_path / 'tls.crt'}", f"-tlskey={tmp_path / 'tls.key'}"]
    )
    assert simulator.ca_file.read_bytes() == cert_pem
    si = connect(simulator)
    try:
        assert find(si, "dc1").name == "dc1"
    finally:
        Disconnect(si)


def test_pyvmomi_logs_in_with_the_printed_credentials_only(vcsim: Vcsim) -> None:
    si = connect(vcsim)
    try:
        assert si.content.sessionManager.currentSession.userName == vcsim.username
    finally:
        Disconnect(si)
    with pytest.raises(vim.fault.InvalidLogin):
        SmartConnect(
            host=vcsim.host,
            port=vcsim.port,
            user=vcsim.username,
            pwd="not-" + vcsim.password,
            sslContext=vcsim.ssl_context(),
        )


# --- storage placement and datastore files -----------------------------------------------


def test_recommend_datastores_answers_for_the_datastore_cluster(si: vim.ServiceInstance) -> None:
    pod = find(si, "dc1/datastore/dsc1")
    pool = find(si, "dc1/host/cluster/Resources")
    spec = vim.storageDrs.StoragePlacementSpec(
        type="create",
        resourcePool=pool,
        folder=find(si, "dc1/vm"),
        podSelectionSpec=vim.storageDrs.PodSelectionSpec(storagePod=pod),
        configSpec=vim.vm.ConfigSpec(
            name=f"placed-{uuid.uuid4().hex[:6]}", numCPUs=1, memoryMB=128
        ),
    )
    result = si.content.storageResourceManager.RecommendDatastores(storageSpec=spec)
    destinations = [r.action[0].destination for r in result.recommendations]
    assert destinations, "a datastore cluster with Storage DRS recommends its datastores"
    assert {ds.name for ds in destinations} <= {"ds1", "ds2"}
    assert all(r.target == pod for r in result.recommendations)


def test_uploaded_file_lands_on_disk_and_datastore_calls_see_it(
    vcsim: Vcsim, si: vim.ServiceInstance
) -> None:
    base = f"af-test-{uuid.uuid4().hex[:8]}"
    payload = os.urandom(4096)
    status, _ = http(vcsim, "PUT", folder_url(vcsim, f"{base}/in/a.iso", "iso-ds"), si, payload)
    assert status == 200
    assert vcsim.workdir is not None
    on_disk = vcsim.workdir / "datastores" / "dc1" / "iso-ds" / base / "in" / "a.iso"
    assert on_disk.read_bytes() == payload

    status, body = http(vcsim, "GET", folder_url(vcsim, f"{base}/in/a.iso", "iso-ds"), si)
    assert (status, body) == (200, payload)

    datacenter = find(si, "dc1")
    datastore = find(si, "dc1/datastore/iso-ds")
    browser = datastore.browser
    search = browser.SearchDatastoreSubFolders_Task(
        datastorePath=f"[iso-ds] {base}",
        searchSpec=vim.host.DatastoreBrowser.SearchSpec(
            matchPattern=["*.iso"],
            details=vim.host.DatastoreBrowser.FileInfo.Details(fileSize=True),
        ),
    )
    assert wait_task(search) == vim.TaskInfo.State.success
    found = {
        (result.folderPath, f.path, f.fileSize)
        for result in task_info(search, "info.result")["info.result"]
        for f in result.file
    }
    assert (f"[iso-ds] {base}/in", "a.iso", len(payload)) in found

    files = si.content.fileManager
    files.MakeDirectory(
        name=f"[iso-ds] {base}/out", datacenter=datacenter, createParentDirectories=True
    )
    move = files.MoveDatastoreFile_Task(
        sourceName=f"[iso-ds] {base}/in/a.iso",
        sourceDatacenter=datacenter,
        destinationName=f"[iso-ds] {base}/out/b.iso",
        destinationDatacenter=datacenter,
    )
    assert wait_task(move) == vim.TaskInfo.State.success
    assert http(vcsim, "GET", folder_url(vcsim, f"{base}/in/a.iso", "iso-ds"), si)[0] == 404
    moved = http(vcsim, "GET", folder_url(vcsim, f"{base}/out/b.iso", "iso-ds"), si)
    assert moved == (200, payload)

    delete = files.DeleteDatastoreFile_Task(name=f"[iso-ds] {base}", datacenter=datacenter)
    assert wait_task(delete) == vim.TaskInfo.State.success
    assert delete.info.entity == datacenter, "FileManager tasks name their datacenter"
    assert not (vcsim.workdir / "datastores" / "dc1" / "iso-ds" / base).exists()


# --- tags through the vAPI -----------------------------------------------------------------


async def test_tags_created_and_attached_through_the_vapi(
    vcsim: Vcsim, vcsim_control: VcsimControl
) -> None:
    suffix = uuid.uuid4().hex[:6]
    vm_name = f"tagged-{suffix}"
    vcsim.govc(
        "vm.create", "-on=false", "-ds=ds1", "-pool=cluster/Resources", "-net=VM Network", vm_name
    )
    vcsim.govc("tags.category.create", "-m", f"cat-{suffix}")
    vcsim.govc("tags.create", "-c", f"cat-{suffix}", f"tag-{suffix}")
    vcsim.govc("tags.attach", "-c", f"cat-{suffix}", f"tag-{suffix}", f"vm/{vm_name}")

    assert vcsim.govc("tags.attached.ls", "-r", f"vm/{vm_name}").split() == [f"tag-{suffix}"]
    moref = vcsim.govc("ls", "-i", f"vm/{vm_name}").strip()
    assert vcsim.govc("tags.attached.ls", f"tag-{suffix}").split() == [moref]

    counters = await vcsim_control.counters()
    assert counters["rest_logins"] >= 1
    assert counters["paths"].get("/rest", 0) + counters["paths"].get("/api", 0) > 0


# --- launcher and CLI ------------------------------------------------------------------------


def test_stop_ends_the_process_and_removes_the_workdir() -> None:
    simulator = Vcsim().start()
    pid, workdir = simulator.pid, simulator.workdir
    assert workdir is not None
    assert psutil.pid_exists(pid)
    assert (workdir / "datastores").is_dir()
    simulator.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not workdir.exists()


def test_a_dead_simulator_reports_how_it_ended_and_restarts_with_the_same_inventory() -> None:
    simulator = Vcsim(hosts=3).start()
    try:
        first = simulator.url
        os.kill(simulator.pid, signal.SIGKILL)
        wait_for(  # reaped by Popen.poll
            lambda: not simulator.running(), what="the killed simulator to end", timeout=DEADLINE_S
        )
        report = simulator.exit_report()
        assert f"exit status -{int(signal.SIGKILL)}" in report
        assert "vcsim-af.log" in report
        simulator.restart()
        assert simulator.running()
        assert simulator.url != first  # a new port: clients must read it again
        hosts = simulator.govc("find", "/", "-type", "h").split()
        assert len(hosts) == 3, hosts
    finally:
        simulator.stop()


def test_the_simulator_exits_when_the_python_process_that_started_it_dies(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from sim.vcsim import Vcsim\n"
        "v = Vcsim(workdir=Path(sys.argv[1])).start()\n"
        "print('pid', v.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "sim")],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        output = read_until(parent, b"\n", timeout=60)
        simulator = psutil.Process(int(output.split()[1]))
        assert simulator.is_running()
    finally:
        parent.kill()  # no clean-up code of the parent runs
        parent.wait(timeout=DEADLINE_S)
        if parent.stdout is not None:
            parent.stdout.close()
    simulator.wait(timeout=DEADLINE_S)  # psutil.TimeoutExpired if it lingers
    assert not (tmp_path / "sim" / "datastores").exists()


def test_a_missing_binary_fails_with_the_make_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTFORGE_BIN_DIR", str(tmp_path))
    with pytest.raises(MissingBinaryError, match="make vcsim"):
        Vcsim().start()


def test_cli_up_prints_the_endpoint_and_stops_on_sigint() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.vcsim", "up"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        output = read_until(process, b"Ctrl-C", timeout=60)
        fields: dict[str, str] = {}
        for line in output.splitlines():
            key, sep, value = line.strip().partition(":")
            if line.startswith("  ") and sep:
                fields[key] = value.strip()
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                fields[name] = value
        assert fields["url"].startswith("https://127.0.0.1:")
        assert fields["GOVC_URL"] == fields["url"]
        assert Path(fields["ca file"]).is_file()
        with urllib.request.urlopen(fields["control"] + "/healthz") as response:
            assert response.status == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=DEADLINE_S) == 0
        assert not Path(fields["ca file"]).exists(), "the CLI removes its workdir"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=DEADLINE_S)
        if process.stdout is not None:
            process.stdout.close()


# --- fault injection: helpers ------------------------------------------------------------


def make_vm_with_iso(
    simulator: Vcsim, si: vim.ServiceInstance, *, power_on: bool = True
) -> vim.VirtualMachine:
    """A VM whose IDE CD-ROM holds an uploaded ISO, connected (and running, by default)."""
    name = f"af-{uuid.uuid4().hex[:8]}"
    iso = f"isos/{name}.iso"
    status, _ = http(simulator, "PUT", folder_url(simulator, iso, "iso-ds"), si, b"ISO" * 100)
    assert status == 200
    cdrom = vim.vm.device.VirtualCdrom(
        key=-1,
        controllerKey=200,  # the first IDE controller of every simulated VM
        unitNumber=0,
        backing=vim.vm.device.VirtualCdrom.IsoBackingInfo(fileName=f"[iso-ds] {iso}"),
        connectable=vim.vm.device.VirtualDevice.ConnectInfo(
            startConnected=True, connected=True, allowGuestControl=True
        ),
    )
    spec = vim.vm.ConfigSpec(
        name=name,
        guestId="otherGuest64",
        numCPUs=1,
        memoryMB=256,
        files=vim.vm.FileInfo(vmPathName="[ds1]"),
        deviceChange=[vim.vm.device.VirtualDeviceSpec(operation="add", device=cdrom)],
    )
    create = find(si, "dc1").vmFolder.CreateVM_Task(
        config=spec, pool=find(si, "dc1/host/cluster/Resources")
    )
    assert wait_task(create) == vim.TaskInfo.State.success
    vm = create.info.result
    if power_on:
        assert wait_task(vm.PowerOnVM_Task()) == vim.TaskInfo.State.success
    return vm


def cdrom_of(vm: vim.VirtualMachine) -> vim.vm.device.VirtualCdrom:
    (cdrom,) = [d for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualCdrom)]
    return cdrom


def eject(vm: vim.VirtualMachine) -> vim.Task:
    """What an operator sends to remove the medium: disconnect, client-device backing."""
    cdrom = cdrom_of(vm)
    cdrom.connectable.connected = False
    cdrom.connectable.startConnected = False
    cdrom.backing = vim.vm.device.VirtualCdrom.RemotePassthroughBackingInfo(
        deviceName="", exclusive=False
    )
    change = vim.vm.device.VirtualDeviceSpec(operation="edit", device=cdrom)
    return vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(deviceChange=[change]))


def choices_of(question: vim.vm.QuestionInfo) -> list[tuple[str, str]]:
    return [(c.key, c.label) for c in question.choice.choiceInfo]


# --- the guest-locked CD-ROM door ----------------------------------------------------------


async def test_a_locked_door_holds_the_eject_until_the_lock_question_is_answered_yes(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si)
    key = cdrom_of(vm).key
    locked = await vcsim_control.lock_cdrom(vm.name)
    assert locked["moref"] == vm._moId

    task = eject(vm)
    question = await eventually(
        lambda: vm.runtime.question, what="the lock question", within=DEADLINE_S
    )
    assert isinstance(question, vim.vm.QuestionInfo)
    assert question.id.startswith("_vmx")
    assert question.message[0].id == "msg.cdromdisconnect.locked"
    assert "locked the CD-ROM door" in question.message[0].text
    assert choices_of(question) == [("0", "Yes"), ("1", "No")]
    assert question.choice.choiceInfo[question.choice.defaultIndex].key == "1"
    assert task.info.state == vim.TaskInfo.State.running

    with pytest.raises(vmodl.fault.InvalidArgument):
        vm.AnswerVM(questionId=question.id + "9", answerChoice="0")
    assert vm.runtime.question.id == question.id
    assert task.info.state == vim.TaskInfo.State.running
    assert cdrom_of(vm).connectable.connected is True

    vm.AnswerVM(questionId=question.id, answerChoice="0")
    assert wait_task(task) == vim.TaskInfo.State.success
    assert vm.runtime.question is None
    cdrom = cdrom_of(vm)
    assert cdrom.connectable.connected is False
    assert isinstance(cdrom.backing, vim.vm.device.VirtualCdrom.RemotePassthroughBackingInfo)

    (reconfigure,) = await vcsim_control.request_log("ReconfigVM_Task")
    assert reconfigure["target"] == {"type": "VirtualMachine", "value": vm._moId}
    assert reconfigure["cdrom_disconnect"] is True
    assert reconfigure["cdrom_device_keys"] == [key]
    assert reconfigure["cdrom"][0]["backing_before"].startswith("[iso-ds] isos/")
    answers = [
        (e["question_id"], e["answer_choice"], e["status"], e.get("fault"))
        for e in await vcsim_control.request_log("AnswerVM")
    ]
    assert answers == [
        (question.id + "9", "0", 500, "InvalidArgument"),
        (question.id, "0", 200, None),
    ]


async def test_no_to_the_lock_question_fails_the_eject_and_keeps_the_medium(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si)
    await vcsim_control.lock_cdrom(vm.config.uuid)  # by BIOS UUID this time
    task = eject(vm)
    question = await eventually(
        lambda: vm.runtime.question, what="the lock question", within=DEADLINE_S
    )
    assert isinstance(question, vim.vm.QuestionInfo)

    busy = vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(annotation="meanwhile"))
    assert wait_task(busy) == vim.TaskInfo.State.error
    assert isinstance(busy.info.error, vim.fault.TaskInProgress)

    vm.AnswerVM(questionId=question.id, answerChoice="1")
    assert wait_task(task) == vim.TaskInfo.State.error
    assert isinstance(task.info.error, vim.fault.GenericVmConfigFault)
    assert vm.runtime.question is None
    cdrom = cdrom_of(vm)
    assert cdrom.connectable.connected is True
    assert cdrom.backing.fileName.startswith("[iso-ds] isos/")


async def test_the_door_only_matters_while_locked_and_running(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si)
    await vcsim_control.lock_cdrom(vm._moId)
    assert vm._moId in await vcsim_control.locked_cdroms()
    await vcsim_control.unlock_cdrom(vm.name)
    assert wait_task(eject(vm)) == vim.TaskInfo.State.success
    assert vm.runtime.question is None

    stopped = make_vm_with_iso(vcsim, si, power_on=False)
    with pytest.raises(VcsimControlError) as refused:
        await vcsim_control.lock_cdrom(stopped.name)
    assert refused.value.status == 409
    assert wait_task(stopped.PowerOnVM_Task()) == vim.TaskInfo.State.success
    await vcsim_control.lock_cdrom(stopped.name)
    assert wait_task(stopped.PowerOffVM_Task()) == vim.TaskInfo.State.success
    assert stopped._moId not in await vcsim_control.locked_cdroms(), "the lock is the guest's"
    with pytest.raises(VcsimControlError) as unknown:
        await vcsim_control.lock_cdrom("no-such-vm")
    assert unknown.value.status == 404
    (entry,) = await vcsim_control.request_log("ReconfigVM_Task")
    assert entry["cdrom_disconnect"] is True, "the log tells disconnects apart, locked or not"


async def test_destroying_a_vm_fails_the_reconfigure_it_was_holding(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si)
    moref = vm._moId
    await vcsim_control.lock_cdrom(vm.name)
    task = eject(vm)
    await eventually(lambda: vm.runtime.question, what="the lock question", within=DEADLINE_S)
    assert wait_task(vm.PowerOffVM_Task()) == vim.TaskInfo.State.success
    assert wait_task(vm.Destroy_Task()) == vim.TaskInfo.State.success
    assert wait_task(task) == vim.TaskInfo.State.error
    assert isinstance(task.info.error, vmodl.fault.ManagedObjectNotFound)
    assert all(q["vm"] != moref for q in await vcsim_control.questions())
    assert moref not in await vcsim_control.locked_cdroms()


async def test_an_unrelated_question_is_answered_like_on_vcenter_and_queues_ahead(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si)
    moved = await vcsim_control.raise_question(
        vm.name,
        "msg.uuid.altered",
        "This virtual machine might have been moved or copied.",
        choices=[("0", "Cancel"), ("1", "I Moved It"), ("2", "I Copied It")],
        default="2",
    )
    await vcsim_control.lock_cdrom(vm.name)
    task = eject(vm)

    shown = vm.runtime.question
    assert shown.id == moved
    assert shown.message[0].id == "msg.uuid.altered"
    assert choices_of(shown)[2] == ("2", "I Copied It")
    # The simulator is shared: other tests' VMs may still be asking (questions belong to
    # VMs and are not reset between tests), so only this VM's queue is this test's.
    pending = [q for q in await vcsim_control.questions() if q["vm"] == vm._moId]
    assert [(q["id"], q["message_id"], q["shown"]) for q in pending] == [
        (moved, "msg.uuid.altered", True),
        (pending[1]["id"], "msg.cdromdisconnect.locked", False),
    ]

    with pytest.raises(vmodl.fault.InvalidArgument):
        vm.AnswerVM(questionId=moved, answerChoice="7")
    vm.AnswerVM(questionId=moved, answerChoice="1")
    lock_question = vm.runtime.question
    assert lock_question.message[0].id == "msg.cdromdisconnect.locked"
    assert task.info.state == vim.TaskInfo.State.running
    vm.AnswerVM(questionId=lock_question.id, answerChoice="0")
    assert wait_task(task) == vim.TaskInfo.State.success
    assert all(q["vm"] != vm._moId for q in await vcsim_control.questions())


# --- scripted failures -----------------------------------------------------------------------


async def test_failed_tasks_end_in_the_fault_and_change_nothing(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    folder = find(si, "dc1").vmFolder
    pool = find(si, "dc1/host/cluster/Resources")
    name = f"af-{uuid.uuid4().hex[:8]}"
    spec = vim.vm.ConfigSpec(
        name=name, numCPUs=1, memoryMB=128, files=vim.vm.FileInfo(vmPathName="[ds1]")
    )

    await vcsim_control.fail_next_tasks("CreateVM_Task", 1, "InvalidState")
    failed = folder.CreateVM_Task(config=spec, pool=pool)
    assert wait_task(failed) == vim.TaskInfo.State.error
    assert isinstance(failed.info.error, vim.fault.InvalidState)
    assert si.content.searchIndex.FindByInventoryPath(f"dc1/vm/{name}") is None

    created = folder.CreateVM_Task(config=spec, pool=pool)
    assert wait_task(created) == vim.TaskInfo.State.success
    vm = created.info.result

    await vcsim_control.fail_next_tasks("Destroy_Task", 2, "TaskInProgress", target=vm._moId)
    for _ in range(2):
        destroy = vm.Destroy_Task()
        assert wait_task(destroy) == vim.TaskInfo.State.error
        assert isinstance(destroy.info.error, vim.fault.TaskInProgress)
    assert si.content.searchIndex.FindByInventoryPath(f"dc1/vm/{name}") == vm
    assert wait_task(vm.Destroy_Task()) == vim.TaskInfo.State.success
    assert (await vcsim_control.counters())["faults_injected"] == 3
    assert (await vcsim_control.fault_rules())["rules"] == []


async def test_call_stage_failures_raise_from_the_call_itself(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si, power_on=False)
    await vcsim_control.fail_next_tasks(
        "PowerOnVM_Task", 1, "NotAuthenticated", stage="call", message="token expired"
    )
    with pytest.raises(vim.fault.NotAuthenticated):
        vm.PowerOnVM_Task()
    assert wait_task(vm.PowerOnVM_Task()) == vim.TaskInfo.State.success

    await vcsim_control.fail_next_tasks("FindByInventoryPath", 2, "SystemError")
    for _ in range(2):
        with pytest.raises(vmodl.fault.SystemError):
            si.content.searchIndex.FindByInventoryPath("dc1")
    assert si.content.searchIndex.FindByInventoryPath("dc1") is not None
    failed = await vcsim_control.request_log("FindByInventoryPath")
    assert [e.get("fault") for e in failed[-3:]] == ["SystemError", "SystemError", None]


async def test_fault_rules_are_checked_when_made_and_reset_after_each_test(
    vcsim_control: VcsimControl,
) -> None:
    known = await vcsim_control.fault_rules()
    assert {"InvalidState", "NotAuthenticated", "TaskInProgress", "SystemError"} <= set(
        known["faults"]
    )
    assert {"CreateVM_Task", "ReconfigVM_Task", "PowerOnVM_Task", "Destroy_Task"} <= set(
        known["task_methods"]
    )
    with pytest.raises(VcsimControlError, match="unknown fault"):
        await vcsim_control.fail_next_tasks("CreateVM_Task", 1, "NoSuchFault")
    with pytest.raises(VcsimControlError, match="stage"):
        await vcsim_control.fail_next_tasks("FindByUuid", 1, "SystemError", stage="task")

    await vcsim_control.fail_next_tasks("PowerOffVM_Task", 5, "InvalidState")
    await vcsim_control.set_delay("CurrentTime", 50)
    vcsim_control.reset_blocking()  # what the plugin does after every test using `vcsim`
    assert (await vcsim_control.fault_rules())["rules"] == []
    assert await vcsim_control.delays() == {"delays": {}, "task_delays": {}}


# --- sessions ---------------------------------------------------------------------------------


async def test_ending_sessions_forces_every_client_to_log_in_again(
    vcsim_factory: Callable[..., Vcsim],
) -> None:
    simulator = vcsim_factory()  # private: ending sessions must not disturb other tests
    control = simulator.control
    si = connect(simulator)
    auth = {"Authorization": aiohttp.encode_basic_auth(simulator.username, simulator.password)}
    rest = f"https://{simulator.server}/rest/com/vmware/cis"
    try:
        si.CurrentTime()
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{rest}/session", headers=auth, ssl=simulator.ssl_context()
            ) as created:
                assert created.status == 200
                token = (await created.json())["value"]
            headers = {"vmware-api-session-id": token}
            async with session.get(
                f"{rest}/tagging/category", headers=headers, ssl=simulator.ssl_context()
            ) as listed:
                assert listed.status == 200

            ended = await control.end_sessions()
            assert ended["rest_sessions"] == 1

            with pytest.raises(vim.fault.NotAuthenticated):
                si.CurrentTime()
            async with session.get(
                f"{rest}/tagging/category", headers=headers, ssl=simulator.ssl_context()
            ) as refused:
                assert refused.status == 401

        si.content.sessionManager.Login(userName=simulator.username, password=simulator.password)
        si.CurrentTime()
        counters = await control.counters()
        assert counters["logins"] == 2
        assert counters["rest_logins"] == 1
        log = await control.request_log("CurrentTime")
        assert [e.get("fault") for e in log] == [None, "NotAuthenticated", None]
    finally:
        Disconnect(si)


async def test_datastore_files_work_again_after_ending_sessions_and_logging_in(
    vcsim_factory: Callable[..., Vcsim],
) -> None:
    simulator = vcsim_factory()  # private: ending sessions must not disturb other tests
    si = connect(simulator)
    base = f"af-test-{uuid.uuid4().hex[:8]}"
    try:
        before = folder_url(simulator, f"{base}/before.iso", "iso-ds")
        assert http(simulator, "PUT", before, si, b"before")[0] == 200
        old_cookie = si._stub.cookie

        await simulator.control.end_sessions()

        assert http(simulator, "GET", before, si)[0] == 401, "an ended session's cookie"
        with pytest.raises(vim.fault.NotAuthenticated):
            si.CurrentTime()

        si.content.sessionManager.Login(userName=simulator.username, password=simulator.password)
        assert si._stub.cookie != old_cookie
        payload = os.urandom(4096)
        after = folder_url(simulator, f"{base}/after.iso", "iso-ds")
        assert http(simulator, "PUT", after, si, payload)[0] == 200
        assert http(simulator, "GET", after, si) == (200, payload)
        assert http(simulator, "GET", before, si) == (200, b"before")
        assert simulator.workdir is not None
        on_disk = simulator.workdir / "datastores" / "dc1" / "iso-ds" / base / "after.iso"
        assert on_disk.read_bytes() == payload

        assert http(simulator, "GET", after, si, cookie=old_cookie)[0] == 401
        assert http(simulator, "PUT", after, si, b"x", cookie=old_cookie)[0] == 401
        assert on_disk.read_bytes() == payload, "a refused upload writes nothing"
        log = await simulator.control.request_log(kind="http")
        statuses = [e["status"] for e in log if e["path"].startswith("/folder/")]
        assert statuses == [200, 401, 200, 200, 200, 401, 401]
    finally:
        Disconnect(si)


# --- counters, log and delays ------------------------------------------------------------------


async def test_counters_count_methods_paths_and_logins(
    vcsim: Vcsim, vcsim_control: VcsimControl
) -> None:
    si = connect(vcsim)
    try:
        find(si, "dc1")
        status, _ = http(
            vcsim, "PUT", folder_url(vcsim, f"c/{uuid.uuid4().hex}", "iso-ds"), si, b"x"
        )
        assert status == 200
        counters = await vcsim_control.counters()
        assert counters["logins"] == 1
        assert counters["methods"]["Login"] == 1
        assert counters["methods"]["FindByInventoryPath"] == 1
        assert counters["methods"]["RetrieveServiceContent"] >= 1
        assert counters["paths"]["/folder"] == 1
        assert counters["http"]["PUT /folder"] == 1
        assert counters["paths"]["/sdk"] == sum(
            n for key, n in counters["http"].items() if key.endswith(" /sdk")
        )
        assert counters["http"]["GET /sdk"] >= 1, "pyVmomi reads vimServiceVersions.xml"

        await vcsim_control.reset_counters()
        assert await vcsim_control.counters() == {
            "methods": {},
            "paths": {},
            "http": {},
            "logins": 0,
            "rest_logins": 0,
            "faults_injected": 0,
        }
    finally:
        Disconnect(si)


async def test_request_log_records_method_target_and_time(
    vcsim: Vcsim, vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    vm = make_vm_with_iso(vcsim, si, power_on=False)
    mark = await vcsim_control.last_seq()
    before = datetime.now(UTC)
    assert wait_task(vm.PowerOnVM_Task()) == vim.TaskInfo.State.success
    after = datetime.now(UTC)

    entries = await vcsim_control.request_log(since=mark)
    assert all(e["seq"] > mark for e in entries)
    (power_on,) = [e for e in entries if e.get("method") == "PowerOnVM_Task"]
    assert power_on["kind"] == "soap"
    assert power_on["target"] == {"type": "VirtualMachine", "value": vm._moId}
    assert power_on["status"] == 200
    assert before <= datetime.fromisoformat(power_on["time"]) <= after
    assert "cdrom_disconnect" not in power_on

    uploads = await vcsim_control.request_log(kind="http")
    assert any(e["http_method"] == "PUT" and e["path"].startswith("/folder/isos/") for e in uploads)
    assert all("method" not in e for e in uploads)


async def test_set_delay_slows_one_method_down(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    assert await vcsim_control.set_delay("CurrentTime", 400) == {"CurrentTime": 400}
    started = time.monotonic()
    si.CurrentTime()
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    find(si, "dc1")
    assert time.monotonic() - started < 0.4, "other methods are not delayed"
    await vcsim_control.clear_delays()
    (entry,) = await vcsim_control.request_log("CurrentTime")
    assert entry["duration_ms"] >= 400


async def test_a_task_delay_keeps_the_task_in_flight_without_blocking_the_inventory(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    delays = await vcsim_control.set_delay("CreateVM_Task", 1500, stage="task")
    assert delays == {"CreateVM_Task": 1500}
    name = f"af-{uuid.uuid4().hex[:8]}"
    spec = vim.vm.ConfigSpec(
        name=name, numCPUs=1, memoryMB=128, files=vim.vm.FileInfo(vmPathName="[ds1]")
    )
    started = time.monotonic()
    task = find(si, "dc1").vmFolder.CreateVM_Task(
        config=spec, pool=find(si, "dc1/host/cluster/Resources")
    )
    assert task.info.state == vim.TaskInfo.State.running
    assert si.content.searchIndex.FindByInventoryPath(f"dc1/vm/{name}") is None
    assert find(si, "dc1/vm").childEntity is not None  # the folder stays readable
    assert time.monotonic() - started < 1.5

    assert wait_task(task) == vim.TaskInfo.State.success
    assert time.monotonic() - started >= 1.5
    vm = task.info.result
    assert isinstance(vm, vim.VirtualMachine)
    assert si.content.searchIndex.FindByInventoryPath(f"dc1/vm/{name}") == vm
    with pytest.raises(VcsimControlError, match="task delays"):
        await vcsim_control.set_delay("FindByUuid", 100, stage="task")


# --- one VM name per folder ----------------------------------------------------------------


def create_vm(si: vim.ServiceInstance, name: str, folder: vim.Folder | None = None) -> vim.Task:
    spec = vim.vm.ConfigSpec(
        name=name, numCPUs=1, memoryMB=128, files=vim.vm.FileInfo(vmPathName="[ds1]")
    )
    return (folder or find(si, "dc1").vmFolder).CreateVM_Task(
        config=spec, pool=find(si, "dc1/host/cluster/Resources")
    )


def vms_named(si: vim.ServiceInstance, folder: vim.Folder, name: str) -> list[vim.VirtualMachine]:
    return [c for c in folder.childEntity if isinstance(c, vim.VirtualMachine) and c.name == name]


async def test_a_second_vm_of_a_name_in_the_same_folder_fails_with_duplicate_name(
    si: vim.ServiceInstance,
) -> None:
    root = find(si, "dc1").vmFolder
    name = f"af-{uuid.uuid4().hex[:8]}"
    first = create_vm(si, name)
    assert wait_task(first) == vim.TaskInfo.State.success

    second = create_vm(si, name)
    assert wait_task(second) == vim.TaskInfo.State.error
    fault = second.info.error
    assert isinstance(fault, vim.fault.DuplicateName)
    assert fault.name == name
    assert fault.object == first.info.result
    assert vms_named(si, root, name) == [first.info.result]

    other = root.CreateFolder(f"af-{uuid.uuid4().hex[:8]}")
    elsewhere = create_vm(si, name, other)  # the name is per folder
    assert wait_task(elsewhere) == vim.TaskInfo.State.success

    clone = first.info.result.CloneVM_Task(
        folder=root, name=name, spec=vim.vm.CloneSpec(location=vim.vm.RelocateSpec())
    )
    assert wait_task(clone) == vim.TaskInfo.State.error
    assert isinstance(clone.info.error, vim.fault.DuplicateName)
    assert vms_named(si, root, name) == [first.info.result]


async def test_the_name_is_reserved_while_the_first_create_task_runs(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    root = find(si, "dc1").vmFolder
    name = f"af-{uuid.uuid4().hex[:8]}"
    await vcsim_control.set_delay("CreateVM_Task", 1500, stage="task")
    first = create_vm(si, name)
    assert first.info.state == vim.TaskInfo.State.running
    assert vms_named(si, root, name) == []  # no VM yet: the name is taken all the same

    second = create_vm(si, name)  # as a restarted operator would
    assert wait_task(second) == vim.TaskInfo.State.error
    assert isinstance(second.info.error, vim.fault.DuplicateName)
    assert second.info.error.object == root
    assert first.info.state == vim.TaskInfo.State.running, "the refusal did not wait for it"

    assert wait_task(first) == vim.TaskInfo.State.success
    await vcsim_control.clear_delays()
    assert vms_named(si, root, name) == [first.info.result]
    third = create_vm(si, name)  # ended: the VM itself now holds the name
    assert wait_task(third) == vim.TaskInfo.State.error
    assert third.info.error.object == first.info.result


async def test_find_child_answers_while_creates_run_in_the_folder(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    """govmomi's FindChild panics on a child without a name (a VM still being created
    was one, in a 200-VM burst) and the panic left the SearchIndex locked: every later
    call hung. Our hook reads each child's name under its lock and skips unnamed ones."""
    index = si.content.searchIndex
    datacenter = find(si, "dc1")
    root = datacenter.vmFolder
    assert index.FindChild(datacenter, "vm") == root  # (not a folder: the simulator's own)
    await vcsim_control.set_delay("CreateVM_Task", 300, stage="task")
    names = [f"af-{uuid.uuid4().hex[:8]}" for _ in range(20)]
    creates = [create_vm(si, name) for name in names]
    found: dict[str, vim.ManagedEntity] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(found) < len(names):  # asked over and over while the creates run and end
        assert time.monotonic() < deadline, f"only {sorted(found)} of {names} found"
        for name in names:
            child = index.FindChild(root, name)
            if child is not None:
                found[name] = child
    await vcsim_control.clear_delays()
    assert all(wait_task(t) == vim.TaskInfo.State.success for t in creates)
    assert [found[n] for n in names] == [
        task_info(t, "info.result")["info.result"] for t in creates
    ]
    assert index.FindChild(root, "af-no-such-vm") is None


async def test_a_failed_create_releases_the_name(
    vcsim_control: VcsimControl, si: vim.ServiceInstance
) -> None:
    root = find(si, "dc1").vmFolder
    name = f"af-{uuid.uuid4().hex[:8]}"
    no_files = vim.vm.ConfigSpec(name=name, numCPUs=1, memoryMB=128)
    failed = root.CreateVM_Task(config=no_files, pool=find(si, "dc1/host/cluster/Resources"))
    assert wait_task(failed) == vim.TaskInfo.State.error
    assert isinstance(failed.info.error, vim.fault.InvalidVmConfig)
    await vcsim_control.fail_next_tasks("CreateVM_Task", 1, "InsufficientResourcesFault")
    scripted = create_vm(si, name)  # a scripted failure reserves nothing either
    assert wait_task(scripted) == vim.TaskInfo.State.error
    retried = create_vm(si, name)
    assert wait_task(retried) == vim.TaskInfo.State.success
    assert vms_named(si, root, name) == [retried.info.result]
