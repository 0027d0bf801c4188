"""`python -m sim.controlplane up [--dir D]`: a control plane for humans and scripts.

Starts etcd, kube-apiserver and the fault proxy, writes the kubeconfigs into D (a
temporary folder by default), prints their paths and the URLs, then runs until
SIGINT or SIGTERM and tears everything down. It also stops (exit status 1) when one
of the processes dies, saying which, so a script never talks to half a cluster.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sim.controlplane.controlplane import DEFAULT, ControlPlane

_LIVENESS_INTERVAL_S = 1.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.controlplane")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run a control plane until interrupted")
    up.add_argument("--dir", type=Path, default=None, help="workdir for kubeconfigs, certs, logs")
    up.add_argument(
        "--crd",
        type=Path,
        action="append",
        default=None,
        help="CRD file or folder to install (repeatable); default: external CRDs + config/crd",
    )
    up.add_argument("--no-crds", action="store_true", help="install no CRDs")
    return parser.parse_args(argv)


def up(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    crd_paths = [] if args.no_crds else (args.crd if args.crd else DEFAULT)
    control_plane = ControlPlane(args.dir, crd_paths, quiet=True)
    try:
        control_plane.start()
        _describe(control_plane)
        while not stop.wait(_LIVENESS_INTERVAL_S):
            if not control_plane.running():
                print("error: a control plane process exited; see logs/", file=sys.stderr)
                return 1
        print("stopping control plane", flush=True)
        return 0
    finally:
        control_plane.stop()


def _describe(cp: ControlPlane) -> None:
    lines = [
        f"control plane ready in {cp.startup_seconds:.1f}s",
        f"server (fault proxy)      {cp.server}",
        f"apiserver (direct)        {cp.apiserver_url}",
        f"proxy control API         {cp.proxy_control_url}",
        f"CA file                   {cp.ca_file}",
        f"admin kubeconfig          {cp.admin_kubeconfig}",
        f"direct admin kubeconfig   {cp.direct_admin_kubeconfig}",
        f"logs                      {cp.workdir / 'logs'}",
        f"pids                      {' '.join(str(pid) for pid in cp.pids())}",
        f"export KUBECONFIG={cp.admin_kubeconfig}",
        "running until SIGINT/SIGTERM",
    ]
    print("\n".join(lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "up":
        return up(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
