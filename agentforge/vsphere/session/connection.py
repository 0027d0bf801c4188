"""Opening a SOAP connection to vCenter whose every wait is bounded.

pyVmomi's `SmartStubAdapter` asks the server which API versions it speaks over an
`HTTPSConnection` without any timeout: against a vCenter that accepts TCP and never
answers (a black hole: a dead load balancer, a firewall that drops), that thread
waits forever, and no asyncio timeout can end a thread. So the version discovery
is done here, and every connection the stub opens uses `_TimedHTTPS`:

- the TCP connect and the TLS handshake are bounded by `connect_timeout`;
- every read after that by `read_timeout` (the call timeout: the longest a single
  request may go unanswered, above the task waiter's long poll).

A stuck thread therefore ends by itself within those bounds; the session layer also
bounds the whole login (`login_timeout`) in asyncio.
"""

from __future__ import annotations

import functools
import http.client
import re
import ssl
from typing import Any

from agentforge.vsphere.model import errors
from agentforge.vsphere.vmomi import soap_stub_adapter, vim25_versions

__all__ = ["open_stub"]

VERSIONS_PATH = "/sdk/vimServiceVersions.xml"
_MAX_VERSIONS_DOC = 256 * 1024
_NAMESPACE = re.compile(rb"<namespace>(.*?)</namespace>", re.DOTALL)
_NAME = re.compile(rb"<name>\s*urn:vim25\s*</name>")
_VERSION = re.compile(rb"<version>\s*([^<\s]+)\s*</version>")


class _TimedHTTPS(http.client.HTTPSConnection):
    """`HTTPSConnection` with one timeout for connect + handshake, another for reads."""

    def __init__(self, *args: Any, read_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timeout = read_timeout

    def connect(self) -> None:
        super().connect()  # TCP connect and TLS handshake under `timeout` (connect)
        if self.sock is not None:
            self.sock.settimeout(self._read_timeout)


def open_stub(
    *,
    host: str,
    port: int,
    context: ssl.SSLContext,
    connect_timeout: float,
    read_timeout: float,
    pool_size: int,
) -> Any:
    """A `SoapStubAdapter` for the newest vim25 version the server speaks (blocking)."""
    version = _supported_version(
        host=host,
        port=port,
        context=context,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    stub = soap_stub_adapter(
        host=host,
        port=port,
        version=version,
        sslContext=context,
        httpConnectionTimeout=connect_timeout,
        poolSize=pool_size,
    )
    stub.scheme = functools.partial(_TimedHTTPS, read_timeout=read_timeout)
    return stub


def _supported_version(
    *,
    host: str,
    port: int,
    context: ssl.SSLContext,
    connect_timeout: float,
    read_timeout: float,
) -> str:
    conn = _TimedHTTPS(
        host, port, context=context, timeout=connect_timeout, read_timeout=read_timeout
    )
    try:
        conn.request("GET", VERSIONS_PATH)
        response = conn.getresponse()
        body = response.read(_MAX_VERSIONS_DOC) if response.status == 200 else b""
    finally:
        conn.close()
    offered: set[str] = set()
    for block in _NAMESPACE.findall(body):
        if _NAME.search(block):
            offered.update(v.decode("ascii", "replace") for v in _VERSION.findall(block))
    for name, version_id in vim25_versions():
        if version_id in offered:
            return name
    where = f"{host}:{port}"
    raise errors.ConnectionFailed(
        f"{where} does not answer as a vCenter ({VERSIONS_PATH} lists no vim25 API version "
        "this client speaks); check the server address in the credentials Secret",
        subject=f"vCenter {where}",
        fault="NotAVcenter",
    )
