"""The `infra` controller (key: VsphereAgentPool): is vSphere usable, and is the ISO cached.

Owns the controller (`infra`), the VsphereReady preflight and its backoff
(`preflight`), the ISO step (`infra_iso`), the ISO cache's pure decisions
(`iso_cache`), pruning of unused ISOs (`iso_prune`), and vSphere credentials: the rules
of a credentials Secret (`credentials`) and reading Secrets by name (`secret_source`,
which the app builds and hands to every controller through `Deps`).

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`agentforge.redaction`, `reconcilers.common` and `reconcilers.waits`; no other
controller package.
"""
