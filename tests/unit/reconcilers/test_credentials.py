"""Parsing the vSphere credentials Secret: every problem names the Secret, the key and the fix."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentforge.secret_credentials import CredentialsError, parse_credentials

PASSWORD = "s3cr3t-Pa55word"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def data(**values: str) -> dict[str, str]:
    base = {"server": "vc.example:8443", "username": "admin@vsphere.local", "password": PASSWORD}
    base.update(values)
    return {k: b64(v) for k, v in base.items() if v is not None}


def parse(payload: dict[str, str]) -> object:
    return parse_credentials(namespace="ns1", name="vc-creds", data=payload)


def test_the_three_required_keys_make_verified_credentials() -> None:
    creds = parse_credentials(namespace="ns1", name="vc-creds", data=data())
    assert creds.server == "vc.example:8443"
    assert creds.netloc == "vc.example:8443"
    assert creds.username == "admin@vsphere.local"
    assert creds.password == PASSWORD
    assert creds.insecure is False
    assert creds.ca_bundle_pem is None


@pytest.mark.parametrize("key", ["server", "username", "password"])
def test_a_missing_key_names_the_secret_the_key_and_the_fix(key: str) -> None:
    payload = data()
    del payload[key]
    with pytest.raises(CredentialsError) as caught:
        parse(payload)
    message = str(caught.value)
    assert "Secret ns1/vc-creds" in message
    assert repr(key) in message
    assert "kubectl -n ns1 patch secret vc-creds" in message
    assert PASSWORD not in message


def test_an_empty_key_counts_as_missing() -> None:
    with pytest.raises(CredentialsError, match="'password'"):
        parse(data(password=""))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False), ("", False)],
)
def test_insecure_accepts_go_boolean_spellings(text: str, expected: bool) -> None:
    creds = parse_credentials(namespace="ns1", name="vc-creds", data=data(insecure=text))
    assert creds.insecure is expected


def test_an_insecure_value_that_is_no_boolean_is_refused() -> None:
    with pytest.raises(CredentialsError, match="'insecure' must be true or false"):
        parse(data(insecure="maybe"))


def test_the_password_is_used_exactly_as_stored() -> None:
    creds = parse_credentials(namespace="ns1", name="vc-creds", data=data(password=" pw \n"))
    assert creds.password == " pw \n"


def test_a_ca_bundle_under_either_key_is_trusted() -> None:
    pem = _self_signed_pem()
    for key in ("caBundle", "ca.crt"):
        creds = parse_credentials(namespace="ns1", name="vc-creds", data=data(**{key: pem}))
        assert creds.ca_bundle_pem == pem
        creds.ssl_context()  # loads without error


def test_a_ca_bundle_that_is_not_pem_is_refused() -> None:
    with pytest.raises(CredentialsError, match="'caBundle' is not a PEM certificate bundle"):
        parse(data(caBundle="not a certificate"))


def test_a_value_that_is_not_base64_is_refused_without_echoing_it() -> None:
    payload = data()
    payload["password"] = "%%%not-base64%%%"
    with pytest.raises(CredentialsError) as caught:
        parse(payload)
    assert "'password' is not base64" in str(caught.value)
    assert "%%%not-base64%%%" not in str(caught.value)


def test_a_server_without_host_is_refused() -> None:
    with pytest.raises(CredentialsError, match="'server' is not a host name"):
        parse(data(server="https://"))


def test_the_repr_of_parsed_credentials_hides_the_password() -> None:
    creds = parse_credentials(namespace="ns1", name="vc-creds", data=data())
    assert PASSWORD not in repr(creds)


def _self_signed_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()
