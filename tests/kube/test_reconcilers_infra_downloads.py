"""ISO downloads as an admin meets them: a private CA, a proxy, redirects, the size cap.

The infra controller (real control plane, vcsim) caches the InfraEnv's image from an
HTTPS image service whose certificate a private CA signed (`sim.controlplane.pki`),
with `Deps.iso` built as the app builds it from `--iso-ca-bundle`, `--iso-max-size`
and the proxy variables (`app.iso_access`). What a user reads is the pool's
`ISOReady` condition: the reason and a message naming the fix (the flag or the
ConfigMap to change).
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentforge.api import kinds
from agentforge.app import iso_access
from agentforge.settings import Settings
from sim.actors.isoserver import IsoServer
from sim.controlplane import pki
from sim.http_proxy import ForwardProxy
from tests.kube.reconcilers_world import World

pytestmark = [pytest.mark.controlplane, pytest.mark.vcsim]

POOL = kinds.VSPHERE_AGENT_POOL
HIDDEN_HOST = "images.example.test"  # only the test proxy can reach it
ISO_SIZE = 2 * 1024 * 1024  # over the 1 MiB any real discovery image exceeds (`iso_check`)


@dataclasses.dataclass
class Images:
    secure: IsoServer
    plain: IsoServer
    ca_pem: str
    bundle: Path
    """Where the test's `--iso-ca-bundle` points (absent until a test writes it)."""


@pytest.fixture
async def images(tmp_path: Path) -> AsyncIterator[Images]:
    ca = pki.new_ca(tmp_path / "ca", common_name="image-service-ca")
    pair = pki.issue_serving_pair(ca, tmp_path / "tls", common_name="images", hosts=(HIDDEN_HOST,))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    secure = await IsoServer(size=ISO_SIZE, ssl_context=context).start()
    plain = await IsoServer(size=ISO_SIZE).start()
    try:
        yield Images(secure, plain, ca.cert.read_text(), tmp_path / "trusted-ca" / "ca-bundle.crt")
    finally:
        await secure.stop()
        await plain.stop()


def use(world: World, images: Images, environ: dict[str, str] | None = None, **flags: Any) -> None:
    """Give the world's controllers the ISO access the app builds from these flags."""
    settings = Settings.model_validate({"iso_ca_bundle": images.bundle, **flags})
    world.deps = dataclasses.replace(world.deps, iso=iso_access(settings, environ or {}))


async def pool_with_iso(world: World, url: str) -> None:
    await world.create_secret()
    await world.create_infra_env(url=url)
    await world.create_pool()


def iso_ready(pool: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in pool["status"]["conditions"]}["ISOReady"]  # type: ignore[no-any-return]


async def test_a_private_ca_is_untrusted_until_the_bundle_holds_it(
    world: World, images: Images
) -> None:
    use(world, images)
    url = images.secure.url(world.namespace, "infra")
    images.secure.publish(world.namespace, "infra")
    await pool_with_iso(world, url)
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "ISOReady", status="False", reason="ISOSourceUntrusted"
        )
        message = iso_ready(pool)["message"]
        assert f"the certificate of the ISO source {url} is not trusted" in message
        assert "--iso-ca-bundle" in message
        assert "ConfigMap agent-forge-trusted-ca" in message
        assert images.secure.stats().downloads == 0
        # What OpenShift's CA injection (or an admin) does: the mounted file appears.
        images.bundle.parent.mkdir()
        images.bundle.write_text(images.ca_pem)
        pool = await world.condition(POOL, "pool", "ISOReady", status="True", reason="ISOCached")
    image = images.secure.image(world.namespace, "infra")
    assert image is not None
    assert pool["status"]["iso"]["sha256"] == image.sha256


async def test_the_proxy_is_used_unless_no_proxy_names_the_host(
    world: World, images: Images
) -> None:
    images.bundle.parent.mkdir()
    images.bundle.write_text(images.ca_pem)
    images.secure.publish(world.namespace, "infra")
    url = images.secure.url(world.namespace, "infra").replace("127.0.0.1", HIDDEN_HOST)
    routes = {HIDDEN_HOST: ("127.0.0.1", images.secure.port)}
    async with ForwardProxy(routes=routes) as proxy:
        use(world, images, {"HTTPS_PROXY": proxy.url, "NO_PROXY": "10.0.0.0/8,.svc"})
        await pool_with_iso(world, url)
        async with world.run(vm_controller=False):
            await world.condition(POOL, "pool", "ISOReady", status="True", reason="ISOCached")
        assert {r.target for r in proxy.requests} == {f"{HIDDEN_HOST}:{images.secure.port}"}
        assert images.secure.stats().downloads == 1

        # The same pool with the image service's domain in NO_PROXY: a direct
        # connection, which cannot resolve the name (the failure proves the bypass).
        seen = len(proxy.requests)
        use(world, images, {"HTTPS_PROXY": proxy.url, "NO_PROXY": "10.0.0.0/8,example.test"})
        await world.kube.patch_merge(
            POOL,
            namespace=world.namespace,
            name="pool",
            patch={
                "metadata": {"annotations": {"agent-forge.containeroo.ch/force-iso-refresh": "1"}}
            },
        )
        async with world.run(vm_controller=False):
            pool = await world.condition(
                POOL, "pool", "ISOReady", status="False", reason="ISOCacheFailed"
            )
        assert HIDDEN_HOST in iso_ready(pool)["message"]
        assert len(proxy.requests) == seen, "NO_PROXY sent the download around the proxy"


async def test_a_redirect_to_http_is_refused_with_a_clear_message(
    world: World, images: Images
) -> None:
    use(world, images)
    images.bundle.parent.mkdir()
    images.bundle.write_text(images.ca_pem)
    images.plain.publish(world.namespace, "infra")
    downgrade = images.plain.url(world.namespace, "infra")
    images.secure.redirect(world.namespace, "infra", tag="discovery", to=downgrade)
    await pool_with_iso(world, images.secure.url(world.namespace, "infra"))
    async with world.run(vm_controller=False):
        pool = await world.condition(
            POOL, "pool", "ISOReady", status="False", reason="ISORedirectRefused"
        )
    message = iso_ready(pool)["message"]
    assert f"redirects (HTTP 302) to {downgrade}" in message
    assert "only redirects to https are followed" in message
    assert "serve the image over https" in message
    assert images.plain.stats().requests == 0
    assert await world.iso_files() == []


async def test_an_image_over_the_size_cap_names_the_flag(world: World, images: Images) -> None:
    use(world, images, iso_max_size="1Mi")
    images.bundle.parent.mkdir()
    images.bundle.write_text(images.ca_pem)
    images.secure.publish(world.namespace, "infra")
    await pool_with_iso(world, images.secure.url(world.namespace, "infra"))
    async with world.run(vm_controller=False):
        pool = await world.condition(POOL, "pool", "ISOReady", status="False", reason="ISOTooLarge")
    message = iso_ready(pool)["message"]
    assert f"is {ISO_SIZE} bytes, over the limit of {1024 * 1024} bytes" in message
    assert "set by --iso-max-size: raise --iso-max-size" in message
    assert await world.iso_files() == []
