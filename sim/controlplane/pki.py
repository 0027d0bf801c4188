"""Throwaway certificates and keys for one control plane, made with `cryptography`.

One CA signs the serving certificates of the apiserver and of the fault proxy, so a
client that trusts `ca.crt` verifies both (the proxy is a drop-in for the apiserver).
The ServiceAccount signing key is a separate RSA pair so that TokenRequest works.
`issue_serving_pair` signs more serving certificates with the same CA (the operator's
/metrics certificate in tests, which scrapers then verify with `ca.crt`); `new_ca`
makes a separate private CA (an image service's, trusted only where a test says).
Certificates carry the extensions strict verifiers (Go, OpenSSL 3 with
VERIFY_X509_STRICT) insist on: basic constraints, key usage, subject and authority
key identifiers, and SANs `localhost` / `127.0.0.1` / `::1`.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)
_CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """Paths of a PEM certificate (or public key) and its PEM private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Pki:
    """Every file the control plane's processes need, all below one directory."""

    ca: KeyPair
    apiserver: KeyPair
    proxy: KeyPair
    service_account: KeyPair  # `cert` holds the public key, `key` the private key


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agent-forge test control plane"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _new_ca(
    common_name: str = "agent-forge-test-ca",
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _new_serving_cert(
    *,
    common_name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: tuple[str, ...] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        *(x509.DNSName(host) for host in hosts),
    ]
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def new_ca(directory: Path, *, common_name: str = "agent-forge-test-ca") -> KeyPair:
    """A fresh CA alone (`ca.crt`, `ca.key` in `directory`), e.g. a private CA that a
    test trusts or not, apart from the control plane's."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = _new_ca(common_name)
    pair = KeyPair(
        cert=_write(directory / "ca.crt", cert.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / "ca.key", _key_pem(key)),
    )
    pair.cert.chmod(0o644)
    return pair


def issue_serving_pair(
    ca: KeyPair, directory: Path, *, common_name: str, hosts: tuple[str, ...] = ()
) -> KeyPair:
    """A serving certificate for localhost / 127.0.0.1 / ::1 (and the DNS names
    `hosts`) signed by `ca`, written to `directory` as `tls.crt` and `tls.key` (the
    layout of a `kubernetes.io/tls` Secret)."""
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key} is not the EC key this module makes")
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key, cert = _new_serving_cert(
        common_name=common_name, ca_key=ca_key, ca_cert=ca_cert, hosts=hosts
    )
    directory.mkdir(parents=True, exist_ok=True)
    return KeyPair(
        cert=_write(directory / "tls.crt", cert.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / "tls.key", _key_pem(key)),
    )


def generate(directory: Path) -> Pki:
    """Create a fresh CA, the two serving certificates and the ServiceAccount keys."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _new_ca()
    ca = KeyPair(
        cert=_write(directory / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / "ca.key", _key_pem(ca_key)),
    )
    # The CA certificate must stay readable by whoever holds a kubeconfig.
    ca.cert.chmod(0o644)

    serving: dict[str, KeyPair] = {}
    for name in ("apiserver", "proxy"):
        key, cert = _new_serving_cert(common_name=name, ca_key=ca_key, ca_cert=ca_cert)
        serving[name] = KeyPair(
            cert=_write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            key=_write(directory / f"{name}.key", _key_pem(key)),
        )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_public = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    service_account = KeyPair(
        cert=_write(directory / "sa.pub", sa_public),
        key=_write(directory / "sa.key", _key_pem(sa_key)),
    )
    return Pki(
        ca=ca,
        apiserver=serving["apiserver"],
        proxy=serving["proxy"],
        service_account=service_account,
    )
