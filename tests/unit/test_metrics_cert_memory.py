"""The operator process never loads `cryptography` (about 8 MB of RSS) for /metrics TLS.

A mounted certificate needs no X.509 code, and the self-signed one is made by a child
process (`agentforge.self_signed`). Checked in a fresh interpreter that imports what
`python -m agentforge run` imports, then builds the metrics TLS the way the app does
(`secure_metrics.for_settings`), once with a mounted pair and once self-signed.
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from agentforge import secure_metrics
from sim.controlplane import pki

_CHECK = """
import sys
from pathlib import Path
from typing import Any, cast

import agentforge.app  # everything the operator imports
from agentforge import secure_metrics
from agentforge.kube.client import KubeClient
from agentforge.settings import Settings

assert "cryptography" not in sys.modules, "imported by the operator's modules"
client = cast(KubeClient, object())
mounted: Any = Settings(metrics_cert_path=Path(sys.argv[1]))
tls, _ = secure_metrics.for_settings(mounted, client)
assert tls is not None and not tls.generated
assert "cryptography" not in sys.modules, "imported for a mounted certificate"
tls, _ = secure_metrics.for_settings(Settings(), client)
assert tls is not None and tls.generated
assert "cryptography" not in sys.modules, "imported for the self-signed certificate"
print("no cryptography")
"""


def test_the_operator_serves_mounted_and_self_signed_certificates_without_cryptography(
    tmp_path: Path,
) -> None:
    authority = pki.generate(tmp_path / "ca")
    pair = pki.issue_serving_pair(authority.ca, tmp_path / "pair", common_name="mounted")
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, str(pair.cert.parent)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no cryptography"


def test_the_child_made_pair_is_a_matching_self_signed_certificate() -> None:
    cert_pem, key_pem = secure_metrics._generate_pair()
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.issuer == cert.subject
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert b"BEGIN CERTIFICATE" not in key_pem
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    secure_metrics._load_pem_pair(context, cert=cert_pem, key=key_pem)  # SSLError if no match


def test_when_the_child_cannot_run_the_pair_is_made_in_process_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with caplog.at_level(logging.WARNING, logger="agentforge.secure_metrics"):
        tls = secure_metrics.MetricsTls.self_signed()
    assert tls.generated
    assert "making it in the operator" in caplog.text
