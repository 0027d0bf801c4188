"""The controllers: turn observed state into actions, one sub-package per controller.

`scaleup`, `pool`, `vm` (with its last step, `ejection`) and `infra` are the
controllers; `planning` holds the pool's pure decisions, `waits` the keys waiting for
vCenter, `common` what several controllers share; `registry` builds them all from one
`Deps`. docs/architecture.md has the map.

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere` and
`agentforge.redaction`; never `agentforge.app` or `agentforge.check` (import-linter).
Inside, imports point down: registry -> controllers -> common | waits -> planning, and
controllers do not import each other but where their `__init__` says so.
"""
