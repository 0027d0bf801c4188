"""How ISO downloads reach the image service: NO_PROXY semantics, trust, redirects.

The pure rules (which proxy for which URL, which redirect is followed) are tested as
tables; the wiring is tested against real loopback servers: an HTTPS image service
with a certificate of a private CA (`sim.controlplane.pki.new_ca`), a second
plain-HTTP one, and a forward proxy (`sim.http_proxy`) that reaches a host name no
DNS knows, so a download that succeeds for that name went through the proxy.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from agentforge.vsphere.iso import image_http as iso_http
from agentforge.vsphere.iso.image_http import CaBundle, CaBundleFile, Proxies
from agentforge.vsphere.iso.pipeline import IsoLimits, IsoSource
from agentforge.vsphere.model import errors
from sim.actors.isoserver import IsoServer
from sim.controlplane import pki
from sim.http_proxy import ForwardProxy

HIDDEN_HOST = "images.example.test"  # reserved TLD: only the test proxy can reach it

# --- which proxy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "no_proxy", "proxied"),
    [
        ("https://images.example.com/a.iso", "", True),
        # domain names: the name and its subdomains; a leading dot or *. only subdomains
        ("https://example.com/a.iso", "example.com", False),
        ("https://images.example.com/a.iso", "example.com", False),
        ("https://images.example.com/a.iso", ".example.com", False),
        ("https://example.com/a.iso", ".example.com", True),
        ("https://images.example.com/a.iso", "*.example.com", False),
        ("https://example.com/a.iso", "*.example.com", True),
        ("https://badexample.com/a.iso", "example.com", True),
        ("https://IMAGES.Example.COM/a.iso", "example.com", False),
        ("https://images.example.com./a.iso", "example.com", False),
        # OpenShift's noProxy: service and cluster suffixes, CIDRs of the networks
        ("https://assisted-image-service.mce.svc/a.iso", ".svc,.cluster.local", False),
        ("https://10.128.4.7/a.iso", "10.128.0.0/14,172.30.0.0/16", False),
        ("https://10.132.0.1/a.iso", "10.128.0.0/14,172.30.0.0/16", True),
        ("https://[fd00::5]/a.iso", "fd00::/8", False),
        ("https://[fe80::5]/a.iso", "fd00::/8", True),
        # a CIDR matches IP literals only: no name is resolved to decide
        ("https://images.example.com/a.iso", "0.0.0.0/0", True),
        # IPs, with and without port
        ("https://192.0.2.10/a.iso", "192.0.2.10", False),
        ("https://192.0.2.11/a.iso", "192.0.2.10", True),
        ("https://[2001:db8::1]:8443/a.iso", "[2001:db8::1]:8443", False),
        ("https://[2001:db8::1]/a.iso", "2001:db8::1", False),
        # ports: an entry with a port matches that port only (443 is https's default)
        ("https://images.example.com/a.iso", "images.example.com:443", False),
        ("https://images.example.com:8443/a.iso", "images.example.com:443", True),
        ("https://images.example.com:8443/a.iso", "images.example.com:8443", False),
        # everything, spaces, empty entries
        ("https://images.example.com/a.iso", "*", False),
        ("https://images.example.com/a.iso", " , other.org , example.com ", False),
        # loopback and localhost never use a proxy
        ("https://127.0.0.1:8443/a.iso", "", False),
        ("https://127.9.9.9/a.iso", "", False),
        ("https://[::1]/a.iso", "", False),
        ("https://localhost/a.iso", "", False),
    ],
)
def test_no_proxy_semantics_are_go_httpproxy_s(url: str, no_proxy: str, proxied: bool) -> None:
    proxies = Proxies(https="http://proxy.corp:3128", no_proxy=no_proxy)
    chosen = proxies.for_url(url)
    assert (chosen is not None) == proxied
    if chosen is not None:
        assert chosen.url == "http://proxy.corp:3128"


def test_each_scheme_uses_its_own_variable_and_upper_case_wins() -> None:
    proxies = Proxies.from_environ(
        {
            "HTTPS_PROXY": "secure.corp:3128",
            "https_proxy": "http://ignored:1",
            "http_proxy": "http://plain.corp:8080",
            "no_proxy": ".internal",
        }
    )
    assert proxies.https == "secure.corp:3128"
    assert proxies.no_proxy == ".internal"
    https = proxies.for_url("https://a.example/x.iso")
    http = proxies.for_url("http://a.example/x.iso")
    assert https is not None
    assert https.url == "http://secure.corp:3128"
    assert http is not None
    assert http.url == "http://plain.corp:8080"
    assert proxies.for_url("https://a.internal/x.iso") is None
    assert Proxies(http="http://plain.corp:8080").for_url("https://a.example/x.iso") is None


def test_proxy_user_info_becomes_a_header_and_is_never_shown() -> None:
    proxies = Proxies.from_environ({"HTTPS_PROXY": "http://svc:s3cr3t-pw@proxy.corp:3128"})
    chosen = proxies.for_url("https://images.example.com/a.iso")
    assert chosen is not None
    assert chosen.url == "http://proxy.corp:3128"
    assert chosen.headers == {"Proxy-Authorization": aiohttp.encode_basic_auth("svc", "s3cr3t-pw")}
    assert "s3cr3t-pw" not in proxies.describe()
    assert "proxy.corp:3128" in proxies.describe()


@pytest.mark.parametrize("value", ["socks5://proxy:1080", "http://", "ftp://proxy.corp"])
def test_a_variable_that_is_no_proxy_url_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="HTTPS_PROXY is not a proxy URL"):
        Proxies.from_environ({"HTTPS_PROXY": value})


def test_no_variables_no_proxy() -> None:
    proxies = Proxies.from_environ({})
    assert not proxies.configured
    assert proxies.for_url("https://images.example.com/a.iso") is None
    assert proxies.describe() == "no proxy"


# --- trust -----------------------------------------------------------------------------------


def test_a_bundle_without_certificates_is_an_error_naming_its_origin() -> None:
    with pytest.raises(errors.IsoSourceError, match=r"/etc/ca\.crt holds no usable PEM"):
        iso_http.ssl_context(CaBundle(pem="not a certificate", origin="/etc/ca.crt"))


def test_the_bundle_file_is_read_again_only_when_it_changes(tmp_path: Path) -> None:
    ca_one = pki.new_ca(tmp_path / "one", common_name="one")
    ca_two = pki.new_ca(tmp_path / "two", common_name="two")
    mount = tmp_path / "trusted-ca"
    bundle = CaBundleFile(mount / "ca-bundle.crt")
    assert bundle.current() is None  # the optional ConfigMap is not there (yet)
    mount.mkdir()
    (mount / "ca-bundle.crt").write_text("")
    assert bundle.current() is None  # created, not injected yet
    # The kubelet swaps a symlink when the ConfigMap changes.
    (mount / "v1").write_text(ca_one.cert.read_text())
    (mount / "ca-bundle.crt").unlink()
    (mount / "ca-bundle.crt").symlink_to(mount / "v1")
    first = bundle.current()
    assert first is not None
    assert first.pem == ca_one.cert.read_text()
    assert bundle.current() is first  # unchanged: not read again
    (mount / "v2").write_text(ca_two.cert.read_text())
    (mount / "ca-bundle.crt").unlink()
    (mount / "ca-bundle.crt").symlink_to(mount / "v2")
    second = bundle.current()
    assert second is not None
    assert second.pem == ca_two.cert.read_text()
    assert second.origin == str(mount / "ca-bundle.crt")


# --- against servers -------------------------------------------------------------------------


@dataclass
class Images:
    """An HTTPS image service (private CA) and a plain-HTTP one."""

    secure: IsoServer
    plain: IsoServer
    ca: CaBundle


@pytest.fixture
async def images(tmp_path: Path) -> AsyncIterator[Images]:
    ca = pki.new_ca(tmp_path / "ca", common_name="images-ca")
    pair = pki.issue_serving_pair(ca, tmp_path / "tls", common_name="images", hosts=(HIDDEN_HOST,))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pair.cert, pair.key)
    secure = await IsoServer(size=64 * 1024, ssl_context=context).start()
    plain = await IsoServer(size=64 * 1024).start()
    for server in (secure, plain):
        server.publish("ns", "ie")
    try:
        yield Images(secure, plain, CaBundle(pem=ca.cert.read_text(), origin="the test CA"))
    finally:
        await secure.stop()
        await plain.stop()


async def fetch(source: IsoSource, limits: IsoLimits | None = None) -> tuple[int, bytes]:
    limits = limits or IsoLimits()
    async with (
        iso_http.client(source, limits) as session,
        iso_http.get(session, source, headers={}, limits=limits) as resp,
    ):
        return resp.status, await resp.read()


async def test_a_private_ca_is_untrusted_without_the_bundle_and_trusted_with_it(
    images: Images,
) -> None:
    url = images.secure.url("ns", "ie")
    with pytest.raises(errors.IsoSourceUntrusted) as refused:
        await fetch(IsoSource(url=url))
    assert "is not trusted" in str(refused.value)
    assert "certificate verify failed" in str(refused.value) or "issuer" in str(refused.value)
    status, body = await fetch(IsoSource(url=url, ca_bundle=images.ca))
    assert status == 200
    assert body == images.secure.image("ns", "ie").data  # type: ignore[union-attr]


async def test_the_proxy_is_used_for_https_and_its_credentials_sent(images: Images) -> None:
    auth = aiohttp.encode_basic_auth("svc", "pw")
    routes = {HIDDEN_HOST: ("127.0.0.1", images.secure.port)}
    async with ForwardProxy(routes=routes, require_auth=auth) as proxy:
        url = images.secure.url("ns", "ie").replace("127.0.0.1", HIDDEN_HOST)
        proxies = Proxies.from_environ({"HTTPS_PROXY": proxy.url.replace("//", "//svc:pw@")})
        status, _ = await fetch(IsoSource(url=url, ca_bundle=images.ca, proxies=proxies))
        assert status == 200
        assert [(r.method, r.target, r.authorised) for r in proxy.requests] == [
            ("CONNECT", f"{HIDDEN_HOST}:{images.secure.port}", True)
        ]


async def test_no_proxy_sends_the_download_around_the_proxy(images: Images) -> None:
    routes = {HIDDEN_HOST: ("127.0.0.1", images.secure.port)}
    async with ForwardProxy(routes=routes) as proxy:
        url = images.secure.url("ns", "ie").replace("127.0.0.1", HIDDEN_HOST)
        proxies = Proxies(https=proxy.url, no_proxy=".example.test")
        with pytest.raises(aiohttp.ClientConnectorError):  # direct: no DNS knows the name
            await fetch(IsoSource(url=url, ca_bundle=images.ca, proxies=proxies))
        # loopback never goes through a proxy: the same image by address comes directly
        direct = IsoSource(url=images.secure.url("ns", "ie"), ca_bundle=images.ca, proxies=proxies)
        assert (await fetch(direct))[0] == 200
        assert proxy.requests == []


async def test_a_redirect_to_http_is_refused_and_one_to_https_followed(images: Images) -> None:
    plain_url = images.plain.url("ns", "ie")
    images.secure.redirect("ns", "ie", tag="old", to=plain_url)
    downgraded = IsoSource(url=images.secure.url("ns", "ie", tag="old"), ca_bundle=images.ca)
    with pytest.raises(errors.IsoRedirectRefused) as refused:
        await fetch(downgraded)
    message = str(refused.value)
    assert f"to {plain_url}" in message
    assert "only redirects to https are followed" in message
    assert images.plain.stats().requests == 0, "nothing was fetched over http"

    images.secure.redirect("ns", "ie", tag="moved", to=images.secure.url("ns", "ie"))
    moved = IsoSource(url=images.secure.url("ns", "ie", tag="moved"), ca_bundle=images.ca)
    assert (await fetch(moved))[0] == 200
    images.plain.redirect("ns", "ie", tag="upgrade", to=images.secure.url("ns", "ie"))
    upgraded = IsoSource(url=images.plain.url("ns", "ie", tag="upgrade"), ca_bundle=images.ca)
    assert (await fetch(upgraded))[0] == 200


async def test_redirects_are_followed_a_bounded_number_of_times(images: Images) -> None:
    secure = images.secure
    for hop in range(3):
        secure.redirect("ns", "ie", tag=f"hop{hop}", to=secure.url("ns", "ie", tag=f"hop{hop + 1}"))
    source = IsoSource(url=secure.url("ns", "ie", tag="hop0"), ca_bundle=images.ca)
    assert (await fetch(source, IsoLimits(max_redirects=3)))[0] == 200
    with pytest.raises(errors.IsoRedirectRefused, match="at most 2 are followed"):
        await fetch(source, IsoLimits(max_redirects=2))


async def test_the_proxy_environment_of_the_process_is_not_read_implicitly(
    images: Images, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's trust_env stays off: only `Proxies` decides (with CIDR-aware NO_PROXY)."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert os.environ["HTTPS_PROXY"]
    plain = IsoSource(url=images.plain.url("ns", "ie").replace("127.0.0.1", "localhost"))
    assert (await fetch(plain))[0] == 200
