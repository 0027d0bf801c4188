"""The `vm` controller (key: VsphereAgent): one VM per VsphereAgent, created once, deleted safely.

Owns the controller and its dispatch (`vm`), the reconcile context and the only way it
writes a VsphereAgent's status (`vm_context`), creation across crashes (`vm_create`,
`vm_lookup`, `vm_stamp`), adoption of an existing VM (`adopt`), safe deletion
(`vm_delete`, `vm_delete_tasks`) and the pure decisions they share (`vm_decide`).

May import `agentforge.api`, `agentforge.kube`, `agentforge.vsphere`,
`reconcilers.planning`, `reconcilers.common` and `reconcilers.waits`. The ISO ejection
step (`reconcilers.ejection`) is handed to the controller as a value (`EjectionStep`),
so this package does not import it; `reconcilers.ejection` may import `vm_context`
and `vm_stamp` from here (the ejection is this controller's last step).
"""
