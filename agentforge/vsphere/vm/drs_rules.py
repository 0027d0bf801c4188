"""A spread pool's DRS VM-VM anti-affinity rule in one compute cluster, brought in line.

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
from typing import Any

from agentforge.vsphere import props
from agentforge.vsphere.model import errors, spread
from agentforge.vsphere.session import task_follow
from agentforge.vsphere.session.vcenter_session import Session
from agentforge.vsphere.vm import owned as vms
from agentforge.vsphere.vmomi import vim

__all__ = ["start_anti_affinity"]


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
        lambda: props.retrieve(
            session.content,
            objects=props.object_specs([ref]),
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
    return change, task_follow.follow(session, task)
