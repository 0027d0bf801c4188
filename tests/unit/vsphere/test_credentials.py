"""Credentials never show the password, and TLS is verified unless opted out."""

from __future__ import annotations

import ssl

import pytest

from agentforge.vsphere.credentials import Credentials


def test_repr_hides_the_password_and_ca_bundle() -> None:
    creds = Credentials(server="vc.example", username="u", password="hunter2")
    assert "hunter2" not in repr(creds)
    assert "hunter2" not in str(creds)


def test_tls_is_verified_by_default() -> None:
    ctx = Credentials(server="vc.example", username="u", password="p").ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname


def test_insecure_is_an_explicit_opt_out() -> None:
    ctx = Credentials(server="vc", username="u", password="p", insecure=True).ssl_context()
    assert ctx.verify_mode == ssl.CERT_NONE


def test_a_broken_ca_bundle_is_reported_without_credentials() -> None:
    creds = Credentials(server="vc:8443", username="u", password="s3cret", ca_bundle_pem="junk")
    with pytest.raises(ValueError, match="CA bundle") as info:
        creds.ssl_context()
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("server", "netloc"),
    [
        ("vc.example", "vc.example:443"),
        ("vc.example:8443", "vc.example:8443"),
        ("https://vc.example/sdk", "vc.example:443"),
        ("[::1]:9443", "[::1]:9443"),
    ],
)
def test_server_spellings_share_one_session_key(server: str, netloc: str) -> None:
    creds = Credentials(server=server, username="u", password="p")
    assert creds.netloc == netloc
    assert creds.key == Credentials(server=netloc, username="u", password="other").key
