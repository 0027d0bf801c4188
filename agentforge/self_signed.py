"""A self-signed serving certificate for /metrics, made where `cryptography` may be loaded.

`pair()` makes a fresh ECDSA P-256 certificate and key (valid one year, names
`localhost`, the host name and the loopback addresses), as controller-runtime does
when no certificate is given. `python -m agentforge.self_signed` writes such a pair
to standard output (certificate PEM, then key PEM), which is how the operator gets
one (`agentforge.secure_metrics.MetricsTls.self_signed`).

Why a child process: the standard `ssl` module can serve a certificate but not make
one, and pyca's `cryptography` (the maintained X.509 library, a runtime dependency)
costs the process that imports it about 8 MB of RSS for as long as it lives, for a
certificate made once at start. Made in a short-lived child, the pair costs the
operator nothing; the operator imports this module itself only when the child
cannot run. Nothing but the parent reads the child's output (a pipe; never a file).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["VALIDITY", "pair"]

VALIDITY = dt.timedelta(days=365)


def pair(*, hostname: str | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) of a fresh self-signed serving certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    host = hostname if hostname is not None else socket.gethostname()
    dns = ["localhost"] + ([host] if host.isascii() and host and host != "localhost" else [])
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agent-forge"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"agent-forge-metrics@{dns[-1]}"[:64]),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def main() -> int:
    cert, key = pair()
    sys.stdout.buffer.write(cert + key)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
