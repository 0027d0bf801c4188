"""A real Kubernetes control plane for tests, the demo and benchmarks.

`ControlPlane` runs etcd and kube-apiserver (built from Go modules into
`.build/bin` by `make controlplane`) plus an HTTPS fault proxy in front of the
apiserver, each as its own process group on loopback. `ProxyControl` injects faults
and reads the proxy's request counters. See README.md in this folder.
"""

from sim.controlplane.control import CountRow, ProxyControl
from sim.controlplane.controlplane import ADMIN_IDENTITY, DEFAULT, ControlPlane, default_crd_paths
from sim.controlplane.proxy.state import RequestRecord

__all__ = [
    "ADMIN_IDENTITY",
    "DEFAULT",
    "ControlPlane",
    "CountRow",
    "ProxyControl",
    "RequestRecord",
    "default_crd_paths",
]
