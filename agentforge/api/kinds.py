"""Every Kubernetes resource the operator touches, named once.

The runtime (`agentforge.kube`) builds URLs and informers from these records, and
the RBAC generator turns the verbs declared against them into `config/rbac`.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "agent-forge.containeroo.ch"
VERSION = "v1alpha1"


@dataclass(frozen=True, slots=True)
class Kind:
    """A resource addressed as `/apis/<group>/<version>/[namespaces/<ns>/]<plural>`."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (or of one object when `name` is given)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base


VSPHERE_AGENT_POOL = Kind(GROUP, VERSION, "VsphereAgentPool", "vsphereagentpools")
VSPHERE_AGENT = Kind(GROUP, VERSION, "VsphereAgent", "vsphereagents")

AGENT = Kind("agent-install.openshift.io", "v1beta1", "Agent", "agents")
INFRA_ENV = Kind("agent-install.openshift.io", "v1beta1", "InfraEnv", "infraenvs")
AGENT_MACHINE = Kind(
    "capi-provider.agent-install.openshift.io", "v1beta1", "AgentMachine", "agentmachines"
)
MACHINE = Kind("cluster.x-k8s.io", "v1beta1", "Machine", "machines")

SECRET = Kind("", "v1", "Secret", "secrets")
EVENT = Kind("", "v1", "Event", "events")
NAMESPACE = Kind("", "v1", "Namespace", "namespaces", namespaced=False)
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases")
TOKEN_REVIEW = Kind("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", namespaced=False)
SUBJECT_ACCESS_REVIEW = Kind(
    "authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False
)
