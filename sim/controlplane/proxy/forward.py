"""Forwarding one client request to the apiserver, with the armed faults applied.

Every request is classified and counted. Headers (Authorization included) pass
unchanged except hop-by-hop ones; bodies pass byte for byte (no decompression).
Responses stream: a watch is relayed line by line (each line is one event) and
flushed at once, so clients see events as the apiserver sends them. Faults, in the
order they are checked: added latency, then a `fail_next` rule answers with its
status, then an armed 410 Gone answers a watch with one ERROR event, and an open
watch ends when dropped (cleanly, or by cutting the connection with `abort`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from http import HTTPStatus

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from sim.controlplane.proxy.classify import RequestInfo, classify
from sim.controlplane.proxy.state import FailRule, ProxyState, WatchStream

log = logging.getLogger("sim.controlplane.proxy")

# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp recomputes for each leg.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
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

        body = await request.read() if request.can_read_body else None
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP
        )
        if info.is_watch:
            # Events must arrive as plain lines to be relayed one by one.
            headers.popall("Accept-Encoding", None)
        url = URL(self.upstream + request.raw_path, encoded=True)
        try:
            upstream = await self.session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            record(502, "upstream-unreachable")
            message = f"proxy could not reach the apiserver: {type(exc).__name__}"
            return web.json_response(
                status_body(502, reason="BadGateway", message=message), status=502
            )

        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP or (
                    key.lower() == "content-length" and not info.is_watch
                ):
                    response.headers.add(key, value)
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
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    await response.write(line + b"\n")
            if stream.dropped.is_set() and stream.abort:
                if request.transport is not None:
                    request.transport.abort()
                return
            if buffer:
                await response.write(buffer)
            await response.write_eof()
        finally:
            for task in (read, dropped):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                        await task
            self.state.watches.discard(stream)


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
