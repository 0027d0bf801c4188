"""One watch stream: newline-delimited JSON events read from an open HTTP response.

A watch is not retried by the client: the caller (the informer) owns the decision of
where to resume, because only it knows the last resourceVersion it processed. The
stream therefore reports exactly what happened: events as they arrive, a clean end
when the server closes it (`timeoutSeconds` elapsed), `errors.Gone` and friends when
the server sends an `ERROR` event, `errors.TransportError` when the connection tears.

Use it as `async with client.watch(...) as stream: async for event in stream:` so
the connection is released however the loop ends.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any, Self

import aiohttp

from agentforge.kube import errors

__all__ = ["MAX_EVENT_BYTES", "EventType", "WatchEvent", "WatchStream"]

# etcd caps objects at 1.5 MiB; JSON escaping and the envelope can double that.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A parsed watch event; `object` is the raw JSON dict (a BOOKMARK carries only
    `metadata.resourceVersion`)."""

    type: EventType
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


class WatchStream:
    """An open watch; iterate it inside `async with`."""

    def __init__(
        self,
        *,
        open_response: Callable[[], Awaitable[aiohttp.ClientResponse]],
        description: str,
    ) -> None:
        self._open_response = open_response
        self._description = description
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> Self:
        self._response = await self._open_response()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._response is None:
            raise StopAsyncIteration
        while True:
            try:
                line = await self._response.content.readline(max_line_length=MAX_EVENT_BYTES)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise errors.TransportError(
                    f"watch {self._description} broke: {type(exc).__name__}: {exc}"
                ) from exc
            except ValueError as exc:  # LineTooLong
                raise errors.TransportError(f"watch {self._description}: {exc}") from exc
            if not line:
                raise StopAsyncIteration  # the server ended the watch (timeoutSeconds)
            if line.strip():
                return self._parse(line)

    def _parse(self, line: bytes) -> WatchEvent:
        try:
            raw = json.loads(line)
            kind = str(raw["type"])
            obj = raw["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.TransportError(
                f"watch {self._description}: undecodable event ({type(exc).__name__})"
            ) from exc
        if kind == "ERROR":
            raise errors.from_status(obj if isinstance(obj, dict) else {})
        try:
            event_type = EventType(kind)
        except ValueError as exc:
            raise errors.TransportError(
                f"watch {self._description}: unknown event type {kind!r}"
            ) from exc
        return WatchEvent(type=event_type, object=obj)
