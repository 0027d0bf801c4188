"""What the simulated world sees of vCenter: every VM's facts in one cheap query.

The Assisted Installer stand-in needs, for each VM, whether it runs, which ISO its
CD-ROM holds, its BIOS UUID, MACs, CPUs, memory and disks. All of it comes from one
`RetrievePropertiesEx` over a container view of every VM (plus continuation pages
past 500 VMs), so a tick costs one SOAP round trip however many VMs exist. The
optional `extraConfig` read is for snapshots (ownership markers), not for ticks.

pyVmomi is blocking: calls run on a worker thread, one at a time per connection
(a SOAP stub is not safe for concurrent use). A session the server forgot
(`NotAuthenticated`, e.g. after vcsim's `end_sessions()`) is re-established once.
This module uses pyVmomi directly on purpose: the actors play other people's
software and must not borrow the operator's vSphere layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim, vmodl

__all__ = ["VcenterReader", "VmFact", "iso_sha256"]

_PAGE = 500
_CONTENT_ADDRESSED = re.compile(r"(?:^|[/\] ])([0-9a-f]{64})\.iso$")
_PROPS = (
    "name",
    "config.uuid",
    "config.hardware.device",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "runtime.powerState",
)


def iso_sha256(file_name: str) -> str | None:
    """The sha256 in a content-addressed ISO name (`[ds] a/b/<sha256>.iso`), else None."""
    match = _CONTENT_ADDRESSED.search(file_name.strip().lower())
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class VmFact:
    """One VM as the simulated world needs to know it."""

    moref: str
    name: str
    bios_uuid: str
    powered_on: bool
    iso_files: tuple[str, ...] = ()
    """Backing file names of the CD-ROMs that hold an ISO image."""
    macs: tuple[str, ...] = ()
    num_cpus: int = 0
    memory_mib: int = 0
    disk_bytes: tuple[int, ...] = ()
    extra_config: Mapping[str, str] = field(default_factory=dict)
    """Only filled by `vms(extra_config=True)`."""

    @property
    def iso_digests(self) -> tuple[str, ...]:
        return tuple(d for d in (iso_sha256(f) for f in self.iso_files) if d)


class VcenterReader:
    """A read-only SOAP session to one vCenter (or vcsim)."""

    def __init__(
        self, *, host: str, port: int, username: str, password: str, ssl_context: ssl.SSLContext
    ) -> None:
        self._login = {"host": host, "port": port, "user": username, "pwd": password}
        self._ssl = ssl_context
        self._si: Any = None
        self._view: Any = None
        self._lock = asyncio.Lock()
        self.queries = 0

    async def connect(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._connect)

    async def close(self) -> None:
        async with self._lock:
            si, self._si, self._view = self._si, None, None
            if si is not None:
                await asyncio.to_thread(_quiet_disconnect, si)

    async def vms(self, *, extra_config: bool = False) -> list[VmFact]:
        """Every VM in the inventory (one property-collector query)."""
        async with self._lock:
            self.queries += 1
            return await asyncio.to_thread(self._vms_retrying, extra_config)

    # --- on the worker thread ---------------------------------------------------------

    def _connect(self) -> None:
        self._si = SmartConnect(**self._login, sslContext=self._ssl)
        content = self._si.RetrieveContent()
        self._view = content.viewManager.CreateContainerView(
            content.rootFolder, [vim.VirtualMachine], True
        )

    def _vms_retrying(self, extra_config: bool) -> list[VmFact]:
        if self._si is None:
            self._connect()
        try:
            return self._vms(extra_config)
        except vim.fault.NotAuthenticated:
            _quiet_disconnect(self._si)
            self._connect()
            return self._vms(extra_config)

    def _vms(self, extra_config: bool) -> list[VmFact]:
        collector = self._si.content.propertyCollector
        paths = [*_PROPS, "config.extraConfig"] if extra_config else list(_PROPS)
        spec = vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[
                vmodl.query.PropertyCollector.ObjectSpec(
                    obj=self._view,
                    skip=True,
                    selectSet=[
                        vmodl.query.PropertyCollector.TraversalSpec(
                            type=vim.view.ContainerView, path="view", skip=False
                        )
                    ],
                )
            ],
            propSet=[
                vmodl.query.PropertyCollector.PropertySpec(type=vim.VirtualMachine, pathSet=paths)
            ],
        )
        options = vmodl.query.PropertyCollector.RetrieveOptions(maxObjects=_PAGE)
        result = collector.RetrievePropertiesEx([spec], options)
        facts: list[VmFact] = []
        while result is not None:
            facts.extend(_fact(obj) for obj in result.objects)
            token = result.token
            result = collector.ContinueRetrievePropertiesEx(token) if token else None
        return [f for f in facts if f.bios_uuid]


def _fact(obj: Any) -> VmFact:
    props = {p.name: p.val for p in obj.propSet}
    devices = props.get("config.hardware.device") or []
    isos, macs, disks = [], [], []
    for device in devices:
        if isinstance(device, vim.vm.device.VirtualCdrom):
            backing = device.backing
            if isinstance(backing, vim.vm.device.VirtualCdrom.IsoBackingInfo) and backing.fileName:
                isos.append(str(backing.fileName))
        elif isinstance(device, vim.vm.device.VirtualEthernetCard) and device.macAddress:
            macs.append(str(device.macAddress).lower())
        elif isinstance(device, vim.vm.device.VirtualDisk):
            disks.append(int(device.capacityInBytes or 0))
    extra = {str(o.key): str(o.value) for o in props.get("config.extraConfig") or []}
    return VmFact(
        moref=str(obj.obj._moId),
        name=str(props.get("name", "")),
        bios_uuid=str(props.get("config.uuid") or "").lower(),
        powered_on=props.get("runtime.powerState") == vim.VirtualMachine.PowerState.poweredOn,
        iso_files=tuple(isos),
        macs=tuple(macs),
        num_cpus=int(props.get("config.hardware.numCPU") or 0),
        memory_mib=int(props.get("config.hardware.memoryMB") or 0),
        disk_bytes=tuple(disks),
        extra_config=extra,
    )


def _quiet_disconnect(si: Any) -> None:
    with contextlib.suppress(Exception):  # a session that is already gone needs no logout
        Disconnect(si)
