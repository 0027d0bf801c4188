"""What the operator knows about a VM, read in one PropertyCollector round trip.

`VM_PATHS` is the whole path set; `parse_vm` turns the raw property dict into a
frozen `VmFacts` (defined, with the other value types, in `model.facts` and
re-exported here) without further requests. The facts cover identity (name, BIOS and
instance UUID, primary MAC), power state, ownership markers, every CD-ROM (device
key, backing file, connection state) and a pending question, which is all that the
reconcilers and the ejection recovery need to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentforge import identity
from agentforge.vsphere.model import markers
from agentforge.vsphere.model.facts import (
    CDROM_LOCK_MESSAGE,
    Cdrom,
    Choice,
    MediumKind,
    PowerState,
    Question,
    VmFacts,
)
from agentforge.vsphere.vmomi import Lazy, vim

VM_PATHS = (
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.hardware.device",
    "config.extraConfig",
    "runtime.powerState",
    "runtime.question",
)
_CD: Any = Lazy("vim.vm.device.VirtualCdrom")


def parse_vm(moid: str, props: Mapping[str, Any]) -> VmFacts:
    devices = list(props.get("config.hardware.device") or [])
    macs = tuple(_macs(devices))
    extra = {str(o.key): str(o.value) for o in props.get("config.extraConfig") or []}
    return VmFacts(
        moid=moid,
        name=str(props.get("name") or ""),
        bios_uuid=_uuid(props.get("config.uuid")),
        instance_uuid=_uuid(props.get("config.instanceUuid")),
        primary_mac=macs[0] if macs else None,
        macs=macs,
        power_state=_power(props.get("runtime.powerState")),
        markers=markers.extract(extra),
        cdroms=tuple(parse_cdrom(d) for d in devices if isinstance(d, vim.vm.device.VirtualCdrom)),
        question=parse_question(props.get("runtime.question")),
    )


def parse_cdrom(device: Any) -> Cdrom:
    backing = device.backing
    if isinstance(backing, vim.vm.device.VirtualCdrom.IsoBackingInfo):
        kind, file_name = MediumKind.ISO, str(backing.fileName or "")
    elif isinstance(backing, (_CD.RemotePassthroughBackingInfo, _CD.RemoteAtapiBackingInfo)):
        kind, file_name = MediumKind.CLIENT, None
    elif isinstance(backing, (_CD.AtapiBackingInfo, _CD.PassthroughBackingInfo)):
        kind, file_name = MediumKind.HOST, None
    else:
        kind, file_name = MediumKind.NONE, None
    conn = device.connectable
    return Cdrom(
        key=int(device.key),
        controller_key=int(device.controllerKey or 0),
        unit_number=int(device.unitNumber or 0),
        kind=kind,
        backing_file=file_name,
        connected=bool(conn.connected) if conn is not None else False,
        start_connected=bool(conn.startConnected) if conn is not None else False,
    )


def parse_question(info: Any) -> Question | None:
    if info is None:
        return None
    choice = getattr(info, "choice", None)
    options = getattr(choice, "choiceInfo", None) or []
    return Question(
        id=str(info.id),
        text=str(info.text or ""),
        message_ids=tuple(str(m.id) for m in getattr(info, "message", None) or []),
        choices=tuple(Choice(key=str(o.key), label=str(o.label or "")) for o in options),
    )


def _macs(devices: list[Any]) -> list[str]:
    nics = sorted(
        (d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)),
        key=lambda d: int(d.key),
    )
    return [identity.require_mac(n.macAddress) for n in nics if n.macAddress]


def _uuid(value: Any) -> str | None:
    if not value:
        return None
    return identity.normalize_uuid(str(value)) or str(value).lower()


def _power(value: Any) -> PowerState:
    try:
        return PowerState(str(value))
    except ValueError:
        return PowerState.UNKNOWN


__all__ = [
    "CDROM_LOCK_MESSAGE",
    "VM_PATHS",
    "Cdrom",
    "Choice",
    "MediumKind",
    "PowerState",
    "Question",
    "VmFacts",
    "parse_cdrom",
    "parse_question",
    "parse_vm",
]
