"""What more than one controller shares: dependencies, indexes, spec translation, events.

Owns the one frozen `Deps` every controller gets from the composition root and the retry
backoff of controllers that reach vCenter (`deps`), the informer indexes (`indexes`),
the parsed records per kind (`records`), a pool's spec in the vSphere layer's terms and
which of its failure domains are usable (`pool_specs`), the reasons of the Events the
controllers record (`event_reasons`) and which of them may be combined onto their pool
(`event_groups`).

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`agentforge.redaction` and `reconcilers.planning`; no controller package and not
`reconcilers.waits` (import-linter: the reconcilers' layers).
"""
