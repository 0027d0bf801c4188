"""Credentials never show the password, and TLS is verified unless opted out."""

from __future__ import annotations

import ssl

import pytest

from agentforge.vsphere.session.credentials import Credentials


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
def test_server_spellings_of_one_credential_share_one_session_key(server: str, netloc: str) -> None:
    creds = Credentials(server=server, username="u", password="p")
    assert creds.netloc == netloc
    assert creds.key == Credentials(server=netloc, username="u", password="p").key


@pytest.mark.parametrize(
    "other",
    [
        Credentials(server="vc.example", username="u", password="other"),
        Credentials(server="vc.example", username="u", password="p", insecure=True),
        Credentials(server="vc.example", username="u", password="p", ca_bundle_pem="PEM"),
        Credentials(server="vc.example", username="v", password="p"),
        Credentials(server="vc.example:8443", username="u", password="p"),
    ],
    ids=["password", "insecure", "ca-bundle", "user", "port"],
)
def test_credentials_differing_in_anything_never_share_a_session_key(other: Credentials) -> None:
    mine = Credentials(server="vc.example", username="u", password="p")
    assert mine.key != other.key
    assert hash(mine.key) != hash(other.key)


def test_the_same_user_with_another_password_is_the_same_account() -> None:
    a = Credentials(server="vc.example", username="u", password="p")
    b = Credentials(server="https://vc.example/sdk", username="u", password="q")
    assert a.key != b.key
    assert a.account == b.account == a.key.account


@pytest.mark.parametrize(
    ("server", "username"),
    [
        ("vc.example", "Administrator@vsphere.local"),
        ("VC.example.", "administrator@VSPHERE.LOCAL"),
        ("https://vc.example:443/sdk", "VSPHERE.LOCAL\\administrator"),
        ("vc.example:443", "ADMINISTRATOR"),
    ],
)
def test_every_spelling_of_one_account_is_one_account_key(server: str, username: str) -> None:
    spelled = Credentials(server=server, username=username, password="p")
    assert spelled.account == Credentials("vc.example", "administrator", "q").account
    assert spelled.account.vcenter == "vc.example:443"
    assert spelled.account.user == "administrator"


def test_an_address_is_one_account_key_however_written() -> None:
    short = Credentials(server="[fd00::5]", username="u", password="p").account
    assert (
        short
        == Credentials(server="https://[FD00:0:0::5]:443/sdk", username="U", password="p").account
    )
    assert short.vcenter == "[fd00::5]:443"


def test_no_password_reaches_what_metric_labels_and_keys_are_made_of() -> None:
    c = Credentials(server="https://admin:hunter2@vc.example/sdk", username="u", password="p")
    assert c.netloc == "vc.example:443"
    assert "hunter2" not in f"{c.account} {c.key!r} {c.key}"


def test_the_session_key_shows_neither_the_password_nor_its_whole_digest() -> None:
    key = Credentials(server="vc.example", username="u", password="hunter2").key
    for text in (str(key), repr(key), f"{key}", repr([key])):
        assert "hunter2" not in text
        assert key.digest not in text
    assert key.tag in repr(key)
    assert len(key.tag) == 8
    assert key.digest.startswith(key.tag)


def test_the_digest_is_keyed_not_a_plain_hash_of_the_password() -> None:
    import hashlib  # noqa: PLC0415

    key = Credentials(server="vc.example", username="u", password="hunter2").key
    assert key.digest != hashlib.sha256(b"hunter2").hexdigest()
    assert "hunter2" not in key.digest
