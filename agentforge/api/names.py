"""Every label, annotation, finalizer and marker name the operator reads or writes.

These strings are part of the wire contract with the Go operator (DOMAIN.md section
2) and with the upstream projects (HyperShift, CAPI, Assisted Installer): a typo is
an outage, so they are spelled once, here, and imported everywhere else.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

GROUP: Final = "agent-forge.containeroo.ch"
"""Our API group; also the prefix of our labels, annotations and finalizers."""

FIELD_MANAGER: Final = "agent-forge"
"""The field manager name sent with every write, so managedFields name us."""

# --- labels and annotations on our objects and on Agents / AgentMachines ------------

LABEL_POOL: Final = f"{GROUP}/vsphere-agent-pool"
"""On a VsphereAgent: the name of the VsphereAgentPool that requested it."""

LABEL_CREATED_FOR: Final = f"{GROUP}/created-for"
"""On a VsphereAgent: why it exists (values in `CreatedFor`)."""

LABEL_AGENT_MACHINE: Final = f"{GROUP}/agent-machine"
"""The AgentMachine a VM was made for. Set on the VsphereAgent and the prepared Agent,
and pinned into the AgentMachine's `spec.agentLabelSelector.matchLabels`, so each
AgentMachine binds the Agent of the VM made for it."""

LABEL_NODEPOOL: Final = f"{GROUP}/nodepool"
"""On prepared Agents: discriminates pools that share one InfraEnv."""

ANNOTATION_VM_NAME: Final = f"{GROUP}/vm-name"
"""On a VsphereAgent: the vSphere VM name, when it differs from the object name."""

ANNOTATION_VM_BIOS_UUID: Final = f"{GROUP}/vm-bios-uuid"
"""On an adopted VsphereAgent (optional): the BIOS UUID the named VM must have before
it is adopted (its ownership markers are stamped only when name and UUID match)."""

ANNOTATION_FORCE_ISO_REFRESH: Final = f"{GROUP}/force-iso-refresh"
"""On a VsphereAgentPool: each new value forces one discovery ISO re-check."""

ANNOTATION_ALLOWED_NAMESPACES: Final = f"{GROUP}/allowed-namespaces"
"""On a vSphere credentials Secret: the other namespaces whose pools may use it
(comma-separated names; no wildcard). Without it only pools in the Secret's own
namespace may (docs/design/0004-secret-access.md)."""

FINALIZER_POOL: Final = f"{GROUP}/vsphere-agent-pool"
"""Holds a pool until its VsphereAgents are gone."""

FINALIZER_VSPHERE_AGENT: Final = f"{GROUP}/vsphere-agent"
"""Holds a VsphereAgent until its VM is deleted (or retained by policy)."""

FINALIZER_SPREAD_RULES: Final = f"{GROUP}/spread-rules"
"""Holds a spread pool until its DRS anti-affinity rules are removed from every
domain cluster (the `spread-rules` controller)."""


class CreatedFor(StrEnum):
    """Values of `LABEL_CREATED_FOR`."""

    AGENT_MACHINE = "agent-machine"
    """Created by the pool for a waiting AgentMachine."""
    ADOPTED = "adopted"
    """Created by a user to adopt an existing VM."""
    SPARE = "spare"
    """Created by the pool as a warm spare (`spec.spares`)."""


# --- names owned by HyperShift, CAPI and Assisted Installer --------------------------

ANNOTATION_NODEPOOL: Final = "hypershift.openshift.io/nodePool"
"""On AgentMachines and Machines: `<nodepool-namespace>/<nodepool-name>`."""

LABEL_NODEPOOL_ROLE: Final = "hypershift.openshift.io/nodepool-role"
"""On prepared Agents: the pool's `spec.agent.role`."""

LABEL_AGENT_MACHINE_REF: Final = "agentMachineRef"
"""On Agents, set by cluster-api-provider-agent while bound to an AgentMachine (its name)."""

ANNOTATION_AGENT_MACHINE_REF_NAMESPACE: Final = "agentMachineRefNamespace"
"""On Agents, set by cluster-api-provider-agent next to `agentMachineRef`: the
AgentMachine's namespace (older providers set only the label)."""

LABEL_INFRAENV: Final = "infraenvs.agent-install.openshift.io"
"""On Agents: the name of the InfraEnv whose discovery ISO registered them."""

AGENT_PROVIDER_ID_PREFIX: Final = "agent://"
"""An AgentMachine's `spec.providerID` starts with this once an Agent is assigned."""

# --- where the operator runs (config/rbac, config/manager) ---------------------------

DEPLOYMENT_NAMESPACE: Final = "agent-forge-system"
SERVICE_ACCOUNT: Final = "agent-forge-controller-manager"
MANAGER_ROLE: Final = "agent-forge-manager-role"
LEADER_ELECTION_ROLE: Final = "agent-forge-leader-election-role"
METRICS_READER_ROLE: Final = "agent-forge-metrics-reader"
"""Granted to whoever scrapes /metrics (Prometheus): `get` on the non-resource URL."""
CREDENTIALS_READER_ROLE: Final = "agent-forge-credentials-reader"
"""`get` on Secrets; bound to the operator by a RoleBinding (of the same name) in each
credentials namespace only, never cluster-wide (docs/design/0004-secret-access.md)."""
POOL_EDITOR_ROLE: Final = "agent-forge-pool-editor"
"""Tenants' write access to pools and VsphereAgents, aggregated to the built-in `edit`."""
POOL_VIEWER_ROLE: Final = "agent-forge-pool-viewer"
"""Tenants' read access to pools and VsphereAgents, aggregated to the built-in `view`."""
