"""Where a pool's VMs go, resolved once per session, and a preflight naming every problem.

A `Placement` is what the user wrote (names and paths); `ResolvedPlacement` holds the
managed object references, cached in the session until vCenter says one of them is
gone (`invalidate`). `inspect` checks all parts and returns *every* problem in one go
(each naming the object and a fix), because a user fixing a pool spec one error per
reconcile is slow and annoying. The VM folder may be missing: it is created on first
use (nested paths too), so it is not a problem. The same inventory read gives the
free storage of the disks' datastore (or datastore cluster), so a spread pool can
break ties between failure domains by it without another round trip.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

from agentforge.vsphere import vmomi
from agentforge.vsphere.model import errors
from agentforge.vsphere.model.specs import (
    NetworkTarget,
    Placement,
    PlacementInvalid,
    Problem,
    ResolvedPlacement,
)
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.vmomi import PC, vim

SDRS_ENABLED = "podStorageDrsEntry.storageDrsConfig.podConfig.enabled"


def invalidate(session: Session, placement: Placement) -> None:
    session.cache.placements.forget(placement)
    session.cache.folders.forget(placement)


async def resolve(session: Session, placement: Placement) -> ResolvedPlacement:
    """The cached resolution, or a fresh one (once for concurrent callers); raises
    `PlacementInvalid` listing every problem."""

    async def make() -> ResolvedPlacement:
        resolved, problems = await inspect(session, placement)
        if problems or resolved is None:
            raise PlacementInvalid(problems)
        return resolved

    return await session.cache.placements.get_or_make(placement, make)


async def inspect(
    session: Session, placement: Placement
) -> tuple[ResolvedPlacement | None, list[Problem]]:
    """Resolve every part of the placement, collecting all problems."""
    content = session.content
    dc_name = placement.datacenter
    dc = await _find(session, dc_name)
    if not isinstance(dc, vim.Datacenter):
        names = await _child_names(session, content.rootFolder)
        return None, [
            Problem(
                f"datacenter {dc_name}",
                "not found in vCenter",
                f"set spec.vsphere.datacenter to one of: {', '.join(names) or 'none'}",
            )
        ]
    inventory, pool, folder, host = await asyncio.gather(
        session.call(
            lambda: vmomi.retrieve(
                content, objects=[_datacenter_spec(dc)], props=_inventory_props()
            ),
            subject=f"datacenter {dc_name}",
            action="read inventory of",
        ),
        _find(session, f"{dc_name}/host/{placement.resource_pool}"),
        _find(session, f"{dc_name}/vm/{placement.folder}") if placement.folder else _none(),
        _find(session, f"{dc_name}/host/{placement.host}") if placement.host else _none(),
    )
    problems: list[Problem] = []
    vm_root: Any = None
    networks: dict[str, list[vmomi.Fetched]] = {}
    pods: dict[str, vmomi.Fetched] = {}
    datastores: dict[str, vmomi.Fetched] = {}
    free_by_moid: dict[str, int] = {}
    seen: set[str] = set()
    for item in inventory:
        if item.moid in seen:
            continue
        seen.add(item.moid)
        ref = item.ref
        if isinstance(ref, vim.Datacenter):
            vm_root = item.props.get("vmFolder")
        elif isinstance(ref, vim.Network):
            networks.setdefault(str(item.props.get("name")), []).append(item)
        elif isinstance(ref, vim.StoragePod):
            pods[str(item.props.get("name"))] = item
        elif isinstance(ref, vim.Datastore):
            datastores[str(item.props.get("name"))] = item
            if item.props.get("summary.accessible") is not False:
                free_by_moid[item.moid] = int(item.props.get("summary.freeSpace") or 0)

    if not isinstance(pool, vim.ResourcePool):
        problems.append(
            Problem(
                f"resource pool {placement.resource_pool}",
                f"not found in datacenter {dc_name}",
                "set spec.vsphere.resourcePool to a path below the datacenter's host folder, "
                "e.g. <cluster>/Resources",
            )
        )
    if folder is not None and not isinstance(folder, vim.Folder):
        problems.append(
            Problem(
                f"folder {placement.folder}",
                "exists but is not a VM folder",
                "set spec.vsphere.folder to a folder path (it is created when missing)",
            )
        )
    if placement.host and not isinstance(host, vim.HostSystem):
        problems.append(
            Problem(
                f"host {placement.host}",
                f"not found in datacenter {dc_name}",
                "retried with backoff; delete the VsphereAgent to place its VM anew",
            )
        )
    network = await _network(session, placement.network, networks, problems)
    if placement.datastore:
        pod, pod_datastores = _single(placement.datastore, datastores, problems)
    else:
        pod, pod_datastores = _pod(placement.datastore_cluster, pods, datastores, problems)
    iso = _iso_datastore(placement.iso_datastore, datastores, problems)
    if problems or network is None or pod is None or iso is None:
        return None, problems
    return (
        ResolvedPlacement(
            placement=placement,
            datacenter=dc,
            vm_root=vm_root,
            folder=folder,
            resource_pool=pool,
            network=network,
            storage_pod=pod,
            pod_datastores=pod_datastores,
            iso_datastore=iso,
            host=host,
            free_storage=sum(free_by_moid.get(moid, 0) for moid in pod_datastores),
        ),
        [],
    )


async def ensure_folder(session: Session, resolved: ResolvedPlacement) -> Any:
    """The VM folder, creating missing parts of a nested path, once per session."""
    if resolved.folder is not None:
        return resolved.folder
    return await session.cache.folders.get_or_make(
        resolved.placement, functools.partial(_create_folder, session, resolved)
    )


async def _create_folder(session: Session, resolved: ResolvedPlacement) -> Any:
    parent = resolved.vm_root
    index = session.content.searchIndex
    for part in [p for p in resolved.placement.folder.split("/") if p]:
        find = functools.partial(index.FindChild, entity=parent, name=part)
        child = await session.call(find, subject=f"folder {part}", action="find")
        if child is None:
            create = functools.partial(parent.CreateFolder, name=part)
            try:
                child = await session.call(create, subject=f"folder {part}", action="create")
            except errors.AlreadyExists:
                child = await session.call(find, subject=f"folder {part}", action="find")
        if not isinstance(child, vim.Folder):
            raise errors.InvalidSpec(
                f"folder {resolved.placement.folder}: {part} is not a VM folder",
                subject=f"folder {resolved.placement.folder}",
            )
        parent = child
    updated = ResolvedPlacement(**{**_fields(resolved), "folder": parent})
    session.cache.placements.put(resolved.placement, updated)
    return parent


def _fields(resolved: ResolvedPlacement) -> dict[str, Any]:
    return {name: getattr(resolved, name) for name in ResolvedPlacement.__slots__}


async def _none() -> None:
    return None


async def _find(session: Session, path: str) -> Any:
    index = session.content.searchIndex
    return await session.call(
        lambda: index.FindByInventoryPath(inventoryPath=path), subject=path, action="look up"
    )


async def _child_names(session: Session, folder: Any) -> list[str]:
    items = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=[vmomi.children_spec(folder)],
            props=[(vim.ManagedEntity, ["name"])],
        ),
        subject="root folder",
        action="list",
    )
    return sorted(str(i.props.get("name")) for i in items)


async def _network(
    session: Session, name: str, found: dict[str, list[vmomi.Fetched]], problems: list[Problem]
) -> NetworkTarget | None:
    matches = found.get(name, [])
    if not matches:
        problems.append(
            Problem(
                f"network {name}",
                "not found in the datacenter",
                f"set spec.vsphere.network to one of: {', '.join(sorted(found)) or 'none'}",
            )
        )
        return None
    if len(matches) > 1:
        problems.append(
            Problem(
                f"network {name}",
                f"{len(matches)} networks have this name",
                "rename the port groups so the name is unique, or pick another network",
            )
        )
        return None
    item = matches[0]
    if not isinstance(item.ref, vim.dvs.DistributedVirtualPortgroup):
        return NetworkTarget(name=name, ref=item.ref)
    switch = item.props.get("config.distributedVirtualSwitch")
    uuid = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=vmomi.object_specs([switch]),
            props=[(vim.DistributedVirtualSwitch, ["uuid"])],
        ),
        subject=f"switch of port group {name}",
        action="read",
    )
    return NetworkTarget(
        name=name,
        ref=item.ref,
        switch_uuid=str(uuid[0].props.get("uuid")) if uuid else None,
        portgroup_key=str(item.props.get("key")),
    )


def _pod(
    name: str,
    pods: dict[str, vmomi.Fetched],
    datastores: dict[str, vmomi.Fetched],
    problems: list[Problem],
) -> tuple[Any, dict[str, str]]:
    item = pods.get(name)
    if item is None:
        problems.append(
            Problem(
                f"datastore cluster {name}",
                "not found in the datacenter",
                f"set spec.vsphere.datastoreCluster to one of: {', '.join(sorted(pods)) or 'none'}",
            )
        )
        return None, {}
    by_moid = {d.moid: n for n, d in datastores.items()}
    members = {c._moId: by_moid.get(c._moId, c._moId) for c in item.props.get("childEntity") or []}
    if not members:
        problems.append(
            Problem(f"datastore cluster {name}", "has no datastores", "add datastores to it")
        )
    if not item.props.get(SDRS_ENABLED):
        problems.append(
            Problem(
                f"datastore cluster {name}",
                "has Storage DRS disabled, so vCenter cannot recommend a datastore",
                "enable Storage DRS on the datastore cluster",
            )
        )
    return item.ref, members


def _single(
    name: str, datastores: dict[str, vmomi.Fetched], problems: list[Problem]
) -> tuple[Any, dict[str, str]]:
    """A failure domain's single datastore: present, accessible and not full."""
    item = datastores.get(name)
    if item is None:
        problems.append(
            Problem(
                f"datastore {name}",
                "not found in the datacenter",
                f"set the failure domain's datastore to one of: {_names(datastores)}",
            )
        )
        return None, {}
    if item.props.get("summary.accessible") is False:
        problems.append(Problem(f"datastore {name}", "is not accessible", "check its host mounts"))
        return None, {}
    if item.props.get("summary.freeSpace") == 0:
        problems.append(Problem(f"datastore {name}", "is full", "free space on it"))
        return None, {}
    return item.ref, {item.moid: name}


def _iso_datastore(name: str, datastores: dict[str, vmomi.Fetched], problems: list[Problem]) -> Any:
    item = datastores.get(name)
    if item is None:
        problems.append(
            Problem(
                f"ISO datastore {name}",
                "not found in the datacenter",
                f"set spec.vsphere.isoDatastore to one of: {_names(datastores)}",
            )
        )
        return None
    if item.props.get("summary.accessible") is False:
        problems.append(
            Problem(f"ISO datastore {name}", "is not accessible", "check its host mounts")
        )
        return None
    return item.ref


def _names(found: Mapping[str, object]) -> str:
    return ", ".join(sorted(found)) or "none"


def _datacenter_spec(dc: Any) -> Any:
    folder_children = PC.TraversalSpec(
        name="folderChildren",
        type=vim.Folder,
        path="childEntity",
        skip=False,
        selectSet=[PC.SelectionSpec(name="folderChildren")],
    )
    return PC.ObjectSpec(
        obj=dc,
        skip=False,
        selectSet=[
            PC.TraversalSpec(name="dcNetwork", type=vim.Datacenter, path="network", skip=False),
            PC.TraversalSpec(name="dcDatastore", type=vim.Datacenter, path="datastore", skip=False),
            PC.TraversalSpec(
                name="dcDatastoreFolder",
                type=vim.Datacenter,
                path="datastoreFolder",
                skip=True,
                selectSet=[folder_children],
            ),
            folder_children,
        ],
    )


def _inventory_props() -> list[tuple[Any, list[str]]]:
    return [
        (vim.Datacenter, ["vmFolder"]),
        (vim.Network, ["name"]),
        (vim.dvs.DistributedVirtualPortgroup, ["name", "key", "config.distributedVirtualSwitch"]),
        (vim.Datastore, ["name", "summary.accessible", "summary.freeSpace"]),
        (vim.StoragePod, ["name", "childEntity", SDRS_ENABLED]),
    ]


__all__ = [
    "Placement",
    "PlacementInvalid",
    "Problem",
    "ResolvedPlacement",
    "ensure_folder",
    "inspect",
    "invalidate",
    "resolve",
]
