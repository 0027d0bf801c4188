"""The fault proxy is transparent: what a client sends is what the upstream gets, and back.

The real proxy process (`python -m sim.controlplane.proxy`) in front of a raw HTTPS
upstream that records every request byte for byte and answers with scripted raw
bytes; the client side is a raw TLS socket too, so nothing between them adds or
drops a header. The headers the proxy owns (hop-by-hop per RFC 9110 7.6.1, `Host`,
`Expect`) are the only difference; aiohttp's defaults (`Content-Type:
application/octet-stream`, `Accept`, `Accept-Encoding`, `User-Agent`, and on
responses `Content-Type`, `Server`, `Date`) never appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sim.actors.waiting import eventually
from sim.controlplane import pki
from sim.controlplane.processes import free_ports

Headers = list[tuple[str, str]]


@dataclass
class Seen:
    method: str
    target: str
    headers: Headers
    body: bytes


@dataclass
class Upstream:
    """Answers every request with `answer` (raw header lines and body bytes)."""

    status: str = "200 OK"
    headers: Headers = field(default_factory=lambda: [("Content-Length", "0")])
    body: bytes = b""
    chunks: list[bytes] | None = None
    seen: list[Seen] = field(default_factory=list)
    connections: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request per connection (`Connection: close`), so no task outlives a test."""
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            request = await read_message(reader, request=True)
            if request is not None:
                self.seen.append(Seen(*request))
                writer.write(self.answer())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            return  # the proxy hung up
        finally:
            writer.close()

    async def settled(self) -> None:
        await asyncio.wait_for(asyncio.gather(*self.connections), 10)

    def answer(self) -> bytes:
        lines = [*self.headers, ("Connection", "close")]
        head = f"HTTP/1.1 {self.status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines)
        if self.chunks is None:
            return (head + "\r\n").encode() + self.body
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in self.chunks) + b"0\r\n\r\n"
        return (head + "\r\n").encode() + body


async def read_message(
    reader: asyncio.StreamReader, *, request: bool
) -> tuple[str, str, Headers, bytes] | None:
    """One HTTP/1.1 message: start line parts, raw header list, de-chunked body."""
    line = await reader.readline()
    if not line:
        return None
    first, second, *_ = line.decode().rstrip("\r\n").split(" ", 2)
    headers: Headers = []
    while (raw := (await reader.readline()).decode().rstrip("\r\n")) != "":
        name, _, value = raw.partition(":")
        headers.append((name, value.strip()))
    names = {k.lower(): v for k, v in headers}
    body = b""
    if "chunked" in names.get("transfer-encoding", ""):
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in names:
        body = await reader.readexactly(int(names["content-length"]))
    elif not request:
        body = await reader.read()
    return first, second, headers, body


@dataclass
class Proxied:
    port: int
    upstream: Upstream
    ca: Path

    async def send(self, raw: bytes) -> tuple[str, Headers, bytes]:
        """One request over a fresh TLS connection: status code, headers, body."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=ctx)
        try:
            writer.write(raw)
            await writer.drain()
            message = await asyncio.wait_for(read_message(reader, request=False), 10)
        finally:
            writer.close()
        await self.upstream.settled()
        assert message is not None
        _, status, headers, body = message
        return status, headers, body


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.generate(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def proxied(certificates: pki.Pki, tmp_path: Path) -> AsyncIterator[Proxied]:
    upstream = Upstream()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(certificates.apiserver.cert), str(certificates.apiserver.key))
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, ssl=server_ctx)
    upstream_port = server.sockets[0].getsockname()[1]
    port, control = free_ports(2)
    with _proxy(certificates, upstream_port, port, control, tmp_path / "proxy.log"):
        await _until_listening(port)
        yield Proxied(port=port, upstream=upstream, ca=certificates.ca.cert)
    server.close()
    await server.wait_closed()


@contextlib.contextmanager
def _proxy(certs: pki.Pki, upstream: int, port: int, control: int, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim.controlplane.proxy",
                f"--upstream=https://127.0.0.1:{upstream}",
                f"--ca-file={certs.ca.cert}",
                f"--cert-file={certs.proxy.cert}",
                f"--key-file={certs.proxy.key}",
                f"--port={port}",
                f"--control-port={control}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _until_listening(port: int) -> None:
    async def listening() -> bool:
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # OSError until it listens
        writer.close()
        return True

    await eventually(listening, what=f"the proxy listening on {port}", within=10, interval=0.05)


def request(method: str, target: str, headers: Headers, body: bytes = b"") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    return (head + "\r\n").encode() + body


OWNED = {"host", "connection"}


def passed(headers: Headers) -> Headers:
    return [(k, v) for k, v in headers if k.lower() not in OWNED]


# --- requests ---------------------------------------------------------------------------


async def test_a_create_without_content_type_reaches_the_upstream_without_one(
    proxied: Proxied,
) -> None:
    body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}'
    sent: Headers = [
        ("Host", f"127.0.0.1:{proxied.port}"),
        ("Authorization", "Bearer abc"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    status, _, _ = await proxied.send(
        request("POST", "/api/v1/namespaces/n/configmaps", sent, body)
    )
    assert status == "200"
    (seen,) = proxied.upstream.seen
    assert (seen.method, seen.target, seen.body) == (
        "POST",
        "/api/v1/namespaces/n/configmaps",
        body,
    )
    assert passed(seen.headers) == passed(sent), "nothing added, nothing changed"


async def test_every_header_it_does_not_own_passes_in_order_and_none_is_added(
    proxied: Proxied,
) -> None:
    body = b'[{"op":"add","path":"/data/a","value":"1"}]'
    sent: Headers = [
        ("Host", "apiserver.example:6443"),
        ("User-Agent", "kubectl/v1.37.2 (linux/amd64) kubernetes/abcdef"),
        ("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
        ("Accept-Encoding", "br, gzip;q=0.5"),
        ("Content-Type", "application/json-patch+json"),
        ("Kubectl-Command", "kubectl patch"),
        ("X-Repeated", "one"),
        ("X-Repeated", "two"),
        ("Authorization", "Bearer abc"),
        ("Content-Length", str(len(body))),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "for the proxy only"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
    ]
    target = "/api/v1/namespaces/n/configmaps/x?fieldManager=kubectl-patch&dryRun=All"
    await proxied.send(request("PATCH", target, sent, body))
    (seen,) = proxied.upstream.seen
    assert seen.target == target
    assert seen.body == body
    hop = {"x-hop", "keep-alive", "te"}
    assert passed(seen.headers) == [(k, v) for k, v in passed(sent) if k.lower() not in hop]


async def test_a_chunked_body_stays_chunked_and_gets_no_content_length(proxied: Proxied) -> None:
    chunks = [b'{"kind":"ConfigMap",', b'"apiVersion":"v1",', b'"metadata":{"name":"c"}}']
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    sent: Headers = [
        ("Host", "x"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Type", "application/json"),
        ("Connection", "close"),
    ]
    await proxied.send(request("POST", "/api/v1/namespaces/n/configmaps", sent, framed))
    (seen,) = proxied.upstream.seen
    assert seen.body == b"".join(chunks)
    names = [k.lower() for k, _ in seen.headers]
    assert "content-length" not in names
    assert ("transfer-encoding", "chunked") in [(k.lower(), v) for k, v in seen.headers]
    assert passed([h for h in seen.headers if h[0].lower() != "transfer-encoding"]) == [
        ("Content-Type", "application/json")
    ]


async def test_a_watch_keeps_its_accept_encoding(proxied: Proxied) -> None:
    proxied.upstream.chunks = [b'{"type":"ADDED","object":{}}\n']
    proxied.upstream.headers = [
        ("Content-Type", "application/json"),
        ("Transfer-Encoding", "chunked"),
    ]
    sent: Headers = [("Host", "x"), ("Accept-Encoding", "gzip"), ("Connection", "close")]
    status, _, body = await proxied.send(
        request("GET", "/api/v1/namespaces/n/configmaps?watch=1&timeoutSeconds=1", sent)
    )
    (seen,) = proxied.upstream.seen
    assert passed(seen.headers) == [("Accept-Encoding", "gzip")]
    assert status == "200"
    assert body == b'{"type":"ADDED","object":{}}\n'


# --- responses --------------------------------------------------------------------------


async def test_a_response_comes_back_with_exactly_its_headers_and_bytes(proxied: Proxied) -> None:
    payload = gzip.compress(b'{"kind":"Status","code":415}' * 20)
    proxied.upstream.status = "415 Unsupported Media Type"
    proxied.upstream.headers = [
        ("Audit-Id", "6f1c"),
        ("Cache-Control", "no-cache, private"),
        ("Content-Encoding", "gzip"),
        ("X-Repeated", "one"),
        ("X-Repeated", "two"),
        ("Content-Length", str(len(payload))),
    ]  # no Content-Type, no Date, no Server: none may appear
    proxied.upstream.body = payload
    sent: Headers = [("Host", "x"), ("Accept-Encoding", "gzip"), ("Connection", "close")]
    status, headers, body = await proxied.send(request("GET", "/api/v1/namespaces/n", sent))
    assert status == "415"
    assert body == payload, "not decompressed, not re-encoded"
    assert passed(headers) == proxied.upstream.headers


async def test_a_chunked_response_stays_chunked(proxied: Proxied) -> None:
    proxied.upstream.headers = [
        ("Content-Type", "application/json"),
        ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
        ("Transfer-Encoding", "chunked"),
    ]
    proxied.upstream.chunks = [b'{"items":[', b"]}"]
    _, headers, body = await proxied.send(
        request("GET", "/api/v1/configmaps", [("Host", "x"), ("Connection", "close")])
    )
    assert body == b'{"items":[]}'
    lowered = [(k.lower(), v) for k, v in headers]
    assert ("transfer-encoding", "chunked") in lowered
    assert "content-length" not in dict(lowered)
    assert [h for h in passed(headers) if h[0].lower() != "transfer-encoding"] == [
        ("Content-Type", "application/json"),
        ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ]
