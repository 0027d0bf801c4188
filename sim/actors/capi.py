"""cluster-api-provider-agent: binds waiting AgentMachines to Agents, unbinds on deletion.

Binding, only for an AgentMachine that waits (`Ready=False/NoSuitableAgents`, no
`status.agentRef`, not deleting): the first (oldest, then by name) Agent that is
approved, `Validated=True`, unbound (no `agentMachineRef` label, no
`spec.clusterDeploymentName`), not deleting and whose labels include every entry of
the AgentMachine's `spec.agentLabelSelector.matchLabels`. The Agent is claimed first
(label `agentMachineRef`, annotation `agentMachineRefNamespace`,
`spec.clusterDeploymentName` = the hosted cluster in the control plane namespace, as
cluster-api-provider-agent writes them) with a resourceVersion precondition, so two AgentMachines
never get one Agent; then the AgentMachine gets the provider's finalizer,
`spec.providerID: agent://<agent uid>`, `status.agentRef`, `status.ready` and
`Ready=True`. A claim whose AgentMachine half failed is finished on the next tick.

Unbinding, when an AgentMachine carrying the finalizer is deleted: the Agent loses
the label and `clusterDeploymentName` (it stays, unbound: the Assisted Installer
reclaims it), then the finalizer is removed. Agents are never deleted here.

Rule checks for the tests (`violations`): an Agent that vanished while still bound
(by this provider) means someone deleted a bound Agent.
"""

from __future__ import annotations

from typing import Any

from agentforge.api import kinds, names
from agentforge.kube import errors
from agentforge.kube.client import KubeClient
from sim.actors.base import Actor, Journal, Timings, condition, now_rfc3339, set_conditions

__all__ = ["AGENT_MACHINE_FINALIZER", "CapiAgentProvider", "is_bound"]

AGENT_MACHINE_FINALIZER = "agentmachine.agent-install.openshift.io/deprovision"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == type_), None)


def is_bound(agent: dict[str, Any]) -> bool:
    labels = agent["metadata"].get("labels") or {}
    deployment = (agent.get("spec") or {}).get("clusterDeploymentName") or {}
    return bool(labels.get(names.LABEL_AGENT_MACHINE_REF)) or bool(deployment.get("name"))


def waits(am: dict[str, Any]) -> bool:
    ready = _condition(am, "Ready")
    return (
        not am["metadata"].get("deletionTimestamp")
        and not ((am.get("status") or {}).get("agentRef") or {}).get("name")
        and ready is not None
        and ready.get("status") == "False"
        and ready.get("reason") == "NoSuitableAgents"
    )


def eligible(agent: dict[str, Any], match_labels: dict[str, str]) -> bool:
    meta = agent["metadata"]
    labels = meta.get("labels") or {}
    validated = _condition(agent, "Validated")
    return (
        bool((agent.get("spec") or {}).get("approved"))
        and not is_bound(agent)
        and not meta.get("deletionTimestamp")
        and validated is not None
        and validated.get("status") == "True"
        and all(labels.get(k) == v for k, v in match_labels.items())
    )


class CapiAgentProvider(Actor):
    name = "capi"

    def __init__(
        self,
        *,
        client: KubeClient,
        control_plane_namespaces: tuple[str, ...],
        agent_namespaces: tuple[str, ...],
        timings: Timings,
        journal: Journal,
        violations: list[str],
    ) -> None:
        super().__init__(timings=timings, journal=journal)
        self.client = client
        self.control_plane_namespaces = control_plane_namespaces
        self.agent_namespaces = agent_namespaces
        self.violations = violations
        self._bound_seen: dict[str, str] = {}  # agent "ns/name" -> AgentMachine "ns/name"

    async def step(self) -> None:
        agent_machines = [
            am
            for ns in self.control_plane_namespaces
            for am in (await self.client.list(kinds.AGENT_MACHINE, namespace=ns)).items
        ]
        agents = [
            a
            for ns in self.agent_namespaces
            for a in (await self.client.list(kinds.AGENT, namespace=ns)).items
        ]
        self._check_bound_agents(agents)
        for am in agent_machines:
            if am["metadata"].get("deletionTimestamp"):
                await self._release(am, agents)
        taken: set[str] = set()
        for am in sorted(agent_machines, key=_age):
            if waits(am):
                await self._bind(am, agents, taken)

    # --- binding -------------------------------------------------------------------------

    async def _bind(
        self, am: dict[str, Any], agents: list[dict[str, Any]], taken: set[str]
    ) -> None:
        am_name = am["metadata"]["name"]
        claimed = [a for a in agents if _bound_to(a, am)]
        if claimed:  # a claim whose AgentMachine half did not land: finish it
            await self._finish(am, claimed[0])
            return
        selector = ((am.get("spec") or {}).get("agentLabelSelector") or {}).get("matchLabels") or {}
        candidates = [a for a in agents if eligible(a, selector) and _key(a) not in taken]
        if not candidates:
            return
        agent = min(candidates, key=_age)
        taken.add(_key(agent))
        cluster = (am["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL, "")
        patch = {
            "metadata": {
                "resourceVersion": agent["metadata"]["resourceVersion"],
                "labels": {names.LABEL_AGENT_MACHINE_REF: am_name},
                "annotations": {
                    names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: am["metadata"]["namespace"]
                },
            },
            "spec": {
                "clusterDeploymentName": {"name": cluster, "namespace": am["metadata"]["namespace"]}
            },
        }
        try:
            agent = await self.client.patch_merge(
                kinds.AGENT,
                namespace=agent["metadata"]["namespace"],
                name=_name(agent),
                patch=patch,
            )
        except errors.Conflict:
            return  # someone changed the Agent since we looked: decide again next tick
        await self._finish(am, agent)

    async def _finish(self, am: dict[str, Any], agent: dict[str, Any]) -> None:
        meta = am["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if AGENT_MACHINE_FINALIZER not in finalizers:
            finalizers.append(AGENT_MACHINE_FINALIZER)
        provider_id = f"{names.AGENT_PROVIDER_ID_PREFIX}{agent['metadata']['uid']}"
        await self.client.patch_merge(
            kinds.AGENT_MACHINE,
            namespace=meta["namespace"],
            name=meta["name"],
            patch={"metadata": {"finalizers": finalizers}, "spec": {"providerID": provider_id}},
        )
        now = now_rfc3339()
        ready = [
            condition("Ready", True, "AgentBound", f"bound to Agent {_key(agent)}"),
            condition("AgentReserved", True, "AgentReserved", ""),
        ]
        await self.client.patch_status(
            kinds.AGENT_MACHINE,
            namespace=meta["namespace"],
            name=meta["name"],
            patch={
                "status": {
                    "ready": True,
                    "agentRef": {"name": _name(agent), "namespace": agent["metadata"]["namespace"]},
                    "conditions": set_conditions(_conditions(am), ready, now=now),
                }
            },
        )
        self._bound_seen[_key(agent)] = f"{meta['namespace']}/{meta['name']}"
        self.note(f"AgentMachine {meta['name']} bound to Agent {_name(agent)[:8]}")

    # --- unbinding -----------------------------------------------------------------------

    async def _release(self, am: dict[str, Any], agents: list[dict[str, Any]]) -> None:
        meta = am["metadata"]
        if AGENT_MACHINE_FINALIZER not in (meta.get("finalizers") or []):
            return
        for agent in agents:
            if _bound_to(agent, am):
                await self.client.patch_merge(
                    kinds.AGENT,
                    namespace=agent["metadata"]["namespace"],
                    name=_name(agent),
                    patch={
                        "metadata": {
                            "labels": {names.LABEL_AGENT_MACHINE_REF: None},
                            "annotations": {names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: None},
                        },
                        "spec": {"clusterDeploymentName": None},
                    },
                )
                self._bound_seen.pop(_key(agent), None)
                self.note(f"AgentMachine {meta['name']} deleted: Agent {_name(agent)[:8]} unbound")
        remaining = [f for f in meta.get("finalizers") or [] if f != AGENT_MACHINE_FINALIZER]
        await self.client.patch_merge(
            kinds.AGENT_MACHINE,
            namespace=meta["namespace"],
            name=meta["name"],
            patch={
                "metadata": {"finalizers": remaining, "resourceVersion": meta["resourceVersion"]}
            },
        )

    # --- rules ---------------------------------------------------------------------------

    def _check_bound_agents(self, agents: list[dict[str, Any]]) -> None:
        """Flag Agents that vanished while still bound by us (nobody may delete those)."""
        present = {_key(a): a for a in agents}
        for agent_key, am_key in list(self._bound_seen.items()):
            agent = present.get(agent_key)
            if agent is None:
                self.violations.append(
                    f"Agent {agent_key} was deleted while bound to AgentMachine {am_key}"
                )
                self.note(f"VIOLATION: Agent {agent_key} deleted while bound to {am_key}")
            elif is_bound(agent):
                continue
            del self._bound_seen[agent_key]


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _age(obj: dict[str, Any]) -> tuple[str, str]:
    return (str(obj["metadata"].get("creationTimestamp", "")), _name(obj))


def _bound_to(agent: dict[str, Any], am: dict[str, Any]) -> bool:
    """`agent` is bound to `am`: its `agentMachineRef` names it, in its namespace (the
    provider's annotation, else the ClusterDeployment's namespace); a namesake in
    another namespace is another AgentMachine."""
    meta = agent["metadata"]
    if (meta.get("labels") or {}).get(names.LABEL_AGENT_MACHINE_REF) != am["metadata"]["name"]:
        return False
    deployment = (agent.get("spec") or {}).get("clusterDeploymentName") or {}
    namespace = (meta.get("annotations") or {}).get(
        names.ANNOTATION_AGENT_MACHINE_REF_NAMESPACE
    ) or deployment.get("namespace")
    return bool(namespace == am["metadata"]["namespace"])
