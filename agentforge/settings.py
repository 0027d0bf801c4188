"""Every flag and environment variable of `agentforge run`, validated once at start.

One table (`OPTIONS`) names each setting's flag, environment variable, default and
the hint that tells a user how to fix a bad value; the argparse parser and the
environment reader are both built from it, so they cannot drift apart. Values are
taken from the flag, else from `AGENT_FORGE_<FLAG>` (dashes become underscores),
else the default, then validated by the pydantic model `Settings`, which is frozen
and passed to the composition root. A bad value becomes a `SettingsError` whose
message names the flag, the environment variable and the fix; the CLI prints it
and exits 2 without a traceback, as argparse does for unknown flags.

Durations use Go's syntax (`15s`, `1m30s`, `500ms`) because the flags mirror
controller-runtime's; plain numbers are seconds. The leader-election timings obey
client-go's rules: lease duration > renew deadline > retry period x 1.2.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = [
    "ENV_PREFIX",
    "JITTER_FACTOR",
    "OPTIONS",
    "BindAddress",
    "LogFormat",
    "LogLevel",
    "Settings",
    "SettingsError",
    "add_run_arguments",
    "load",
]

ENV_PREFIX = "AGENT_FORGE_"
JITTER_FACTOR = 1.2  # client-go leaderelection.JitterFactor
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class SettingsError(Exception):
    """A setting is invalid; the message names the flag and says how to fix it."""


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(enum.StrEnum):
    JSON = "json"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where a server listens; port 0 asks the kernel for a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_duration(value: object) -> timedelta:
    """A Go duration (`1m30s`, `500ms`) or a number of seconds, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    if not isinstance(value, str):
        raise ValueError("not a duration")  # noqa: TRY004
    text = value.strip()
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError("not a duration")
    return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))


def parse_bind_address(value: object) -> BindAddress | None:
    """`host:port`, `:port` (all interfaces), `[::1]:port`; `0` turns the server off."""
    if value is None or isinstance(value, BindAddress):
        return value
    text = str(value).strip()
    if text == "0":
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError("not host:port")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"  # noqa: S104 (probes)
    return BindAddress(host=host, port=port)


_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_QUANTITY_FACTOR = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def parse_byte_size(value: object) -> object:
    """A byte count as a Kubernetes quantity (`8Gi`, `500M`) or a plain number."""
    if isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise ValueError("not a size (a whole number of bytes, or e.g. 512Mi, 8Gi)")
        return int(match.group(1)) * _QUANTITY_FACTOR[match.group(2)]
    return value


def _parse_bool(value: object) -> object:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off", ""}:
            return False
    return value


def _split_namespaces(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        out: list[str] = []
        for item in value:
            out.extend(part.strip() for part in str(item).split(",") if part.strip())
        return tuple(out)
    return value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _lower_level(value: object) -> object:
    lowered = _lower(value)
    return "warning" if lowered == "warn" else lowered


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
OptionalBind = Annotated[BindAddress | None, BeforeValidator(parse_bind_address)]


class Settings(BaseModel):
    """The validated configuration of one operator process (immutable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kubeconfig: Path | None = None
    namespaces: Annotated[tuple[str, ...], BeforeValidator(_split_namespaces)] = ()
    metrics_bind_address: OptionalBind = BindAddress("0.0.0.0", 8443)  # noqa: S104
    metrics_secure: Annotated[bool, BeforeValidator(_parse_bool)] = True
    metrics_cert_path: Path | None = None
    metrics_cert_name: str = "tls.crt"
    metrics_cert_key: str = "tls.key"
    health_probe_bind_address: OptionalBind = BindAddress("0.0.0.0", 8081)  # noqa: S104
    leader_elect: Annotated[bool, BeforeValidator(_parse_bool)] = False
    leader_election_namespace: str | None = None
    leader_election_id: str = "agent-forge.containeroo.ch"
    lease_duration: Duration = timedelta(seconds=15)
    renew_deadline: Duration = timedelta(seconds=10)
    retry_period: Duration = timedelta(seconds=2)
    max_concurrent_reconciles: int = Field(default=4, ge=1, le=256)
    vsphere_max_workers: int = Field(default=8, ge=1, le=128)
    vsphere_qps: float = Field(default=50.0, gt=0, le=10_000)
    vsphere_burst: int = Field(default=100, ge=1, le=100_000)
    vsphere_max_tasks_in_flight: int = Field(default=64, ge=1, le=640)
    credentials_refresh_interval: Duration = timedelta(minutes=1)
    vsphere_connect_timeout: Duration = timedelta(seconds=10)
    vsphere_login_timeout: Duration = timedelta(seconds=30)
    vsphere_call_timeout: Duration = timedelta(minutes=2)
    vsphere_login_backoff: Duration = timedelta(minutes=5)
    vsphere_login_backoff_max: Duration = timedelta(minutes=30)
    vsphere_max_failed_logins: int = Field(default=2, ge=1, le=100)
    vsphere_failed_login_window: Duration = timedelta(minutes=3)
    vsphere_session_idle_timeout: Duration = timedelta(minutes=30)
    iso_ca_bundle: Path | None = None
    iso_max_size: Annotated[int, BeforeValidator(parse_byte_size)] = Field(
        default=8 * 2**30, ge=64 * 2**10, le=2**40
    )
    log_level: Annotated[LogLevel, BeforeValidator(_lower_level)] = LogLevel.INFO
    log_format: Annotated[LogFormat, BeforeValidator(_lower)] = LogFormat.JSON

    @field_validator("kubeconfig")
    @classmethod
    def _kubeconfig_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("namespaces")
    @classmethod
    def _namespaces_are_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if len(name) > 63 or not _DNS1123_LABEL.match(name):
                raise ValueError(f"{name!r} is not a namespace name (DNS-1123 label)")
        return tuple(dict.fromkeys(value))  # keep order, drop repeats

    @field_validator("leader_election_namespace")
    @classmethod
    def _lease_namespace_is_label(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not _DNS1123_LABEL.match(value)):
            raise ValueError(f"{value!r} is not a namespace name (DNS-1123 label)")
        return value

    @field_validator("leader_election_id")
    @classmethod
    def _lease_name_is_subdomain(cls, value: str) -> str:
        if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
            raise ValueError(f"{value!r} is not a Lease name (DNS-1123 subdomain)")
        return value

    @field_validator(
        "lease_duration",
        "renew_deadline",
        "retry_period",
        "vsphere_connect_timeout",
        "vsphere_login_timeout",
        "vsphere_call_timeout",
        "vsphere_login_backoff",
        "vsphere_login_backoff_max",
        "vsphere_failed_login_window",
        "vsphere_session_idle_timeout",
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than zero")
        return value

    @field_validator("metrics_cert_path")
    @classmethod
    def _cert_path_is_directory(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        return value

    @field_validator("iso_ca_bundle")
    @classmethod
    def _bundle_not_a_directory(cls, value: Path | None) -> Path | None:
        # A missing file is fine: the ConfigMap is optional and may be filled later.
        if value is not None and value.is_dir():
            raise ValueError(f"{value} is a directory, not a PEM file")
        return value

    @field_validator("metrics_cert_name", "metrics_cert_key")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if not value or "/" in value or value in {".", ".."}:
            raise ValueError(f"{value!r} is not a file name")
        return value

    @model_validator(mode="after")
    def _metrics_serving(self) -> Settings:
        if self.metrics_cert_path is not None:
            if not self.metrics_secure:
                raise _CrossFieldError(
                    "metrics_cert_path",
                    "a serving certificate needs HTTPS, but --metrics-secure is false",
                )
            for name in (self.metrics_cert_name, self.metrics_cert_key):
                if not (self.metrics_cert_path / name).is_file():
                    raise _CrossFieldError(
                        "metrics_cert_path", f"{self.metrics_cert_path / name} is not a file"
                    )
        metrics, health = self.metrics_bind_address, self.health_probe_bind_address
        if self.metrics_secure and metrics is not None and metrics == health and metrics.port:
            raise _CrossFieldError(
                "health_probe_bind_address",
                f"the probes need a port of their own: {metrics} serves /metrics over HTTPS "
                "with authentication, and the kubelet probes plain HTTP without a token",
            )
        return self

    @field_validator("credentials_refresh_interval")
    @classmethod
    def _refresh_range(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(hours=24):
            raise ValueError("must be from 1s to 24h")
        return value

    @model_validator(mode="after")
    def _leader_timings(self) -> Settings:
        # client-go's NewLeaderElector refuses the same combinations.
        if self.lease_duration <= self.renew_deadline:
            raise _CrossFieldError(
                "renew_deadline",
                f"the renew deadline ({_fmt(self.renew_deadline)}) must be shorter than the "
                f"lease duration ({_fmt(self.lease_duration)}), or a leader could lose the "
                "lease while it still believes it holds it",
            )
        if self.renew_deadline <= self.retry_period * JITTER_FACTOR:
            raise _CrossFieldError(
                "retry_period",
                f"the retry period x {JITTER_FACTOR} ({_fmt(self.retry_period * JITTER_FACTOR)})"
                f" must be shorter than the renew deadline ({_fmt(self.renew_deadline)})",
            )
        if self.vsphere_connect_timeout > self.vsphere_login_timeout:
            raise _CrossFieldError(
                "vsphere_connect_timeout",
                f"the vSphere connect timeout ({_fmt(self.vsphere_connect_timeout)}) must not "
                f"exceed the login timeout ({_fmt(self.vsphere_login_timeout)}), which bounds "
                "a whole login including its connection",
            )
        if self.vsphere_login_backoff > self.vsphere_login_backoff_max:
            raise _CrossFieldError(
                "vsphere_login_backoff_max",
                f"the longest login backoff ({_fmt(self.vsphere_login_backoff_max)}) must not "
                f"be shorter than the first ({_fmt(self.vsphere_login_backoff)})",
            )
        return self

    @property
    def all_namespaces(self) -> bool:
        return not self.namespaces


class _CrossFieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _fmt(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"


@dataclass(frozen=True, slots=True)
class Option:
    """One setting as the user sees it: its flag, its variable and how to fix it."""

    field: str
    flag: str
    help: str
    fix: str
    metavar: str = "VALUE"
    repeatable: bool = False
    switch: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.removeprefix("--").replace("-", "_").upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "kubeconfig",
        "--kubeconfig",
        "kubeconfig file (default: $KUBECONFIG, then the in-cluster service account, "
        "then ~/.kube/config)",
        "pass the path of an existing kubeconfig file, or leave it unset",
        metavar="PATH",
    ),
    Option(
        "namespaces",
        "--namespace",
        "watch only this namespace; repeat for more (default: all namespaces)",
        "pass a lower-case namespace name such as clusters-demo",
        metavar="NAME",
        repeatable=True,
    ),
    Option(
        "metrics_bind_address",
        "--metrics-bind-address",
        "address of the /metrics server (default :8443; 0 turns it off)",
        "use host:port such as :8443 or 127.0.0.1:0, or 0 to turn it off",
        metavar="ADDR",
    ),
    Option(
        "metrics_secure",
        "--metrics-secure",
        "serve /metrics over HTTPS to callers whose bearer token the API server authorises "
        "for GET /metrics (TokenReview + SubjectAccessReview); false serves plain HTTP to "
        "anyone, for local runs only",
        "set true or false",
        switch=True,
    ),
    Option(
        "metrics_cert_path",
        "--metrics-cert-path",
        "directory with the /metrics serving certificate and key, re-read when they change "
        "(default: a self-signed certificate generated at start)",
        "pass a directory holding --metrics-cert-name and --metrics-cert-key, e.g. a "
        "mounted kubernetes.io/tls Secret, and keep --metrics-secure true",
        metavar="DIR",
    ),
    Option(
        "metrics_cert_name",
        "--metrics-cert-name",
        "file name of the certificate (PEM, chain included) in --metrics-cert-path",
        "pass a file name such as tls.crt",
        metavar="FILE",
    ),
    Option(
        "metrics_cert_key",
        "--metrics-cert-key",
        "file name of the private key (PEM) in --metrics-cert-path",
        "pass a file name such as tls.key",
        metavar="FILE",
    ),
    Option(
        "health_probe_bind_address",
        "--health-probe-bind-address",
        "address of the /healthz and /readyz server (default :8081; 0 turns it off)",
        "use host:port such as :8081 or 127.0.0.1:0, or 0 to turn it off",
        metavar="ADDR",
    ),
    Option(
        "leader_elect",
        "--leader-elect",
        "run controllers only while holding a coordination.k8s.io Lease",
        "set true or false",
        switch=True,
    ),
    Option(
        "leader_election_namespace",
        "--leader-election-namespace",
        "namespace of the Lease (default: the pod's namespace when in a cluster)",
        "pass the namespace the operator runs in",
        metavar="NAME",
    ),
    Option(
        "leader_election_id",
        "--leader-election-id",
        "name of the Lease (default agent-forge.containeroo.ch)",
        "use a lower-case DNS name such as agent-forge.containeroo.ch",
        metavar="NAME",
    ),
    Option(
        "lease_duration",
        "--lease-duration",
        "how long standbys wait before taking over an unrenewed lease (default 15s)",
        "use a duration such as 15s, longer than --renew-deadline",
        metavar="DURATION",
    ),
    Option(
        "renew_deadline",
        "--renew-deadline",
        "how long the leader retries renewing before it gives up and exits (default 10s)",
        "use a duration such as 10s, shorter than --lease-duration",
        metavar="DURATION",
    ),
    Option(
        "retry_period",
        "--retry-period",
        "interval between attempts to acquire or renew the lease (default 2s)",
        "use a duration such as 2s; x1.2 it must stay shorter than --renew-deadline",
        metavar="DURATION",
    ),
    Option(
        "max_concurrent_reconciles",
        "--max-concurrent-reconciles",
        "reconciles one controller runs at once (default 4); no reconcile waits on a "
        "vCenter task, so this bounds reconcile CPU and API work, not VMs in flight",
        "use a whole number from 1 to 256",
        metavar="N",
    ),
    Option(
        "vsphere_max_workers",
        "--vsphere-max-workers",
        "threads for blocking vSphere calls, per vCenter session (default 8)",
        "use a whole number from 1 to 128",
        metavar="N",
    ),
    Option(
        "vsphere_qps",
        "--vsphere-qps",
        "vSphere calls per second allowed per vCenter (default 50)",
        "use a positive number such as 50",
        metavar="QPS",
    ),
    Option(
        "vsphere_burst",
        "--vsphere-burst",
        "vSphere calls allowed in a burst above --vsphere-qps (default 100)",
        "use a whole number such as 100",
        metavar="N",
    ),
    Option(
        "vsphere_max_tasks_in_flight",
        "--vsphere-max-tasks-in-flight",
        "vCenter tasks (create, power on/off, destroy, CD-ROM disconnect) in flight at "
        "once per vCenter, shared by the pools in turn (default 64: a tenth of the about "
        "640 operations vCenter runs at once)",
        "use a whole number from 1 to 640",
        metavar="N",
    ),
    Option(
        "credentials_refresh_interval",
        "--credentials-refresh-interval",
        "how old a copy of a vSphere credentials Secret may get before it is read again: "
        "one GET per Secret in use per interval (default 1m)",
        "use a duration from 1s to 24h such as 1m",
        metavar="DURATION",
    ),
    Option(
        "vsphere_connect_timeout",
        "--vsphere-connect-timeout",
        "longest wait for a TCP connection and TLS handshake with a vCenter (default 10s)",
        "use a duration such as 10s, not longer than --vsphere-login-timeout",
        metavar="DURATION",
    ),
    Option(
        "vsphere_login_timeout",
        "--vsphere-login-timeout",
        "longest a whole vCenter login may take before the vCenter counts as unreachable "
        "(default 30s)",
        "use a duration such as 30s",
        metavar="DURATION",
    ),
    Option(
        "vsphere_call_timeout",
        "--vsphere-call-timeout",
        "longest one vCenter request may go unanswered (default 2m)",
        "use a duration such as 2m",
        metavar="DURATION",
    ),
    Option(
        "vsphere_login_backoff",
        "--vsphere-login-backoff",
        "wait after vCenter refused a login before the same credentials are tried again, "
        "doubling per refusal (default 5m)",
        "use a duration such as 5m",
        metavar="DURATION",
    ),
    Option(
        "vsphere_login_backoff_max",
        "--vsphere-login-backoff-max",
        "longest wait between logins with refused credentials (default 30m)",
        "use a duration such as 30m, not shorter than --vsphere-login-backoff",
        metavar="DURATION",
    ),
    Option(
        "vsphere_max_failed_logins",
        "--vsphere-max-failed-logins",
        "failed logins allowed per vCenter user and --vsphere-failed-login-window, all "
        "passwords together; keep it below the vCenter lockout threshold (default 2; "
        "vCenter locks after 5)",
        "use a whole number from 1 to 100, below vCenter's lockout threshold",
        metavar="N",
    ),
    Option(
        "vsphere_failed_login_window",
        "--vsphere-failed-login-window",
        "the window --vsphere-max-failed-logins counts in; at least vCenter's lockout "
        "window (default 3m)",
        "use a duration such as 3m",
        metavar="DURATION",
    ),
    Option(
        "vsphere_session_idle_timeout",
        "--vsphere-session-idle-timeout",
        "log out and close a vCenter session no pool used for this long (default 30m)",
        "use a duration such as 30m",
        metavar="DURATION",
    ),
    Option(
        "iso_ca_bundle",
        "--iso-ca-bundle",
        "PEM file of CA certificates trusted for ISO downloads from the image service, in "
        "addition to the system store; re-read when it changes, none while it is missing "
        "(the shipped manifests mount the optional ConfigMap agent-forge-trusted-ca here)",
        "pass the path of a PEM file (it may appear later), e.g. "
        "/etc/agent-forge/trusted-ca/ca-bundle.crt",
        metavar="PATH",
    ),
    Option(
        "iso_max_size",
        "--iso-max-size",
        "largest discovery ISO downloaded, as bytes or a quantity such as 8Gi (default 8Gi); "
        "a larger image fails with ISOReady=False, ISOTooLarge",
        "use a size from 64Ki to 1Ti such as 8Gi",
        metavar="SIZE",
    ),
    Option(
        "log_level",
        "--log-level",
        "debug, info, warning or error",
        "use debug, info, warning or error",
        metavar="LEVEL",
    ),
    Option("log_format", "--log-format", "json (default) or text", "use json or text", "FORMAT"),
)
_BY_FIELD = {option.field: option for option in OPTIONS}


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags of `agentforge run`; unset flags stay None so env can fill them."""
    for option in OPTIONS:
        help_text = f"{option.help} [env {option.env}]"
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.field, nargs="?", const="true", default=None,
                metavar="BOOL", help=help_text,
            )  # fmt: skip
        elif option.repeatable:
            parser.add_argument(
                option.flag,
                dest=option.field,
                action="append",
                metavar=option.metavar,
                help=help_text,
            )
        else:
            parser.add_argument(
                option.flag, dest=option.field, default=None, metavar=option.metavar, help=help_text
            )


def load(
    args: argparse.Namespace | Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    namespace_file: Path = IN_CLUSTER_NAMESPACE_FILE,
) -> Settings:
    """Merge flags over `AGENT_FORGE_*` variables over defaults and validate the result."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    raw: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for option in OPTIONS:
        value = given.get(option.field)
        if value is not None:
            raw[option.field] = value
            origin[option.field] = option.flag
        elif option.env in environ:
            raw[option.field] = environ[option.env]
            origin[option.field] = option.env
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, raw=raw, origin=origin)) from None
    if settings.leader_elect and settings.leader_election_namespace is None:
        settings = settings.model_copy(
            update={"leader_election_namespace": _in_cluster_namespace(namespace_file)}
        )
    return settings


def _in_cluster_namespace(path: Path) -> str:
    try:
        namespace = path.read_text().strip()
    except OSError:
        namespace = ""
    if not namespace:
        option = _BY_FIELD["leader_election_namespace"]
        raise SettingsError(
            f"{option.flag} is required with --leader-elect outside a cluster "
            f"(no {path}): {option.fix} [env {option.env}]"
        )
    return namespace


def _describe(exc: ValidationError, *, raw: Mapping[str, Any], origin: Mapping[str, str]) -> str:
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        cause = error.get("ctx", {}).get("error")
        field = getattr(cause, "field", None) or (str(error["loc"][0]) if error["loc"] else "")
        option = _BY_FIELD.get(field)
        message = str(cause) if cause is not None else str(error["msg"])
        if option is None:
            lines.append(message)
            continue
        source = origin.get(field, option.flag)
        shown = (
            f" {raw[field]!r}" if field in raw and not isinstance(cause, _CrossFieldError) else ""
        )
        names = option.flag if source == option.flag else f"{option.flag} (from {source})"
        lines.append(f"invalid {names}{shown}: {message}; {option.fix}")
    return "\n".join(lines)
