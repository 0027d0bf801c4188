"""A small blocking JSON client for set-up work against the apiserver and the proxy.

`ControlPlane` is synchronous on purpose (session fixtures, the CLI, and code in an
event loop all call it), so its own requests use `urllib` rather than an event
loop. TLS is always verified against the control plane's CA. Tokens travel only in
the Authorization header and never appear in errors.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any  # decoded JSON, or the raw text when the body is not JSON


class RestError(RuntimeError):
    """An unexpected HTTP status; carries the status and the server's message."""

    def __init__(self, method: str, url: str, response: Response) -> None:
        message = response.body.get("message") if isinstance(response.body, dict) else None
        super().__init__(f"{method} {url} -> {response.status}: {message or response.body!r}")
        self.status = response.status
        self.response = response


class RestClient:
    """JSON over HTTP(S) to one base URL with an optional bearer token."""

    def __init__(self, base_url: str, *, ca_file: Path | None = None, token: str | None = None):
        self.base_url = base_url.rstrip("/")
        self._token = token
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if ca_file:
            context = ssl.create_default_context(cafile=str(ca_file))
            handlers.append(urllib.request.HTTPSHandler(context=context))
        # No environment proxies: everything here is loopback.
        self._opener = urllib.request.build_opener(*handlers)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        expect: tuple[int, ...] = (200, 201),
    ) -> Response:
        """Send one request; raise RestError unless the status is in `expect`."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with self._opener.open(req, timeout=_TIMEOUT) as resp:
                response = Response(resp.status, _decode(resp.read()))
        except urllib.error.HTTPError as err:
            response = Response(err.code, _decode(err.read()))
        if response.status not in expect:
            raise RestError(method, url, response)
        return response

    def get(self, path: str, *, expect: tuple[int, ...] = (200,)) -> Response:
        return self.request("GET", path, expect=expect)

    def post(self, path: str, body: Any, *, expect: tuple[int, ...] = (200, 201)) -> Response:
        return self.request("POST", path, body=body, expect=expect)

    def status_of(self, path: str) -> int:
        """The HTTP status of a GET, whatever it is (for readiness probes)."""
        return self.request("GET", path, expect=tuple(range(100, 600))).status


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
