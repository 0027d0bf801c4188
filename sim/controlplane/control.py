"""`ProxyControl`: the async client of the fault proxy's control port.

Each call opens its own short aiohttp session, so one `ProxyControl` works from any
event loop (pytest gives each test its own) and holds nothing that needs closing.
`reset_blocking()` does the between-tests clean-up from synchronous code.

Identities in counts and the request log: `admin`, `system:serviceaccount:<ns>:<name>`,
the user name given to `user_kubeconfig`, `unknown` for an unregistered token and
`anonymous` without one.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from sim.controlplane.proxy.state import RequestRecord, token_digest
from sim.controlplane.rest import RestClient


@dataclass(frozen=True, slots=True)
class CountRow:
    identity: str
    verb: str
    resource: str
    namespace: str
    status: int
    count: int


class ProxyControl:
    """Fault injection and request counters of one running proxy."""

    def __init__(self, control_url: str) -> None:
        self.url = control_url.rstrip("/")

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.url + path, json=body) as response,
        ):
            if response.status != 200:
                text = await response.text()
                raise RuntimeError(f"proxy control {method} {path} -> {response.status}: {text}")
            return await response.json()

    # --- counters ----------------------------------------------------------------
    async def count_rows(self, identity: str | None = None) -> list[CountRow]:
        """Counts by (identity, verb, resource, namespace, status)."""
        rows = [CountRow(**row) for row in await self._call("GET", "/counts")]
        return [r for r in rows if identity is None or r.identity == identity]

    async def counts(self, identity: str | None = None) -> dict[tuple[str, str], int]:
        """`{(verb, resource): n}` summed over namespaces and statuses."""
        total: Counter[tuple[str, str]] = Counter()
        for row in await self.count_rows(identity):
            total[(row.verb, row.resource)] += row.count
        return dict(total)

    async def requests(
        self, identity: str | None = None, *, limit: int | None = None
    ) -> list[RequestRecord]:
        """The bounded request log (oldest first), optionally for one identity."""
        query: dict[str, str] = {}
        if identity is not None:
            query["identity"] = identity
        if limit is not None:
            query["limit"] = str(limit)
        path = "/requests" + ("?" + urllib.parse.urlencode(query) if query else "")
        return [RequestRecord(**row) for row in await self._call("GET", path)]

    async def reset_counts(self) -> None:
        await self._call("POST", "/counts/reset")

    # --- watches -----------------------------------------------------------------
    async def open_watches(self, resource: str | None = None) -> int:
        """How many watch streams are open through the proxy now (optionally for one resource)."""
        streams = (await self._call("GET", "/watches"))["streams"]
        return sum(1 for s in streams if resource is None or s["resource"] == resource)

    async def wait_open_watches(
        self, at_least: int = 1, *, resource: str | None = None, within: float = 10.0
    ) -> int:
        """Wait until at least `at_least` watches are open; fail after `within` seconds."""
        n = 0
        try:
            async with asyncio.timeout(within):
                while True:  # polls another process: no Event to wait on
                    n = await self.open_watches(resource)
                    if n >= at_least:
                        break
                    await asyncio.sleep(0.02)
        except TimeoutError:
            raise TimeoutError(
                f"only {n} watch(es) on {resource or 'any resource'} open after "
                f"{within:.0f}s, wanted {at_least}"
            ) from None
        return n

    # --- faults ------------------------------------------------------------------
    async def drop_watches(
        self, *, resource: str | None = None, identity: str | None = None, abort: bool = False
    ) -> int:
        """End open watch streams now; `abort` cuts the connection instead of a clean end.

        Returns how many were dropped.
        """
        body = {"resource": resource, "identity": identity, "abort": abort}
        return int((await self._call("POST", "/faults/drop-watches", body))["dropped"])

    async def gone_next_watch(
        self, resource: str | None = None, *, identity: str | None = None
    ) -> None:
        """The next matching watch gets one `ERROR` event with a 410 Expired Status, then ends."""
        await self._call(
            "POST", "/faults/gone-next-watch", {"resource": resource, "identity": identity}
        )

    async def fail_next(
        self,
        n: int,
        status: int = 500,
        verb: str | None = None,
        resource: str | None = None,
        *,
        identity: str | None = None,
        retry_after: int = 1,
    ) -> None:
        """Answer the next `n` matching requests with `status` (429/503 carry Retry-After)."""
        body = {
            "n": n,
            "status": status,
            "verb": verb,
            "resource": resource,
            "identity": identity,
            "retry_after": retry_after,
        }
        await self._call("POST", "/faults/fail-next", body)

    async def set_latency(self, ms: float) -> None:
        """Delay every forwarded request by `ms` milliseconds (0 turns it off)."""
        await self._call("POST", "/faults/latency", {"ms": ms})

    async def faults(self) -> dict[str, Any]:
        """What is armed now: `latency_ms`, `fail_next` rules, `gone_next_watch` rules."""
        return dict(await self._call("GET", "/faults"))

    async def clear_faults(self) -> None:
        """Disarm every fault and remove latency (open watches stay open)."""
        await self._call("POST", "/faults/clear")

    # --- synchronous helpers (fixtures, ControlPlane) ------------------------------
    def reset_blocking(self) -> None:
        """Clear faults and counters without an event loop (between tests)."""
        client = RestClient(self.url)
        client.post("/faults/clear", {})
        client.post("/counts/reset", {})

    def register_blocking(
        self,
        *,
        token: str,
        name: str,
        username: str,
        uid: str,
        groups: tuple[str, ...] = (),
        authenticate: bool = False,
    ) -> None:
        """Tell the proxy whose token this is (it keeps only the token's SHA-256)."""
        RestClient(self.url).post(
            "/identities",
            {
                "sha256": token_digest(token),
                "name": name,
                "username": username,
                "uid": uid,
                "groups": list(groups),
                "authenticate": authenticate,
            },
        )
