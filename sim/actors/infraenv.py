"""The Assisted Installer's InfraEnv controller: an image and its download URL per InfraEnv.

For every InfraEnv in its namespaces the stand-in makes sure the image service has
an image, and writes `status.isoDownloadURL`, `status.createdTime` and condition
`ImageCreated=True` as assisted-service does once an image is ready. `change_image`
is the "spec changed, new image" path: new content, optionally behind a new URL.

InfraEnvs annotated `sim.agent-forge.containeroo.ch/manual-status: "true"` are left
alone, so tests can write any status they like (an empty URL, ImageCreated=False).
"""

from __future__ import annotations

from typing import Any

from agentforge.api import kinds
from agentforge.kube.client import KubeClient
from sim.actors.base import (
    SIM_PREFIX,
    Actor,
    Journal,
    Timings,
    condition,
    conditions_differ,
    now_rfc3339,
    set_conditions,
)
from sim.actors.isoserver import IsoImage, IsoServer

__all__ = ["MANUAL_STATUS", "InfraEnvStandIn"]

MANUAL_STATUS = f"{SIM_PREFIX}/manual-status"
IMAGE_CREATED = "ImageCreated"


class InfraEnvStandIn(Actor):
    name = "infraenv"

    def __init__(
        self,
        *,
        client: KubeClient,
        iso_server: IsoServer,
        namespaces: tuple[str, ...],
        timings: Timings,
        journal: Journal,
    ) -> None:
        super().__init__(timings=timings, journal=journal)
        self.client = client
        self.iso_server = iso_server
        self.namespaces = namespaces
        self._tags: dict[tuple[str, str], str] = {}

    async def create(
        self,
        name: str,
        *,
        namespace: str | None = None,
        agent_labels: dict[str, str] | None = None,
        manual_status: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create an InfraEnv; with `manual_status` that status is written and kept as is."""
        namespace = namespace or self.namespaces[0]
        body: dict[str, Any] = {
            "apiVersion": kinds.INFRA_ENV.api_version,
            "kind": "InfraEnv",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "pullSecretRef": {"name": "pull-secret"},
                "cpuArchitecture": "x86_64",
                "sshAuthorizedKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGFrZQ sim@agent-forge",
            },
        }
        if agent_labels:
            body["spec"]["agentLabels"] = dict(agent_labels)
        if manual_status is not None:
            body["metadata"]["annotations"] = {MANUAL_STATUS: "true"}
        created = await self.client.create(kinds.INFRA_ENV, body)
        if manual_status is not None:
            return await self.client.patch_status(
                kinds.INFRA_ENV, namespace=namespace, name=name, patch={"status": manual_status}
            )
        self.note(f"InfraEnv {namespace}/{name} created")
        return await self._ensure_image(created) or created

    async def change_image(
        self, name: str, *, namespace: str | None = None, new_url: bool = False
    ) -> IsoImage:
        """New image content for the InfraEnv; `new_url` also publishes it at a new URL."""
        namespace = namespace or self.namespaces[0]
        image = self.iso_server.change(namespace, name)
        if new_url:
            self._tags[(namespace, name)] = f"discovery-v{image.version}"
        self.note(
            f"InfraEnv {namespace}/{name}: new discovery image v{image.version} "
            f"(sha256 {image.sha256[:12]}){' at a new URL' if new_url else ''}"
        )
        current = await self.client.get(kinds.INFRA_ENV, namespace=namespace, name=name)
        await self._ensure_image(current)
        return image

    def expected_url(self, namespace: str, name: str) -> str:
        tag = self._tags.get((namespace, name), "discovery")
        return self.iso_server.url(namespace, name, tag=tag)

    async def step(self) -> None:
        for namespace in self.namespaces:
            listed = await self.client.list(kinds.INFRA_ENV, namespace=namespace)
            for infraenv in listed.items:
                await self._ensure_image(infraenv)

    async def _ensure_image(self, infraenv: dict[str, Any]) -> dict[str, Any] | None:
        meta = infraenv["metadata"]
        if (meta.get("annotations") or {}).get(MANUAL_STATUS) == "true" or meta.get(
            "deletionTimestamp"
        ):
            return None
        namespace, name = meta["namespace"], meta["name"]
        image = self.iso_server.publish(namespace, name)
        status = infraenv.get("status") or {}
        url = self.expected_url(namespace, name)
        wanted = [condition(IMAGE_CREATED, True, "ImageCreated", "Image has been created")]
        if status.get("isoDownloadURL") == url and not conditions_differ(
            status.get("conditions"), wanted
        ):
            return None
        now = now_rfc3339()
        patch = {
            "status": {
                "isoDownloadURL": url,
                "createdTime": now,
                "conditions": set_conditions(status.get("conditions"), wanted, now=now),
            }
        }
        updated = await self.client.patch_status(
            kinds.INFRA_ENV, namespace=namespace, name=name, patch=patch
        )
        self.note(f"InfraEnv {namespace}/{name}: image v{image.version} ready at {url}")
        return updated
