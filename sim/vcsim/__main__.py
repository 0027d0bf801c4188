"""`python -m sim.vcsim up [--dir D] [inventory options]`: a simulator for humans and scripts.

Starts vcsim-af, prints the SDK URL, the credentials, the CA file, the control URL and
ready-to-eval `export` lines for govc, then runs until SIGINT or SIGTERM and stops it
(status 0). It exits with status 1 when the simulator dies on its own.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sim.vcsim.launcher import Vcsim

_LIVENESS_INTERVAL_S = 1.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.vcsim")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run a simulator until interrupted")
    up.add_argument("--dir", type=Path, default=None, help="workdir (datastores, CA, log)")
    up.add_argument("--datacenters", type=int, default=1)
    up.add_argument("--clusters", type=int, default=1)
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--datastores", type=int, default=2, help="datastores in dsc1")
    up.add_argument("--vms", type=int, default=0, help="powered-on VMs vm1..vmN")
    up.add_argument("--folders", type=int, default=0)
    up.add_argument("--username", default=None)
    up.add_argument("--password", default=None, help="default: random")
    up.add_argument(
        "--delay",
        action="append",
        default=[],
        metavar="METHOD=MS",
        help="delay every call of a SOAP method (repeatable)",
    )
    return parser.parse_args(argv)


def _delays(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        method, sep, ms = item.partition("=")
        if not sep or not method or not ms.isdigit():
            raise SystemExit(f"--delay wants METHOD=MS, got {item!r}")
        out[method] = int(ms)
    return out


def up(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    vcsim = Vcsim(
        workdir=args.dir,
        datacenters=args.datacenters,
        clusters=args.clusters,
        hosts=args.hosts,
        datastores=args.datastores,
        vms=args.vms,
        folders=args.folders,
        delays=_delays(args.delay),
        username=args.username,
        password=args.password,
    )
    try:
        vcsim.start()
        _describe(vcsim)
        while not stop.wait(_LIVENESS_INTERVAL_S):
            if not vcsim.running():
                print(f"error: vcsim-af exited; see {vcsim.log_path}", file=sys.stderr)
                return 1
        print("stopping vcsim", flush=True)
        return 0
    finally:
        vcsim.stop()


def _describe(vcsim: Vcsim) -> None:
    lines = [
        f"vcsim ready in {vcsim.startup_seconds:.1f}s",
        f"  url:       {vcsim.url}",
        f"  username:  {vcsim.username}",
        f"  password:  {vcsim.password}",
        f"  ca file:   {vcsim.ca_file}",
        f"  control:   {vcsim.control_url}",
        f"  log:       {vcsim.log_path}",
        "govc environment:",
        *(f"export {key}={shlex.quote(value)}" for key, value in vcsim.govc_env().items()),
        "(Ctrl-C to stop)",
    ]
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "up":
        return up(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
