"""`python -m agentforge {run, manifests, check, version}`: the operator's command line.

Exit codes are part of the contract with Kubernetes and with scripts: 0 for a clean
stop (SIGTERM included), 1 when the process must be restarted (lost the lease, a
fatal error), 2 for a usage or configuration error (a bad flag or environment
variable), which is reported as one readable message without a traceback.

Heavier modules (the app, the manifest generator) are imported only by the
subcommand that needs them, so `version` and `--help` stay fast and cannot fail on
an unrelated import.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from agentforge import __version__, settings

__all__ = ["EXIT_FATAL", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentforge",
        description="Supply vSphere VM capacity for HyperShift Agent-platform NodePools.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run the operator",
        description="Run the operator. Every flag can also be set as an environment "
        f"variable {settings.ENV_PREFIX}<FLAG> (dashes become underscores); flags win.",
    )
    settings.add_run_arguments(run)

    manifests = commands.add_parser(
        "manifests", help="write the CRDs and RBAC generated from the code"
    )
    manifests.add_argument("--output", type=Path, required=True, metavar="DIR")
    manifests.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the files in DIR differ from the code",
    )

    # Listed for --help only: `main` hands `check ...` to `agentforge.check` unparsed.
    commands.add_parser("check", help="would this pool work? (see `agentforge check --help`)")

    commands.add_parser("version", help="print the version, Python and platform")
    return parser


def _version() -> int:
    print(f"agentforge {__version__}")
    print(f"python {platform.python_version()} ({platform.python_implementation()})")
    print(f"platform {platform.platform()}")
    return EXIT_OK


def _manifests(*, output: Path, check: bool) -> int:
    from agentforge import manifests  # noqa: PLC0415 (only this subcommand needs it)

    return manifests.main(output=output, check=check)


def _run(args: argparse.Namespace) -> int:
    try:
        config = settings.load(args, environ=os.environ)
        settings.require_secret_namespaces(config)
    except settings.SettingsError as exc:
        print(f"agentforge run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from agentforge import app  # noqa: PLC0415 (keep `version` free of the runtime)

    return app.main(config)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from agentforge import check  # noqa: PLC0415 (only this subcommand needs it)

        return check.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "version":
        return _version()
    if args.command == "manifests":
        return _manifests(output=args.output, check=args.check)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
