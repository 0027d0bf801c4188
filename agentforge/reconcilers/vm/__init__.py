"""The `vm` controller (key: VsphereAgent): one VM per VsphereAgent, created once, deleted safely.

Owns the controller, its dispatch and adoption of an existing VM (`reconcile`), the
reconcile context, the only way it writes a VsphereAgent's status and the seam below
vCenter it calls (`context`, `VcenterApi`), creation across crashes (`create`,
`lookup`, `stamp`), safe deletion (`delete`, `delete_tasks`) and the pure decisions
they share (`decide`).

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`reconcilers.planning`, `reconcilers.common` and `reconcilers.waits`. The `ejection`
controller (`reconcilers.ejection`) finishes a recorded ejection before a deletion
through the `EjectionHook` handed to this controller as a value, so this package does
not import it; `reconcilers.ejection` may import `context`, `stamp` and `reconcile`
from here (it runs its passes with this controller's pass machinery and per-key lock,
docs/design/0009).
"""
