"""Which events of many objects may be combined onto their pool (the recorder's groups).

A burst of 200 VMs used to cost 3 Normal events per VM, each on its own object:
`VsphereAgentCreated` on the AgentMachine, `VMCreating` and `VMCreated` on the
VsphereAgent. Their facts stay visible on those objects without the event: the
VsphereAgent carries the AgentMachine's name in its `agent-machine` label and the
AgentMachine the selection label in `spec.agentLabelSelector`; the VsphereAgent's
`Ready` condition says `VMCreating` (VM name, BIOS UUID) and then `VMReady` (name,
BIOS UUID, MAC) and `status.vm` records the VM. So a burst (events of a reason
less than a minute apart) is counted onto one event on the pool, `(combined from
similar events): VsphereAgent <ns>/<name>: <latest message>`; its first event is
held a few seconds and kept on its object when no second object's follows by then
(`kube.event_correlator`, `kube.events`). A VM made alone keeps its events.

A scale-down's deletions are a burst the same way (issue 24): `VMDeleted` and
`AgentDeleted`, 2 events per VM on objects that are gone a moment later, are combined
onto the pool, whose `CleanupStarted` names the VsphereAgents deleted and why. A VM
deleted alone keeps its events.

Everything else stays on its object, however many there are: every Warning (each
names its object and the fix), adoption, `VMRetained`, ISO ejection, and the pool's
own events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentforge.api import kinds
from agentforge.kube.events import EventType
from agentforge.reconcilers.common.event_reasons import VmEvent

__all__ = ["COMBINED_ONTO_POOL", "pool_of", "pool_ref"]

COMBINED_ONTO_POOL: Final = frozenset(
    {
        VmEvent.VM_CREATING.value,
        VmEvent.VM_CREATED.value,
        VmEvent.VM_DELETED.value,
        VmEvent.AGENT_DELETED.value,
    }
)
"""The `vm` controller's reasons combined onto the pool (`pool_apply` passes its pool for
`VsphereAgentCreated` itself)."""


def pool_ref(*, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """A pool's identity, enough for an Event's `involvedObject`."""
    return {
        "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
        "kind": kinds.VSPHERE_AGENT_POOL.kind,
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
    }


def pool_of(obj: Mapping[str, Any], type_: str, reason: str) -> Mapping[str, Any] | None:
    """The `EventRecorder` group policy: a VsphereAgent's pool (its controller owner
    reference) for the reasons above; None keeps the event on its object."""
    if type_ != EventType.NORMAL or reason not in COMBINED_ONTO_POOL:
        return None
    if obj.get("kind") != kinds.VSPHERE_AGENT.kind:
        return None
    meta = obj.get("metadata") or {}
    for owner in meta.get("ownerReferences") or ():
        if (
            isinstance(owner, Mapping)
            and owner.get("controller")
            and owner.get("kind") == kinds.VSPHERE_AGENT_POOL.kind
            and owner.get("uid")
        ):
            return pool_ref(
                namespace=str(meta.get("namespace") or ""),
                name=str(owner.get("name") or ""),
                uid=str(owner["uid"]),
            )
    return None  # made by a user (adoption): its events stay its own
