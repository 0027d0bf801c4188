"""The API the operator serves (v1alpha1) and read-only views of the kinds it reads.

The bottom layer: imports nothing else from `agentforge` but the pure `agentforge.identity`
(which `vsphere/` shares), does no I/O.

- `pool`, `vsphereagent`, `vm`: our CRDs as pydantic models (wire names, defaults,
  bounds), including the crash-recovery records in VsphereAgent status.
- `conditions`: the Condition shape, condition types and reasons; the one place
  conditions are read and written.
- `views`: Agent, AgentMachine, Machine, InfraEnv as the reconcilers read them.
- `names`: every label, annotation, finalizer and VM marker name.
- `kinds`: every resource the operator touches; `trim`: what the cache keeps of each.
- `wire`: models to request bodies (and JSON merge patches).
- `crdgen`, `rbac`: the CRDs, the API reference and RBAC generated from here.
"""
