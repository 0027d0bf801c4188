"""The `vm` controller (key: VsphereAgent): one VM per VsphereAgent, created once, deleted safely.

Owns the controller and its dispatch (`vm`), the reconcile context and the only way it
writes a VsphereAgent's status (`vm_context`), creation across crashes (`vm_create`,
`vm_lookup`, `vm_stamp`), adoption of an existing VM (`adopt`), safe deletion
(`vm_delete`, `vm_delete_tasks`) and the pure decisions they share (`vm_decide`).

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`reconcilers.planning`, `reconcilers.common` and `reconcilers.waits`. The `ejection`
controller (`reconcilers.ejection`) finishes a recorded ejection before a deletion
through the `EjectionHook` handed to this controller as a value, so this package does
not import it; `reconcilers.ejection` may import `context`, `stamp` and `reconcile`
from here (it runs its passes with this controller's pass machinery and per-key lock,
docs/design/0009).
"""
