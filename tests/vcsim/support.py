"""Helpers shared by the simulator tests: VM requests, raw reads, counter deltas."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from agentforge.vsphere import (
    Hardware,
    OwnershipMarkers,
    Placement,
    VmRequest,
    VsphereService,
    vmomi,
)
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vmomi import vim

ISO = "[iso-ds] agent-forge/ns1/pool1/" + "ab" * 32 + ".iso"


def request(
    placement: Placement,
    markers: OwnershipMarkers,
    *,
    name: str | None = None,
    hardware: Hardware | None = None,
    tag_ids: tuple[str, ...] = (),
    iso: str = ISO,
) -> VmRequest:
    return VmRequest(
        name=name or f"vm-{uuid.uuid4().hex[:8]}",
        placement=placement,
        hardware=hardware or Hardware(cpus=2, memory_mib=2048, disk_gib=20),
        iso_file=iso,
        markers=markers,
        tag_ids=tag_ids,
    )


async def raw(service: VsphereService, moid: str, *paths: str) -> dict[str, Any]:
    """Read properties of a VM directly (to check what the facts do not show)."""
    session = await service.session()
    ref = vms.ref_of(session, moid)
    found = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=vmomi.object_specs([ref]),
            props=[(vim.VirtualMachine, list(paths))],
        ),
        subject=moid,
        action="read",
    )
    return found[0].props if found else {}


async def extra_config(service: VsphereService, moid: str) -> dict[str, str]:
    got = await raw(service, moid, "config.extraConfig")
    return {o.key: o.value for o in got.get("config.extraConfig") or []}


async def vm_names_in_folder(service: VsphereService, placement: Placement) -> list[str]:
    return sorted(f.name for f in await service.vms_in_folder(placement=placement))


def delta(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> int:
    return int(after.get(key, 0)) - int(before.get(key, 0))


def method_delta(before: Mapping[str, Any], after: Mapping[str, Any], method: str) -> int:
    return delta(before.get("methods", {}), after.get("methods", {}), method)
