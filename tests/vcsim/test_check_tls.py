"""`agentforge check` says vCenter's TLS is verified only after a login proved it."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import pytest

from agentforge.api.pool import VsphereAgentPool
from agentforge.check import probes as check_probes
from agentforge.check.render import Status
from agentforge.vsphere import Credentials, SessionRegistry

pytestmark = pytest.mark.vcsim


def _pool() -> VsphereAgentPool:
    return VsphereAgentPool.model_validate(
        {
            "metadata": {"name": "workers", "namespace": "team-a"},
            "spec": {
                "hostedClusterRef": {"name": "hc1"},
                "nodePoolRef": {"name": "workers"},
                "infraEnvRef": {"name": "discovery"},
                "controlPlaneNamespace": "clusters-hc1",
                "vsphere": {
                    "credentialsSecretRef": {"name": "creds"},
                    "datacenter": "dc1",
                    "datastoreCluster": "dsc1",
                    "isoDatastore": "iso-ds",
                    "resourcePool": "cluster/Resources",
                    "network": "VM Network",
                },
                "template": {"numCPUs": 2, "memoryMiB": 4096, "diskGiB": 20},
                "agent": {"labels": {"pool": "workers"}},
            },
        }
    )


class _Secrets:
    def __init__(self, data: dict[str, str]) -> None:
        self.data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}

    async def get(self, kind: Any, *, namespace: str | None = None, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}, "data": self.data}


async def _items(credentials: Credentials, *, with_ca: bool) -> list[Any]:
    data = {
        "server": credentials.server,
        "username": credentials.username,
        "password": credentials.password,
    }
    if with_ca and credentials.ca_bundle_pem:
        data["caBundle"] = credentials.ca_bundle_pem
    items, parsed = await check_probes.secret(_Secrets(data), _pool())  # type: ignore[arg-type]
    assert parsed is not None
    registry = SessionRegistry(options=check_probes.SESSION_OPTIONS)
    try:
        return [*items, *await check_probes.vsphere_preflight(registry, _pool(), parsed)]
    finally:
        await registry.close()


async def test_an_untrusted_certificate_is_never_reported_verified(
    credentials: Credentials,
) -> None:
    untrusting = dataclasses.replace(credentials, ca_bundle_pem=None)
    items = await _items(untrusting, with_ca=False)
    text = " ".join(f"{i.message} {i.fix}" for i in items)
    assert "TLS verified" not in text
    assert items[0].status is Status.PASS  # the Secret itself is fine
    assert "the certificate is checked against the system store" in items[0].message
    failed = [i for i in items if i.status is Status.FAIL]
    assert failed
    assert "not trusted" in failed[0].message


async def test_a_trusted_certificate_is_reported_verified_after_the_login(
    credentials: Credentials,
) -> None:
    items = await _items(credentials, with_ca=True)
    assert [i.status for i in items] == [Status.PASS, Status.PASS]
    assert "TLS verified" not in items[0].message
    assert items[1].message.startswith("TLS verified with the Secret's CA bundle, login ok")
