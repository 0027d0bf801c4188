"""Entry point of the fault proxy process.

    python -m sim.controlplane.proxy --upstream https://127.0.0.1:6443 \
        --ca-file ca.crt --cert-file proxy.crt --key-file proxy.key \
        --port 7443 --control-port 7444

Serves HTTPS on `--port` (certificate from the control plane's CA) and forwards to
`--upstream`, verifying the apiserver's certificate with `--ca-file`. The control
API listens on plain HTTP, loopback only. Exits cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

from sim.controlplane.proxy.control_api import make_app
from sim.controlplane.proxy.forward import Forwarder
from sim.controlplane.proxy.state import ProxyState

log = logging.getLogger("sim.controlplane.proxy")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.controlplane.proxy")
    parser.add_argument("--upstream", required=True, help="apiserver URL, https://host:port")
    parser.add_argument("--ca-file", type=Path, required=True)
    parser.add_argument("--cert-file", type=Path, required=True)
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--log-size", type=int, default=10_000, help="request log entries kept")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    state = ProxyState(log_size=args.log_size)
    client_tls = ssl.create_default_context(cafile=str(args.ca_file))
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(str(args.cert_file), str(args.key_file))

    connector = aiohttp.TCPConnector(ssl=client_tls, limit=0)  # watches hold connections
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,  # bodies pass through byte for byte
        skip_auto_headers=("User-Agent", "Accept-Encoding"),  # only the client's headers
        timeout=aiohttp.ClientTimeout(total=None, connect=10),
    )
    forwarder = Forwarder(state=state, upstream=args.upstream, session=session)
    front = web.Application(client_max_size=64 * 1024 * 1024)
    front.router.add_route("*", "/{tail:.*}", forwarder.handle)

    # handler_cancellation: a client that hangs up ends its forwarded watch at once.
    front_runner = web.AppRunner(
        front, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
    )
    control_runner = web.AppRunner(make_app(state), access_log=None, shutdown_timeout=2.0)
    await front_runner.setup()
    await control_runner.setup()
    await web.TCPSite(front_runner, args.host, args.port, ssl_context=server_tls).start()
    await web.TCPSite(control_runner, "127.0.0.1", args.control_port).start()
    log.info(
        "proxy listening on https://%s:%d -> %s, control on http://127.0.0.1:%d",
        args.host,
        args.port,
        args.upstream,
        args.control_port,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        state.drop_watches(resource=None, identity=None, abort=False)
        await front_runner.cleanup()
        await control_runner.cleanup()
        await session.close()
    log.info("proxy stopped")


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(_parse(argv)))


if __name__ == "__main__":
    main()
