"""Sample objects for the default vcsim inventory: a pool, its credentials Secret.

The pool targets what `sim.vcsim` builds by default (datacenter `dc1`, resource pool
`cluster/Resources`, datastore cluster `dsc1`, ISO datastore `iso-ds`, network
`VM Network`) with small VMs (2 CPUs, 4 GiB, 20 GiB disk) so the simulator stays
cheap. Every field can be overridden; `None` leaves a field out so the CRD default
(or a test's deliberately missing value) applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentforge.api import kinds

__all__ = ["CA_BUNDLE_KEY", "credentials_secret", "pool_manifest"]

CA_BUNDLE_KEY = "ca.crt"
"""The Secret key holding the PEM CA bundle that verifies the vCenter's certificate."""


def credentials_secret(
    *,
    name: str,
    namespace: str,
    server: str,
    username: str,
    password: str,
    ca_file: Path | None,
    omit: Iterable[str] = (),
) -> dict[str, Any]:
    """A vSphere credentials Secret (`server`, `username`, `password`, CA bundle)."""
    data = {"server": server, "username": username, "password": password}
    if ca_file is not None:
        data[CA_BUNDLE_KEY] = Path(ca_file).read_text()
    for key in omit:
        data.pop(key, None)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "stringData": data,
    }


def pool_manifest(
    *,
    name: str,
    namespace: str,
    control_plane_namespace: str,
    hosted_cluster: str,
    nodepool: str,
    infraenv: str,
    secret: str,
    labels: Mapping[str, str],
    folder: str | None = None,
    cleanup_policy: str | None = None,
    retain_versions: int | None = None,
    check_interval: str | None = None,
    eject_after_install: bool | None = None,
    template: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A VsphereAgentPool for the default vcsim inventory; `overrides` merge into spec."""
    vsphere: dict[str, Any] = {
        "credentialsSecretRef": {"name": secret},
        "datacenter": "dc1",
        "resourcePool": "cluster/Resources",
        "datastoreCluster": "dsc1",
        "isoDatastore": "iso-ds",
        "network": "VM Network",
    }
    if folder is not None:
        vsphere["folder"] = folder
    iso: dict[str, Any] = {}
    if retain_versions is not None:
        iso["retainVersions"] = retain_versions
    if check_interval is not None:
        iso["checkInterval"] = check_interval
    if eject_after_install is not None:
        iso["ejectAfterInstall"] = eject_after_install
    spec: dict[str, Any] = {
        "hostedClusterRef": {"name": hosted_cluster},
        "nodePoolRef": {"name": nodepool},
        "infraEnvRef": {"name": infraenv},
        "controlPlaneNamespace": control_plane_namespace,
        "vsphere": vsphere,
        "template": dict(template or {"numCPUs": 2, "memoryMiB": 4096, "diskGiB": 20}),
        "agent": {"role": "worker", "labels": dict(labels)},
    }
    if iso:
        spec["iso"] = iso
    if cleanup_policy is not None:
        spec["cleanupPolicy"] = cleanup_policy
    _merge(spec, overrides or {})
    return {
        "apiVersion": kinds.VSPHERE_AGENT_POOL.api_version,
        "kind": kinds.VSPHERE_AGENT_POOL.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386-style: dicts merge, `None` deletes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
