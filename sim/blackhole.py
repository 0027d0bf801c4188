"""`BlackHole`: a vCenter address that accepts TCP connections and never answers.

What a dead load balancer or a firewall that drops replies looks like to a client:
the TCP connect succeeds, then nothing ever comes back (no TLS handshake, no HTTP).
It runs in the caller's event loop and counts what it saw, so a test can tell "a
login is still hanging" (`open` > 0) from "the client gave up" (`closed_by_peer`).

    async with BlackHole() as hole:
        hole.server          # "127.0.0.1:<port>", for a credentials Secret
        await hole.wait_connected(1, within=10)
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

__all__ = ["BlackHole"]


class _Silent(asyncio.Protocol):
    def __init__(self, hole: BlackHole) -> None:
        self._hole = hole
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._hole.accepted += 1
        self._hole.connections.add(self)
        self._hole.changed.set()

    def data_received(self, data: bytes) -> None:
        self._hole.bytes_received += len(data)  # read and dropped: never a reply

    def connection_lost(self, exc: Exception | None) -> None:
        self._hole.connections.discard(self)
        if not self._hole.stopping:
            self._hole.closed_by_peer += 1
        self._hole.changed.set()


class BlackHole:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.accepted = 0
        self.closed_by_peer = 0
        self.bytes_received = 0
        self.stopping = False
        self.connections: set[_Silent] = set()
        self.changed = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def open(self) -> int:
        """Connections a client still holds (a login still hanging)."""
        return len(self.connections)

    async def start(self) -> Self:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Silent(self), self.host, 0
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        self.stopping = True
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def wait_connected(self, count: int = 1, *, within: float) -> None:
        """Until `count` connections were accepted in all (TimeoutError at `within`)."""
        async with asyncio.timeout(within):
            while self.accepted < count:
                self.changed.clear()
                await self.changed.wait()

    async def wait_given_up(self, count: int = 1, *, within: float) -> None:
        """Until clients closed `count` connections themselves (their timeouts)."""
        async with asyncio.timeout(within):
            while self.closed_by_peer < count:
                self.changed.clear()
                await self.changed.wait()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
