"""ISO ejection after installation: the `vm` controller's last step, as a state machine.

Owns whether an ejection may start (`ejection_gate`, pure), the next step of a
recorded ejection (`ejection_decide`, pure: the state machine), carrying it out step by
step, each step checkpointed (`ejection_run`), its status writes (`ejection_status`),
the entry point the `vm` controller is given (`ejection.Ejection`) and the test-only
crash points (`ejection_crashpoints`). docs/iso-ejection.md tells the whole story.

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`reconcilers.common`, and of other controllers only `reconcilers.vm.vm_context`,
`reconcilers.vm.vm_stamp` (the `vm` reconcile it runs in) and
`reconcilers.infra.iso_cache` (pure: which ISO files are the cache's).
"""
