"""The `ejection` controller (key: VsphereAgent): ISO ejection after installation.

Owns the controller and the `vm` controller's deletion hook (`eject`), whether an
ejection may start (`gate`, pure), the next step of a recorded ejection (`decide`, pure:
the state machine), carrying it out step by step, each step checkpointed, with the
test-only crash points (`run`), and its status writes (`status`).
docs/iso-ejection.md tells the whole story.

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`reconcilers.common`, and of other controllers only `reconcilers.vm.context`,
`reconcilers.vm.stamp`, `reconcilers.vm.reconcile` (the `vm` pass machinery it runs its
passes with) and `reconcilers.infra.iso_cache` (pure: which ISO files are the cache's).
"""
