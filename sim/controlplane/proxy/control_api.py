"""The proxy's control port: fault injection, counters, identities, token webhook.

Plain HTTP on loopback, JSON in and out; `ProxyControl` is its client. The routes:

    GET  /healthz                 200 when the proxy runs
    POST /identities              {sha256, name, username, uid, groups, authenticate}
    POST /authenticate            TokenReview webhook (authentication.k8s.io/v1)
    GET  /counts                  [{identity, verb, resource, namespace, status, count}]
    GET  /requests?identity=&limit=   the bounded request log, oldest first
    POST /counts/reset            forget counts and the request log
    GET  /watches                 {open: n, streams: [...]}
    POST /faults/drop-watches     {resource?, identity?, abort?} -> {dropped: n}
    POST /faults/gone-next-watch  {resource?, identity?}
    POST /faults/fail-next        {n, status, verb?, resource?, identity?, retry_after?}
    POST /faults/latency          {ms}
    POST /faults/clear            clear every armed fault and the latency
    GET  /faults                  {latency_ms, fail_next: [...], gone_next_watch: [...]}

The token webhook lets the apiserver accept users minted after it started (its
static token file is read once): it vouches only for identities registered with
`authenticate: true`, never for admin or ServiceAccount tokens.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from sim.controlplane.proxy.state import FailRule, GoneRule, Identity, ProxyState

STATE_KEY = web.AppKey("state", ProxyState)


def _state(request: web.Request) -> ProxyState:
    return request.app[STATE_KEY]


async def _json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    body = await request.json()
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def register_identity(request: web.Request) -> web.Response:
    body = await _json(request)
    digest = str(body["sha256"])
    if len(digest) != 64:
        raise web.HTTPBadRequest(text="sha256 must be the hex SHA-256 of the token")
    identity = Identity(
        name=str(body["name"]),
        username=str(body.get("username") or body["name"]),
        uid=str(body.get("uid") or body["name"]),
        groups=tuple(str(g) for g in body.get("groups", ())),
        authenticate=bool(body.get("authenticate", False)),
    )
    _state(request).register(digest, identity)
    return web.json_response({"registered": identity.name})


async def authenticate(request: web.Request) -> web.Response:
    review = await _json(request)
    token = str(review.get("spec", {}).get("token", ""))
    found = _state(request).authenticate(token) if token else None
    status: dict[str, Any] = {"authenticated": False}
    if found is not None:
        status = {
            "authenticated": True,
            "user": {"username": found.username, "uid": found.uid, "groups": list(found.groups)},
        }
    return web.json_response(
        {
            "apiVersion": review.get("apiVersion", "authentication.k8s.io/v1"),
            "kind": "TokenReview",
            "status": status,
        }
    )


async def counts(request: web.Request) -> web.Response:
    rows = [
        {
            "identity": identity,
            "verb": verb,
            "resource": resource,
            "namespace": namespace,
            "status": status,
            "count": n,
        }
        for (identity, verb, resource, namespace, status), n in _state(request).counts.items()
    ]
    return web.json_response(rows)


async def requests(request: web.Request) -> web.Response:
    identity = request.query.get("identity")
    records = [r for r in _state(request).log if identity is None or r.identity == identity]
    limit = request.query.get("limit")
    if limit is not None:
        records = records[-int(limit) :]
    return web.json_response([r.to_json() for r in records])


async def reset_counts(request: web.Request) -> web.Response:
    _state(request).reset_counts()
    return web.json_response({"reset": True})


async def watches(request: web.Request) -> web.Response:
    streams = [s.to_json() for s in _state(request).watches]
    return web.json_response({"open": len(streams), "streams": streams})


async def drop_watches(request: web.Request) -> web.Response:
    body = await _json(request)
    dropped = _state(request).drop_watches(
        resource=body.get("resource"),
        identity=body.get("identity"),
        abort=bool(body.get("abort", False)),
    )
    return web.json_response({"dropped": dropped})


async def gone_next_watch(request: web.Request) -> web.Response:
    body = await _json(request)
    _state(request).gone_rules.append(
        GoneRule(resource=body.get("resource"), identity=body.get("identity"))
    )
    return web.json_response({"armed": True})


async def fail_next(request: web.Request) -> web.Response:
    body = await _json(request)
    n = int(body.get("n", 1))
    status = int(body.get("status", 500))
    if n < 1 or not 400 <= status <= 599:
        raise web.HTTPBadRequest(text="need n >= 1 and an error status (4xx/5xx)")
    _state(request).fail_rules.append(
        FailRule(
            remaining=n,
            status=status,
            verb=body.get("verb"),
            resource=body.get("resource"),
            identity=body.get("identity"),
            retry_after=int(body.get("retry_after", 1)),
        )
    )
    return web.json_response({"armed": n})


async def latency(request: web.Request) -> web.Response:
    body = await _json(request)
    ms = float(body.get("ms", 0))
    if ms < 0:
        raise web.HTTPBadRequest(text="latency must be >= 0 ms")
    _state(request).latency_s = ms / 1000.0
    return web.json_response({"latency_ms": ms})


async def clear_faults(request: web.Request) -> web.Response:
    _state(request).clear_faults()
    return web.json_response({"cleared": True})


async def faults(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response(
        {
            "latency_ms": state.latency_s * 1000.0,
            "fail_next": [asdict(rule) for rule in state.fail_rules],
            "gone_next_watch": [asdict(rule) for rule in state.gone_rules],
        }
    )


def make_app(state: ProxyState) -> web.Application:
    app = web.Application()
    app[STATE_KEY] = state
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/identities", register_identity)
    app.router.add_post("/authenticate", authenticate)
    app.router.add_get("/counts", counts)
    app.router.add_post("/counts/reset", reset_counts)
    app.router.add_get("/requests", requests)
    app.router.add_get("/watches", watches)
    app.router.add_post("/faults/drop-watches", drop_watches)
    app.router.add_post("/faults/gone-next-watch", gone_next_watch)
    app.router.add_post("/faults/fail-next", fail_next)
    app.router.add_post("/faults/latency", latency)
    app.router.add_post("/faults/clear", clear_faults)
    app.router.add_get("/faults", faults)
    return app
