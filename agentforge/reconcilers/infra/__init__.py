"""The `infra` controller (key: VsphereAgentPool): is vSphere usable, and is the ISO cached.

Owns the controller (`infra`), the VsphereReady preflight and its backoff (`preflight`),
the ISO step (`infra_iso`), the ISO cache's pure decisions (`iso_cache`) and pruning of
unused ISOs (`iso_prune`). vSphere credentials (the rules of a credentials Secret and
reading Secrets by name) are `agentforge.secret_credentials`, which the app builds and
hands to every controller through `Deps`.

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`agentforge.redaction`, `reconcilers.common` and `reconcilers.waits`; no other
controller package.
"""
