"""The hosts of a compute cluster, as a spread pool's host choice needs them.

`cluster_hosts` reads, in two property-collector calls, every host of a cluster (or
of one DRS host group in it): its name, whether it can take a VM (connected, not in
maintenance) and its free memory. It decides nothing: the choice is the pure
`model.spread.choose_host`. A cluster that is not found raises `errors.NotFound`; a
host group that is not found raises `errors.InvalidSpec` naming the groups there are.

A spread pool's DRS VM-VM anti-affinity rule in one compute cluster, brought in line.

`start_anti_affinity` makes the pool's rule in a cluster hold exactly the given VMs:
added when two or more of them are there, edited when the members changed, removed
when fewer than two are left (vCenter refuses a rule of one). What to do is decided by
the pure `model.spread.rule_change`; the rule is recognised by `model.spread.owned_rule`
(the prefix and the pool's UID in its name), so a rule someone else made is never
edited or removed. The change is one `ReconfigureComputeResource_Task` (modify=True:
only the rule changes), started and followed, never waited for (docs/design/0005): the
session's task waiter reports its end to the registry's task listeners, and the caller
reads the outcome by the returned moref. None is started when nothing changes. The task
takes no task slot (like adoption's marker stamp) but is counted in the cap while it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentforge.vsphere import vmomi
from agentforge.vsphere.model import errors, spread
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vmomi import vim

__all__ = ["HostState", "cluster_hosts", "start_anti_affinity"]

_MIB = 1024 * 1024
_HOST_PROPS = [
    "name",
    "runtime.connectionState",
    "runtime.inMaintenanceMode",
    "summary.hardware.memorySize",
    "summary.quickStats.overallMemoryUsage",
]


@dataclass(frozen=True, slots=True)
class HostState:
    name: str
    """The host's name (its inventory name below the cluster)."""
    unusable: str | None
    """Why it cannot take a VM now (disconnected, in maintenance), else None."""
    free_mib: int
    """Memory not in use, MiB (ties between hosts go to the freer one)."""


async def cluster_hosts(
    session: Session, *, datacenter: str, cluster: str, host_group: str | None = None
) -> list[HostState]:
    path = f"{datacenter}/host/{cluster.strip('/')}"
    index = session.content.searchIndex
    ref = await session.call(
        lambda: index.FindByInventoryPath(inventoryPath=path),
        subject=f"compute cluster {cluster}",
        action="look up",
    )
    if not isinstance(ref, vim.ClusterComputeResource):
        raise errors.NotFound(
            f"compute cluster {cluster} not found in datacenter {datacenter}",
            subject=f"compute cluster {cluster}",
        )
    paths = ["host", "configurationEx"] if host_group else ["host"]
    found = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=vmomi.object_specs([ref]),
            props=[(vim.ClusterComputeResource, paths)],
        ),
        subject=f"compute cluster {cluster}",
        action="read hosts of",
    )
    cluster_props = found[0].props if found else {}
    members: list[Any] = list(cluster_props.get("host") or [])
    if host_group:
        members = _in_group(cluster, host_group, cluster_props.get("configurationEx"), members)
    if not members:
        return []
    hosts = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=vmomi.object_specs(members),
            props=[(vim.HostSystem, _HOST_PROPS)],
        ),
        subject=f"compute cluster {cluster}",
        action="read host states of",
    )
    return sorted((_state(h) for h in hosts if not vmomi.is_gone(h)), key=lambda h: h.name)


def _in_group(cluster: str, group: str, config: Any, members: list[Any]) -> list[Any]:
    groups = [
        g for g in getattr(config, "group", None) or [] if isinstance(g, vim.cluster.HostGroup)
    ]
    chosen = next((g for g in groups if g.name == group), None)
    if chosen is None:
        names = ", ".join(sorted(g.name for g in groups)) or "none"
        raise errors.InvalidSpec(
            f"host group {group} not found in compute cluster {cluster} (host groups: {names})",
            subject=f"host group {group}",
        )
    wanted = {h._moId for h in chosen.host or []}
    return [h for h in members if h._moId in wanted]


def _state(host: vmomi.Fetched) -> HostState:
    p = host.props
    name = str(p.get("name") or host.ref._moId)
    connection = str(p.get("runtime.connectionState") or "unknown")
    unusable = None
    if connection != "connected":
        unusable = f"host {name} is {connection}"
    elif p.get("runtime.inMaintenanceMode"):
        unusable = f"host {name} is in maintenance mode"
    total = int(p.get("summary.hardware.memorySize") or 0) // _MIB
    used = int(p.get("summary.quickStats.overallMemoryUsage") or 0)
    return HostState(name=name, unusable=unusable, free_mib=max(total - used, 0))


async def start_anti_affinity(
    session: Session,
    *,
    datacenter: str,
    cluster: str,
    pool_uid: str,
    name: str,
    vm_moids: Sequence[str],
) -> tuple[spread.RuleChange, str | None]:
    """What the rule needs, and the moref of the started reconfigure (None: nothing)."""
    subject = f"compute cluster {cluster}"
    path = f"{datacenter}/host/{cluster.strip('/')}"
    index = session.content.searchIndex
    ref = await session.call(
        lambda: index.FindByInventoryPath(inventoryPath=path), subject=subject, action="look up"
    )
    if not isinstance(ref, vim.ClusterComputeResource):
        raise errors.NotFound(f"{subject} not found in datacenter {datacenter}", subject=subject)
    found = await session.call(
        lambda: vmomi.retrieve(
            session.content,
            objects=vmomi.object_specs([ref]),
            props=[(vim.ClusterComputeResource, ["configurationEx"])],
        ),
        subject=subject,
        action="read DRS rules of",
    )
    config = found[0].props.get("configurationEx") if found else None
    rules = [
        r
        for r in getattr(config, "rule", None) or []
        if isinstance(r, vim.cluster.AntiAffinityRuleSpec)
    ]
    owned = spread.owned_rule([r.name for r in rules], pool_uid=pool_uid)
    rule: Any = next((r for r in rules if r.name == owned), None) if owned else None
    existing = [v._moId for v in rule.vm or []] if rule is not None else None
    change = spread.rule_change(existing=existing, members=vm_moids)
    if change.action == "none":
        return change, None
    if change.action == "remove":
        spec = vim.cluster.RuleSpec(operation="remove", removeKey=rule.key)
    else:
        info = vim.cluster.AntiAffinityRuleSpec(
            name=rule.name if rule is not None else name,
            enabled=True,
            mandatory=False,
            vm=[vms.ref_of(session, moid) for moid in change.members],
        )
        if rule is not None:
            info.key = rule.key
        spec = vim.cluster.RuleSpec(operation=change.action, info=info)
    config_spec = vim.cluster.ConfigSpecEx(rulesSpec=[spec])
    task = await session.call(
        lambda: ref.ReconfigureComputeResource_Task(spec=config_spec, modify=True),
        subject=subject,
        action=f"{change.action} the anti-affinity rule {owned or name} of",
    )
    return change, session.follow(task)
