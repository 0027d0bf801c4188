"""A small HTTP forward proxy on loopback, as a cluster-wide egress proxy is to the operator.

`async with ForwardProxy() as proxy:` listens on `proxy.url` (`http://127.0.0.1:<port>`)
and serves what clients send to an `HTTPS_PROXY`/`HTTP_PROXY`:

- `CONNECT host:port` opens a TCP tunnel (TLS stays end to end between the client
  and the origin, as through squid); `GET http://host:port/path` (absolute form) is
  forwarded once, with `Connection: close`;
- `routes` maps host names to `(address, port)`, so a test can use a name that no
  DNS knows (`images.example.test`): reachable through the proxy only, which is how
  a test tells that a request went through it;
- `require_auth` (a `Proxy-Authorization` value) answers 407 to anyone else;
- `requests` records every request (`method`, `target`, whether it was authorised)
  in order, so a test can assert that a download used the proxy, or did not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

__all__ = ["ForwardProxy", "ProxyRequest"]

_MAX_HEADER = 64 * 1024


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    method: str
    target: str
    """`host:port` of a CONNECT, the absolute URL of a forwarded request."""
    authorised: bool


class ForwardProxy:
    def __init__(
        self,
        *,
        routes: Mapping[str, tuple[str, int]] | None = None,
        require_auth: str | None = None,
    ) -> None:
        self.routes = dict(routes or {})
        self.require_auth = require_auth
        self.requests: list[ProxyRequest] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _where(self, host: str, port: int) -> tuple[str, int]:
        return self.routes.get(host.lower(), (host, port))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEADER:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers = [line for line in lines[1:] if line]
        auth = next(
            (h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("proxy-auth")),
            None,
        )
        authorised = self.require_auth is None or auth == self.require_auth
        self.requests.append(ProxyRequest(method=method, target=target, authorised=authorised))
        if not authorised:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            await self._tunnel(reader, writer, *self._where(host.strip("[]"), int(port)))
        else:
            await self._forward(reader, writer, method, target, headers)

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: list[str],
    ) -> None:
        parts = urlsplit(target)
        host, port = self._where(parts.hostname or "", parts.port or 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        kept = [
            h for h in headers if not h.lower().startswith(("proxy-", "connection:", "keep-alive:"))
        ]
        request = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""])
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        try:
            up_writer.write(request.encode("latin-1"))
            await up_writer.drain()
            await _pipe(up_reader, writer)
        finally:
            up_writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(64 * 1024):
            sink.write(chunk)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.write_eof()
