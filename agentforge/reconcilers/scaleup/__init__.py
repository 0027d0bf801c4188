"""The `scaleup` controller (key: AgentMachine): pin the selection label of waiting demand.

May import `agentforge.api`, `agentforge.kube`, `reconcilers.planning` (names) and
`reconcilers.common`; not `agentforge.vsphere` and no other controller package.
"""
