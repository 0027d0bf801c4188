"""Forwarding one client request to the apiserver, with the armed faults applied.

Every request is classified and counted. The proxy is transparent: a client cannot
tell it from the apiserver, and the apiserver sees what the client sent.

- Requests: method, path and query as sent (raw, not re-encoded); every header the
  proxy does not own passes unchanged and in order, and none is added (aiohttp's
  client would add `Accept`, `Accept-Encoding`, `User-Agent` and, for a body,
  `Content-Type: application/octet-stream`: all suppressed). The proxy owns the
  hop-by-hop headers (RFC 9110 7.6.1: `Connection` and every header it names,
  `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`,
  `Upgrade`), `Proxy-Authorization`/`Proxy-Authenticate`, `Host` (the upstream
  connection's own authority) and `Expect` (it answers `100-continue` itself). A
  body with `Content-Length` goes with that length; a chunked one is streamed
  chunked. One difference aiohttp leaves: a non-GET request without any body
  framing is sent with `Content-Length: 0` (the same message, RFC 9112 6.3). No
  `Via` is added: the proxy stands in for the apiserver itself.
- Responses: status, reason and every end-to-end header as the apiserver sent them
  (aiohttp's server would add `Content-Type`, `Server` and `Date`: suppressed when
  absent upstream); bodies pass byte for byte, never decompressed (`Content-Length`
  kept, chunked stays chunked). A watch is relayed as it arrives, flushed at once;
  a watch the control API drops cleanly ends after the last whole event.

Faults, in the order they are checked: added latency, then a `fail_next` rule answers
with its status, then an armed 410 Gone answers a watch with one ERROR event, and an
open watch ends when dropped (cleanly, or by cutting the connection with `abort`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from http import HTTPStatus

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sim.controlplane.proxy.classify import RequestInfo, classify
from sim.controlplane.proxy.state import FailRule, ProxyState, WatchStream

log = logging.getLogger("sim.controlplane.proxy")

# Headers the proxy owns (see the module doc); those named by `Connection` are added
# per message.
_OWNED = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Expect",
    )
)
# What aiohttp's client adds on its own unless told not to.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# What aiohttp's server adds to a response unless present.
_SERVER_DEFAULTS = ("Content-Type", "Server", "Date")


def end_to_end(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """`headers` without the ones the proxy owns (hop-by-hop per RFC 9110 7.6.1)."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", [])
        for token in value.split(",")
        if token.strip()
    }
    return CIMultiDict(
        (k, v) for k, v in headers.items() if k.lower() not in _OWNED and k.lower() not in named
    )


class RelayedResponse(web.StreamResponse):
    """A response with exactly the upstream's headers: aiohttp's server adds
    `Content-Type`, `Server` and `Date` when absent, which the apiserver may not send."""

    def __init__(self, *, status: int, reason: str | None, headers: CIMultiDict[str]) -> None:
        super().__init__(status=status, reason=reason)
        self._upstream_names = {k.lower() for k in headers}
        for key, value in headers.items():
            self.headers.add(key, value)

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        for name in _SERVER_DEFAULTS:
            if name.lower() not in self._upstream_names:
                self.headers.popall(name, None)


_REASON_BY_STATUS = {
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, *, reason: str, message: str) -> dict[str, object]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class Forwarder:
    """The catch-all aiohttp handler of the proxy's client-facing port."""

    def __init__(self, *, state: ProxyState, upstream: str, session: aiohttp.ClientSession):
        self.state = state
        self.upstream = upstream.rstrip("/")
        self.session = session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        info = classify(request.method, request.path, request.query)
        identity = self.state.identity_of(request.headers.get("Authorization"))

        def record(status: int, fault: str = "") -> None:
            self.state.record(
                identity=identity,
                method=request.method,
                path=request.path,
                info=info,
                status=status,
                started=started,
                fault=fault,
            )

        if self.state.latency_s > 0:
            await asyncio.sleep(self.state.latency_s)

        rule = self.state.take_failure(info, identity)
        if rule is not None:
            record(rule.status, "fail_next")
            return _failure(rule)

        if info.is_watch and self.state.take_gone(info, identity):
            record(200, "gone")
            return await _gone(request)

        headers = end_to_end(request.headers)
        body: bytes | AsyncIterator[bytes] | None = None
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            body = _stream(request)  # sent chunked again: no Content-Length to keep
        elif request.can_read_body:
            body = await request.read()  # its Content-Length passes with the headers
        url = URL(self.upstream + request.raw_path, encoded=True)
        try:
            upstream = await self.session.request(
                request.method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=_NO_AUTO_HEADERS,
            )
        except (aiohttp.ClientError, OSError) as exc:
            record(502, "upstream-unreachable")
            message = f"proxy could not reach the apiserver: {type(exc).__name__}"
            return web.json_response(
                status_body(502, reason="BadGateway", message=message), status=502
            )

        try:
            response = RelayedResponse(
                status=upstream.status, reason=upstream.reason, headers=end_to_end(upstream.headers)
            )
            record(upstream.status)
            await response.prepare(request)
            if info.is_watch and upstream.status == 200:
                await self._relay_watch(request, response, upstream, info, identity)
            else:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
        except ConnectionResetError:
            pass  # the client hung up: nothing left to relay (checked first: aiohttp's
            # ClientConnectionResetError is both a ConnectionResetError and a ClientError)
        except aiohttp.ClientError as exc:
            # The apiserver broke off mid-body: cut the client too, never fake a clean end.
            log.info("upstream %s %s broke off: %r", request.method, request.path, exc)
            if request.transport is not None:
                request.transport.abort()
        finally:
            if info.is_watch:
                upstream.close()  # never hand a half-read watch connection back to the pool
            else:
                upstream.release()
        return response

    async def _relay_watch(
        self,
        request: web.Request,
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        info: RequestInfo,
        identity: str,
    ) -> None:
        stream = WatchStream(
            identity=identity,
            resource=info.resource,
            namespace=info.namespace,
            opened=time.time(),
        )
        self.state.watches.add(stream)
        dropped = asyncio.ensure_future(stream.dropped.wait())
        read: asyncio.Future[bytes] | None = None
        # Plain JSON lines are relayed up to the last whole event, so a clean drop ends
        # between events; an encoded stream (gzip) is relayed as it comes.
        lines = "Content-Encoding" not in upstream.headers
        buffer = b""
        try:
            while True:
                read = asyncio.ensure_future(upstream.content.readany())
                await asyncio.wait({read, dropped}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    break  # dropped by the control API
                chunk = read.result()
                if not chunk:
                    break  # the apiserver ended the watch
                if not lines:
                    await response.write(chunk)
                    continue
                buffer += chunk
                whole, newline, buffer = buffer.rpartition(b"\n")
                if newline:
                    await response.write(whole + newline)
            if stream.dropped.is_set():
                if stream.abort and request.transport is not None:
                    request.transport.abort()
                    return
            elif buffer:
                await response.write(buffer)  # the apiserver's own end: every byte it sent
            await response.write_eof()
        finally:
            for task in (read, dropped):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                        await task
            self.state.watches.discard(stream)


async def _stream(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_any():
        yield chunk


def _failure(rule: FailRule) -> web.Response:
    reason = _REASON_BY_STATUS.get(rule.status, HTTPStatus(rule.status).phrase.replace(" ", ""))
    body = status_body(rule.status, reason=reason, message="fault injected by the test proxy")
    headers = {}
    if rule.status in (429, 503):
        headers["Retry-After"] = str(rule.retry_after)
    return web.json_response(body, status=rule.status, headers=headers)


async def _gone(request: web.Request) -> web.StreamResponse:
    """Answer a watch the way the apiserver does when its resourceVersion is too old."""
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    await response.prepare(request)
    event = {
        "type": "ERROR",
        "object": status_body(
            410,
            reason="Expired",
            message="too old resource version (fault injected by the test proxy)",
        ),
    }
    await response.write(json.dumps(event).encode() + b"\n")
    await response.write_eof()
    return response
