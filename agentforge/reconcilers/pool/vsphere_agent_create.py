"""Creating the VsphereAgent of one AgentMachine, and handing one to another (pool I/O).

The `pool` controller decides (`assignment`) which AgentMachine gets a new
VsphereAgent and which VsphereAgent moves to another AgentMachine; this module makes
the calls.

Creation tries deterministic names (`naming`, docs/design/0002 "Names"): the
AgentMachine's name, then `<am>-<pool>-<hash of ns/pool/am>`, then the same with the
AgentMachine's UID in the hash (a hand-over leaves a VsphereAgent named after an
AgentMachine that serves another one; a re-created AgentMachine of that name needs
another name). A name is taken when an object of that name exists that is not this
pool's VsphereAgent for this AgentMachine (pool label, selection label, and the
pool's UID in its ownerReference). A create that meets AlreadyExists reads the object
and accepts it when it is ours, so a create repeated after a crash or from a stale
cache makes no second object.

A hand-over moves the VsphereAgent's selection label, with the resourceVersion of
the status write that recorded the hand-over (`status.handover`): it lands only on
the version that carries the record.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agentforge.api import kinds, names, rbac
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube import errors
from agentforge.kube.client import KubeClient
from agentforge.kube.informer import Informer
from agentforge.reconcilers.planning import naming
from agentforge.reconcilers.planning.assignment import Creation

rbac.needs(kinds.VSPHERE_AGENT, "create", "get", why="one VsphereAgent per waiting AgentMachine")
rbac.needs(kinds.VSPHERE_AGENT, "patch", why="hand a VsphereAgent to another AgentMachine")

JsonObj = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_ours(va: Mapping[str, Any], *, pool: VsphereAgentPool, selection: str) -> bool:
    """`va` is this pool's VsphereAgent for the AgentMachine of `selection`."""
    meta = _meta(va)
    labels = meta.get("labels") or {}
    if (labels.get(names.LABEL_POOL), labels.get(names.LABEL_AGENT_MACHINE)) != (
        pool.metadata.name,
        selection,
    ):
        return False
    owners = [
        o
        for o in meta.get("ownerReferences") or ()
        if isinstance(o, Mapping) and o.get("kind") == kinds.VSPHERE_AGENT_POOL.kind
    ]
    return not owners or any(o.get("uid") == pool.metadata.uid for o in owners)


def candidate_names(*, namespace: str, pool: str, agent_machine: str, uid: str) -> list[str]:
    """The names tried, in order (deterministic: a retry tries the same ones)."""
    found = [
        naming.vsphere_agent_name(agent_machine=agent_machine),
        naming.vsphere_agent_fallback_name(
            namespace=namespace, pool=pool, agent_machine=agent_machine
        ),
    ]
    if uid:
        found.append(
            naming.vsphere_agent_fallback_name(
                namespace=namespace, pool=pool, agent_machine=agent_machine, uid=uid
            )
        )
    return list(dict.fromkeys(found))


def vsphere_agent_object(
    *,
    pool: VsphereAgentPool,
    name: str,
    selection: str,
    created_for: names.CreatedFor = names.CreatedFor.AGENT_MACHINE,
) -> JsonObj:
    """The VsphereAgent requested for one AgentMachine of `pool` (or a warm spare)."""
    namespace = pool.metadata.namespace
    return {
        "apiVersion": kinds.VSPHERE_AGENT.api_version,
        "kind": kinds.VSPHERE_AGENT.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            # The vm controller's finalizer set at once: one write fewer per VM than
            # its later patch (which remains for VsphereAgents users create to adopt).
            "finalizers": [names.FINALIZER_VSPHERE_AGENT],
            "labels": {
                names.LABEL_POOL: pool.metadata.name,
                names.LABEL_CREATED_FOR: created_for.value,
                names.LABEL_AGENT_MACHINE: selection,
            },
            "annotations": {
                names.ANNOTATION_VM_NAME: naming.vm_name(
                    name_prefix=pool.effective_name_prefix(),
                    namespace=namespace,
                    vsphere_agent=name,
                )
            },
            "ownerReferences": [
                {
                    "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
                    "kind": kinds.VSPHERE_AGENT_POOL.kind,
                    "name": pool.metadata.name,
                    "uid": pool.metadata.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {"poolRef": {"name": pool.metadata.name}},
    }


class NamesTaken(Exception):
    """Every candidate name is held by an object that is not ours."""

    def __init__(self, names_: list[str]) -> None:
        super().__init__(", ".join(names_))
        self.names = names_


async def create(
    client: KubeClient,
    cache: Informer,
    *,
    pool: VsphereAgentPool,
    creation: Creation,
    planned: Collection[str] = (),
) -> JsonObj | None:
    """Create the VsphereAgent for `creation`; the created object, or None when one of
    ours exists already (made after the plan's snapshot: a create that raced). Names in
    `planned` (the VsphereAgents the plan saw) are taken: the plan decided none of them
    serves this AgentMachine (one whose VM another cluster took keeps its labels).
    Raises `NamesTaken` when every name is taken."""
    namespace = pool.metadata.namespace
    candidates = candidate_names(
        namespace=namespace,
        pool=pool.metadata.name,
        agent_machine=creation.agent_machine,
        uid=creation.uid,
    )
    for name in candidates:
        if name in planned:
            continue
        cached = cache.get(namespace=namespace, name=name)
        if cached is not None:
            if is_ours(cached, pool=pool, selection=creation.selection):
                return None
            continue
        body = vsphere_agent_object(pool=pool, name=name, selection=creation.selection)
        try:
            return await client.create(kinds.VSPHERE_AGENT, body, namespace=namespace)
        except errors.AlreadyExists:
            current = await client.get(kinds.VSPHERE_AGENT, namespace=namespace, name=name)
            if is_ours(current, pool=pool, selection=creation.selection):
                return None
    raise NamesTaken([f"{namespace}/{n}" for n in candidates])


SPARE_NAME_TRIES = 16
"""How many names a warm spare tries past the planned one (objects of other pools or
users may hold `<pool>-spare-<n>` names the pool's plan cannot see)."""


async def create_spare(
    client: KubeClient,
    cache: Informer,
    *,
    pool: VsphereAgentPool,
    name: str,
    taken: set[str],
) -> JsonObj | None:
    """Create a warm spare VsphereAgent: `name` (the planner's choice, no VsphereAgent
    of the pool holds it), else the next free `<pool>-spare-<n>`; `taken` holds the
    names not to use (the plan's VsphereAgents and spares) and gets the one used. None
    when no name is free (an AlreadyExists counts as taken: a create that raced is
    made up by the next plan's surplus clean-up, never doubled in one pass)."""
    namespace = pool.metadata.namespace
    index = naming.spare_index(name) or 0
    candidates = [name] + [
        naming.spare_name(pool=pool.metadata.name, index=i)
        for i in range(index + 1, index + 1 + SPARE_NAME_TRIES)
    ]
    for candidate in candidates:
        if candidate in taken or cache.get(namespace=namespace, name=candidate) is not None:
            continue
        taken.add(candidate)
        selection = naming.spare_selection(vsphere_agent=candidate)
        body = vsphere_agent_object(
            pool=pool, name=candidate, selection=selection, created_for=names.CreatedFor.SPARE
        )
        try:
            return await client.create(kinds.VSPHERE_AGENT, body, namespace=namespace)
        except errors.AlreadyExists:
            continue
    return None


async def move_label(
    client: KubeClient, *, namespace: str, name: str, selection: str, resource_version: str
) -> None:
    """Point the VsphereAgent's selection label at `selection`, only on the version the
    hand-over record was read back from (a 409 means it changed: decide again)."""
    await client.patch_merge(
        kinds.VSPHERE_AGENT,
        namespace=namespace,
        name=name,
        patch={
            "metadata": {
                "resourceVersion": resource_version,
                "labels": {names.LABEL_AGENT_MACHINE: selection},
            }
        },
    )
