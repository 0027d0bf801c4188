"""Informer indexes the controllers share, so every "which X belong to Y" is a dict lookup.

Each index files a cached object under string keys built by the `*_key` functions
below; a reconciler (or a watch mapper) asks `informer.by_index(NAME, key)`. The
functions read raw (trimmed) dicts, never raise, and file nothing for an object they
cannot place: an index function that raised would stop the informer.

| index | on | key |
|---|---|---|
| `POOLS_BY_NODE_POOL` | pools | `<controlPlaneNamespace>/<pool ns>/<nodePoolRef>` |
| `POOLS_BY_INFRA_ENV` | pools | `<pool ns>/<infraEnvRef>` |
| `POOLS_BY_SECRET` | pools | `<secret ns>/<secret name>` of `spec.vsphere.credentialsSecretRef` |
| `BY_NODE_POOL` | AgentMachines, Machines | `<own ns>/<nodePool annotation ns>/<name>` |
| `AGENTS_BY_INFRA_ENV` | Agents | `<ns>/<InfraEnv label or owner>` |
| `VSPHERE_AGENTS_BY_POOL` | VsphereAgents | `<ns>/<pool label>` and `<ns>/<poolRef>` |
| `VSPHERE_AGENTS_BY_AGENT` | VsphereAgents | `<ns>/<status.vm.agentRef.name>` |
| `AGENTS_BY_IDENTITY` | Agents | the BIOS UUID in its SMBIOS serial, else each MAC |
| `VSPHERE_AGENTS_BY_IDENTITY` | VsphereAgents | `status.vm.biosUUID` and `.macAddress` |

Identity keys are the canonical forms of `agentforge.identity` (a BIOS UUID
`8-4-4-4-12`, a MAC `aa:bb:cc:dd:ee:ff`: the two never collide, so one index holds
both) and are not namespaced: "which Agent is this VM" is asked of the whole cache,
since a VM must never be deleted while any Agent that is it is bound. An Agent is
filed under its MACs only when it reports no BIOS UUID: the BIOS UUID comes first
(`snapshot.identifies`), so an Agent with one is this VM exactly when the UUIDs are
equal, and a VM about to be deleted always has a known BIOS UUID (vSphere reports
it). That keeps the index at one key per Agent (10,000 Agents cost about 2 MB).

An AgentMachine belongs to a pool exactly when their keys are equal, so "the pools
of this AgentMachine" (two means an ambiguous configuration) is one lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from agentforge import identity
from agentforge.api import kinds, names, wire
from agentforge.api.views import parse_node_pool_annotation
from agentforge.kube.informer import Informer
from agentforge.kube.store import IndexFunc, ObjectKey, object_key

POOLS_BY_NODE_POOL: Final = "agent-forge/pools-by-node-pool"
POOLS_BY_INFRA_ENV: Final = "agent-forge/pools-by-infra-env"
BY_NODE_POOL: Final = "agent-forge/by-node-pool"
AGENTS_BY_INFRA_ENV: Final = "agent-forge/agents-by-infra-env"
VSPHERE_AGENTS_BY_POOL: Final = "agent-forge/vsphere-agents-by-pool"
VSPHERE_AGENTS_BY_AGENT: Final = "agent-forge/vsphere-agents-by-agent"
AGENTS_BY_IDENTITY: Final = "agent-forge/agents-by-identity"
VSPHERE_AGENTS_BY_IDENTITY: Final = "agent-forge/vsphere-agents-by-identity"
POOLS_BY_SECRET: Final = "agent-forge/pools-by-credentials-secret"  # noqa: S105 - an index name

JsonObj = dict[str, Any]


# --- keys --------------------------------------------------------------------------------


def node_pool_key(*, control_plane_namespace: str, node_pool_namespace: str, node_pool: str) -> str:
    return f"{control_plane_namespace}/{node_pool_namespace}/{node_pool}"


def pool_node_pool_key(pool: Mapping[str, Any]) -> str | None:
    """The `BY_NODE_POOL` key of the AgentMachines and Machines `pool` serves."""
    cpns = wire.text(wire.get(pool, "spec", "controlPlaneNamespace"))
    namespace = wire.text(wire.get(pool, "metadata", "namespace"))
    node_pool = wire.text(wire.get(pool, "spec", "nodePoolRef", "name"))
    if not (cpns and namespace and node_pool):
        return None
    return node_pool_key(
        control_plane_namespace=cpns, node_pool_namespace=namespace, node_pool=node_pool
    )


def control_plane_object_key(obj: Mapping[str, Any]) -> str | None:
    """The `BY_NODE_POOL` key of an AgentMachine or Machine (None without annotation)."""
    namespace = wire.text(wire.get(obj, "metadata", "namespace"))
    annotation = wire.get(obj, "metadata", "annotations", names.ANNOTATION_NODEPOOL)
    parsed = parse_node_pool_annotation(annotation if isinstance(annotation, str) else None)
    if not namespace or parsed is None:
        return None
    return node_pool_key(
        control_plane_namespace=namespace,
        node_pool_namespace=parsed.namespace,
        node_pool=parsed.name,
    )


def namespaced_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def infra_env_of_agent(agent: Mapping[str, Any]) -> str | None:
    """The InfraEnv that registered an Agent: its label, else an ownerReference to an
    InfraEnv (kind and API group; an ownerReference is always to an object of the
    Agent's namespace, which the index key adds)."""
    label = wire.text(wire.get(agent, "metadata", "labels", names.LABEL_INFRAENV))
    if label:
        return label
    owners = wire.get(agent, "metadata", "ownerReferences")
    if isinstance(owners, list):
        for owner in owners:
            if (
                isinstance(owner, Mapping)
                and owner.get("kind") == kinds.INFRA_ENV.kind
                and str(owner.get("apiVersion", "")).partition("/")[0] == kinds.INFRA_ENV.group
            ):
                name = wire.text(owner.get("name"))
                if name:
                    return name
    return None


def pools_of_vsphere_agent(va: Mapping[str, Any]) -> tuple[str, ...]:
    """The pool names a VsphereAgent names (label and spec.poolRef; usually one)."""
    found = (
        wire.text(wire.get(va, "metadata", "labels", names.LABEL_POOL)),
        wire.text(wire.get(va, "spec", "poolRef", "name")),
    )
    return tuple(dict.fromkeys(p for p in found if p))


# --- index functions -----------------------------------------------------------------------


def _one(value: str | None) -> Iterable[str]:
    return (value,) if value else ()


def _pools_by_node_pool(pool: JsonObj) -> Iterable[str]:
    return _one(pool_node_pool_key(pool))


def _pools_by_infra_env(pool: JsonObj) -> Iterable[str]:
    namespace = wire.text(wire.get(pool, "metadata", "namespace"))
    infra_env = wire.text(wire.get(pool, "spec", "infraEnvRef", "name"))
    return _one(namespaced_key(namespace, infra_env) if namespace and infra_env else None)


def _by_node_pool(obj: JsonObj) -> Iterable[str]:
    return _one(control_plane_object_key(obj))


def _agents_by_infra_env(agent: JsonObj) -> Iterable[str]:
    namespace = wire.text(wire.get(agent, "metadata", "namespace"))
    infra_env = infra_env_of_agent(agent)
    return _one(namespaced_key(namespace, infra_env) if namespace and infra_env else None)


def _vsphere_agents_by_pool(va: JsonObj) -> Iterable[str]:
    namespace = wire.text(wire.get(va, "metadata", "namespace"))
    if not namespace:
        return ()
    return tuple(namespaced_key(namespace, pool) for pool in pools_of_vsphere_agent(va))


def _vsphere_agents_by_agent(va: JsonObj) -> Iterable[str]:
    namespace = wire.text(wire.get(va, "metadata", "namespace"))
    agent = wire.text(wire.get(va, "status", "vm", "agentRef", "name"))
    return _one(namespaced_key(namespace, agent) if namespace and agent else None)


def agent_identity_keys(agent: Mapping[str, Any]) -> tuple[str, ...]:
    """The BIOS UUID an Agent reports (from a VMware SMBIOS serial), else its MACs."""
    inventory = wire.get(agent, "status", "inventory")
    serial = wire.get(inventory, "systemVendor", "serialNumber")
    bios_uuid = identity.bios_uuid_from_serial(serial if isinstance(serial, str) else None)
    if bios_uuid:
        return (bios_uuid,)
    keys: list[str] = []
    interfaces = wire.get(inventory, "interfaces")
    if isinstance(interfaces, list):
        for interface in interfaces:
            raw = wire.get(interface, "macAddress")
            mac = identity.normalize_mac(raw if isinstance(raw, str) else None)
            if mac and mac not in keys:
                keys.append(mac)
    return tuple(keys)


def vsphere_agent_identity_keys(va: Mapping[str, Any]) -> tuple[str, ...]:
    """The BIOS UUID and MAC recorded for a VsphereAgent's VM (`status.vm`)."""
    recorded_uuid = wire.get(va, "status", "vm", "biosUUID")
    recorded_mac = wire.get(va, "status", "vm", "macAddress")
    found = (
        identity.normalize_uuid(recorded_uuid if isinstance(recorded_uuid, str) else None),
        identity.normalize_mac(recorded_mac if isinstance(recorded_mac, str) else None),
    )
    return tuple(key for key in found if key)


def _pools_by_secret(obj: JsonObj) -> Iterable[str]:
    ref = wire.get(obj, "spec", "vsphere", "credentialsSecretRef")
    name = wire.text(wire.get(ref, "name"))
    if not name:
        return ()
    namespace = wire.text(wire.get(ref, "namespace")) or wire.text(
        wire.get(obj, "metadata", "namespace")
    )
    return (f"{namespace}/{name}",)


def keys_of(objs: Iterable[JsonObj]) -> list[ObjectKey]:
    """The keys of cached objects (what an index lookup returns), to enqueue."""
    return [object_key(obj) for obj in objs]


INDEXES: Final[Mapping[kinds.Kind, Mapping[str, IndexFunc]]] = {
    kinds.VSPHERE_AGENT_POOL: {
        POOLS_BY_NODE_POOL: _pools_by_node_pool,
        POOLS_BY_INFRA_ENV: _pools_by_infra_env,
        POOLS_BY_SECRET: _pools_by_secret,
    },
    kinds.AGENT_MACHINE: {BY_NODE_POOL: _by_node_pool},
    kinds.MACHINE: {BY_NODE_POOL: _by_node_pool},
    kinds.AGENT: {
        AGENTS_BY_INFRA_ENV: _agents_by_infra_env,
        AGENTS_BY_IDENTITY: agent_identity_keys,
    },
    kinds.VSPHERE_AGENT: {
        VSPHERE_AGENTS_BY_POOL: _vsphere_agents_by_pool,
        VSPHERE_AGENTS_BY_AGENT: _vsphere_agents_by_agent,
        VSPHERE_AGENTS_BY_IDENTITY: vsphere_agent_identity_keys,
    },
}
"""Every index, by the kind whose informer holds it."""


def install(informers: Mapping[kinds.Kind, Informer]) -> None:
    """Add every index to the informers (idempotent: indexes already there are kept)."""
    for kind, indexes in INDEXES.items():
        informer = informers.get(kind)
        if informer is None:
            continue
        for name, fn in indexes.items():
            try:
                informer.add_index(name, fn)
            except ValueError:
                continue  # installed by an earlier call
