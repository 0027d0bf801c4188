"""The `infra` controller (key: VsphereAgentPool): is vSphere usable, and is the ISO cached.

Owns the controller and the VsphereReady preflight with its backoff (`reconcile`), the
ISO step with the pruning of unused ISOs (`iso_step`) and the ISO cache's pure decisions
(`iso_cache`). vSphere credentials (the rules of a credentials Secret and
reading Secrets by name) are `agentforge.secret_credentials`, which the app builds and
hands to every controller through `Deps`.

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`agentforge.redaction`, `reconcilers.common` and `reconcilers.waits`; no other
controller package.
"""
