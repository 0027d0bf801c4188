"""The vSphere layer's values, apart from its I/O: what it knows, marks, raises and builds.

- `facts`: a VM as the operator sees it (identity, power, markers, CD-ROMs, question).
- `markers`: the ownership markers stamped into a VM's extraConfig, and their verdict.
- `errors`: the typed errors every vSphere call raises (`vsphere.faults` classifies).
- `specs`: hardware templates, network targets, datastore paths.
- `iso`: what an ISO transfer is asked for and what it yields.
- `placement`: where a pool's VMs go, and what resolving it found.
- `datastore`: a datastore of a datacenter by name, and a file found on it.
- `spread`: which failure domain and host take a spread pool's next VM; the pool's rule.
- The BIOS UUID and MAC canonical forms are `agentforge.identity`, shared with `api/`.

May import only the standard library, `agentforge.identity` and each other: no
aiohttp, no asyncio, no pyVmomi, nothing of Kubernetes (import-linter contract
"vSphere value types are pure"). Sessions, tasks and ISO transfer sit on top, in
`agentforge.vsphere`.
"""
