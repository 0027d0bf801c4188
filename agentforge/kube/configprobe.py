"""Run kubernetes_asyncio's configuration loaders in a child process; print the facts.

Why a child process: importing `kubernetes_asyncio` imports its whole generated
client (about 40 MB of resident memory for model classes the operator never uses),
and the operator must cache 30,000 objects in 150 MB. The loaders are the reference
implementation of kubeconfig semantics (contexts, embedded certificate data, exec
plugins, OIDC, in-cluster service accounts), so they are used as they are, once,
in a process that exits right after; the operator keeps only the facts.

Protocol: `python -m agentforge.kube.configprobe (--kubeconfig PATH [--context C] |
--in-cluster)` writes one JSON object to stdout (`config.Probe` fields) and exits 0, or
writes a one-line reason to stderr and exits 2. The output holds credentials: it
goes over a pipe to the parent only and is never logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentforge.kube.config import Probe

__all__ = ["main"]

# A UID with no passwd entry and no HOME (an arbitrary UID in a restricted pod) has no
# home directory, and importing kubernetes_asyncio computes `Path.home() / ".kube/config"`
# as its default kubeconfig path even when KUBECONFIG is set, which raises there. The
# probe always names the file it reads, so that default is never used: the import gets
# a placeholder HOME, removed again before any loader (or exec plugin) runs.
NO_HOME = "/nonexistent"


@contextlib.contextmanager
def _placeholder_home() -> Iterator[None]:
    try:
        Path.home()
    except RuntimeError:
        os.environ["HOME"] = NO_HOME
        try:
            yield
        finally:
            del os.environ["HOME"]
    else:
        yield


# `kubernetes_asyncio.dynamic` (imported by the package) validates manifests with
# `kubernetes_validate` when that is installed (a development dependency here, through
# jsonschema: about 1 CPU second to import). The probe validates nothing, so the import
# is refused and the probe costs what it costs in the image, where it is not installed.
sys.modules.setdefault("kubernetes_validate", None)  # type: ignore[arg-type]

with _placeholder_home():
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import incluster_config, kube_config


def _read(path: str | None) -> str | None:
    return Path(path).read_text() if path else None


def _is_loader_temp_file(path: str | None) -> bool:
    """FileOrData writes embedded data to temp files deleted when the probe exits."""

    return bool(path) and path in getattr(kube_config, "_temp_files", {}).values()


async def _from_kubeconfig(path: str, context: str | None) -> Probe:

    configuration = Configuration()
    loader = await kube_config.load_kube_config(
        config_file=path,
        context=context,
        client_configuration=configuration,
        persist_config=False,
    )
    user = getattr(loader, "_user", None)  # the active user entry (loader internals)
    token_file = user.safe_get("tokenFile") if user is not None else None
    is_exec = bool(user is not None and user.safe_get("exec"))
    expiry = getattr(loader, "exec_plugin_expiry", None)
    ca = configuration.ssl_ca_cert or None
    cert = configuration.cert_file or None
    key = configuration.key_file or None
    ca_is_temp = _is_loader_temp_file(ca)
    return Probe(
        server=str(configuration.host).rstrip("/"),
        ca_file=None if ca_is_temp else ca,
        ca_pem=_read(ca) if ca_is_temp else None,
        cert_pem=_read(cert),
        key_pem=_read(key),
        verify_tls=bool(configuration.verify_ssl),
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        authorization=configuration.api_key.get("BearerToken") or None,
        token_file=str(Path(path).parent / str(token_file)) if token_file else None,
        exec_plugin=is_exec,
        expires_at=expiry.isoformat() if expiry is not None else None,
    )


def _in_cluster(token_file: str, ca_file: str) -> Probe:

    configuration = Configuration()
    incluster_config.InClusterConfigLoader(
        token_filename=token_file,
        cert_filename=ca_file,
        try_refresh_token=False,
        environ=dict(os.environ),
    ).load_and_set(configuration)
    return Probe(
        server=str(configuration.host).rstrip("/"),
        ca_file=str(configuration.ssl_ca_cert),
        ca_pem=None,
        cert_pem=None,
        key_pem=None,
        verify_tls=True,
        tls_server_name=None,
        authorization=None,  # read from token_file by the parent, which re-reads it
        token_file=token_file,
        exec_plugin=False,
        expires_at=None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentforge.kube.configprobe")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    parser.add_argument("--in-cluster", action="store_true")
    parser.add_argument("--token-file")
    parser.add_argument("--ca-file")
    args = parser.parse_args(argv)
    try:
        probe: Any
        if args.in_cluster:
            probe = _in_cluster(args.token_file, args.ca_file)
        else:
            probe = asyncio.run(_from_kubeconfig(args.kubeconfig, args.context))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"{type(exc).__name__}: {reason}", file=sys.stderr)
        return 2
    json.dump(probe, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
