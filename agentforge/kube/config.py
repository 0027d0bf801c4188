"""Where the API server is and how to authenticate to it, loaded once at start.

kubernetes_asyncio's loaders *read* the configuration (kubeconfig contexts, embedded
certificate data, exec plugins, the in-cluster service account) in a short-lived
child process (`agentforge.kube.configprobe`: importing kubernetes_asyncio costs
~40 MB of resident memory the operator cannot spare); `agentforge.kube.client` does
the HTTP itself with raw JSON.

Order of sources, as client-go's `clientcmd` does it: an explicit kubeconfig path,
else `$KUBECONFIG` (first entry), else the in-cluster service account, else
`~/.kube/config`.

Credentials are behind a `TokenSource` so they can change while the process runs:
the in-cluster token (and a kubeconfig `tokenFile`) is a projected file the kubelet
rotates, so it is re-read every `refresh_every` seconds and whenever the server
answers 401; exec-plugin tokens are renewed by probing again when they expire.
Tokens and key material never appear in `repr`, logs or exceptions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypedDict, cast

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ExecPluginToken",
    "FileToken",
    "Probe",
    "StaticToken",
    "TokenSource",
    "load_config",
]

SERVICE_TOKEN_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
SERVICE_CA_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
DEFAULT_KUBECONFIG = Path("~/.kube/config")
PROBE_TIMEOUT = 60.0


class Probe(TypedDict):
    """What `agentforge.kube.configprobe` reports (credentials included: never log it)."""

    server: str
    ca_file: str | None  # a path that outlives the probe (not a loader temp file)
    ca_pem: str | None  # embedded CA data
    cert_pem: str | None
    key_pem: str | None
    verify_tls: bool
    tls_server_name: str | None
    authorization: str | None  # the Authorization header value
    token_file: str | None  # re-read it periodically (rotating tokens)
    exec_plugin: bool  # the token comes from an exec plugin: probe again to renew
    expires_at: str | None  # RFC 3339, exec plugin credentials only


class ConfigError(Exception):
    """No usable cluster configuration was found; the message says where we looked."""


class TokenSource(Protocol):
    """Yields the current `Authorization` header value (or None for none)."""

    async def authorization(self) -> str | None: ...

    def invalidate(self) -> None:
        """Forget the cached credential: the server rejected it (401)."""


@dataclass(slots=True)
class StaticToken:
    """A credential that never changes (kubeconfig `token`, basic auth)."""

    header: str = field(repr=False)

    async def authorization(self) -> str | None:
        return self.header

    def invalidate(self) -> None:
        return None


@dataclass(slots=True)
class FileToken:
    """A bearer token read from a file the platform rotates (projected SA token)."""

    path: Path
    refresh_every: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _header: str | None = field(default=None, init=False, repr=False)
    _read_at: float = field(default=0.0, init=False, repr=False)

    async def authorization(self) -> str | None:
        now = self.clock()
        if self._header is None or now - self._read_at >= self.refresh_every:
            content = (await asyncio.to_thread(self.path.read_text)).strip()
            if not content:
                raise ConfigError(f"token file {self.path} is empty")
            self._header = f"Bearer {content}"
            self._read_at = now
        return self._header

    def invalidate(self) -> None:
        self._header = None


@dataclass(slots=True)
class ExecPluginToken:
    """A token from a kubeconfig exec plugin, renewed by probing again when it expires."""

    kubeconfig: Path
    context: str | None
    header: str | None = field(repr=False)
    expires_at: datetime | None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    async def authorization(self) -> str | None:
        async with self._lock:
            if self.header is None or (
                self.expires_at is not None and self.clock() >= self.expires_at
            ):
                probe = await _probe(["--kubeconfig", str(self.kubeconfig)], context=self.context)
                self.header = probe["authorization"]
                self.expires_at = _parse_time(probe["expires_at"])
        return self.header

    def invalidate(self) -> None:
        self.header = None


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything `client.KubeClient` needs to reach and authenticate to one apiserver."""

    server: str
    ca_file: str | None = None
    ca_pem: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)
    verify_tls: bool = True
    tls_server_name: str | None = None
    token: TokenSource | None = field(default=None, repr=False)
    source: str = ""  # where this came from, for logs ("kubeconfig /p context c")


async def load_config(
    *,
    kubeconfig: Path | str | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClusterConfig:
    """Load the cluster configuration from the first source that exists (see module doc)."""
    env = os.environ if environ is None else environ
    source = _choose_source(kubeconfig=kubeconfig, env=env)
    if source is None:
        return await _in_cluster()
    return await _from_kubeconfig(source, context=context)


def _choose_source(*, kubeconfig: Path | str | None, env: Mapping[str, str]) -> Path | None:
    """The kubeconfig to read, or None for the in-cluster service account."""
    if kubeconfig is not None:
        path = Path(kubeconfig)
    elif from_env := env.get("KUBECONFIG", "").split(os.pathsep)[0]:
        path = Path(from_env)
    elif env.get(SERVICE_HOST_ENV) and SERVICE_TOKEN_FILE.exists():
        return None
    else:
        try:
            path = DEFAULT_KUBECONFIG.expanduser()
        except RuntimeError:  # no HOME and no passwd entry: there is no ~
            raise ConfigError(
                "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG or run in "
                f"a pod with a service account ({DEFAULT_KUBECONFIG}: no home directory)"
            ) from None
        if not path.exists():
            raise ConfigError(
                "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, run in a "
                f"pod with a service account, or create {path}"
            )
    if not path.exists():
        raise ConfigError(f"kubeconfig {path} does not exist")
    return path


async def _in_cluster() -> ClusterConfig:
    probe = await _probe(
        [
            "--in-cluster",
            "--token-file",
            str(SERVICE_TOKEN_FILE),
            "--ca-file",
            str(SERVICE_CA_FILE),
        ],
        context=None,
    )
    return ClusterConfig(
        server=probe["server"],
        ca_file=probe["ca_file"],
        token=FileToken(SERVICE_TOKEN_FILE),
        source="in-cluster service account",
    )


async def _from_kubeconfig(path: Path, *, context: str | None) -> ClusterConfig:
    probe = await _probe(["--kubeconfig", str(path)], context=context)
    token: TokenSource | None = None
    if probe["token_file"]:
        token = FileToken(Path(probe["token_file"]))
    elif probe["exec_plugin"]:
        token = ExecPluginToken(
            kubeconfig=path,
            context=context,
            header=probe["authorization"],
            expires_at=_parse_time(probe["expires_at"]),
        )
    elif probe["authorization"]:
        token = StaticToken(probe["authorization"])
    return ClusterConfig(
        server=probe["server"],
        ca_file=probe["ca_file"],
        ca_pem=probe["ca_pem"],
        cert_pem=probe["cert_pem"],
        key_pem=probe["key_pem"],
        verify_tls=probe["verify_tls"],
        tls_server_name=probe["tls_server_name"],
        token=token,
        source=f"kubeconfig {path}" + (f" context {context}" if context else ""),
    )


async def _probe(args: Sequence[str], *, context: str | None) -> Probe:
    argv = [sys.executable, "-m", "agentforge.kube.configprobe", *args]
    if context:
        argv += ["--context", context]
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ConfigError(f"loading the configuration took over {PROBE_TIMEOUT:.0f}s") from None
    if process.returncode != 0:
        reason = err.decode(errors="replace").strip().splitlines()
        raise ConfigError(
            "the Kubernetes configuration is unusable: " + (reason[-1] if reason else "no reason")
        )
    return cast(Probe, json.loads(out))


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
