"""`python -m agentforge check`: would this VsphereAgentPool work? Reads only.

Owns the command (`command`: arguments, input, the order of the checks), the probes
of the cluster, the image service and vCenter (`probes`), the credentials Secret's
check (`secret`), the RBAC review (`rbac`) and the report (`render`).

It reuses the operator's own rules rather than copies: it may import `agentforge.api`,
`agentforge.kube`, `agentforge.vsphere`, `agentforge.reconcilers` (credentials rules,
spec translation, indexes) and, for `rbac`, `agentforge.app` (every declared
permission). Nothing but `agentforge.__main__` imports it (import-linter: layers).
"""

from agentforge.check.command import main

__all__ = ["main"]
