"""`Settings`: every setting of the operator process, as one pydantic-settings model.

`ProcessSettings` holds what the process needs (Kubernetes, servers, leader election,
workers); `Settings` adds what the operator asks of vCenter, ISO downloads and logging.
Each field carries everything a user sees of it: its type and default, its help text
(the field's description) and a `Flag` with the command-line name, the metavar and
the hint that tells how to fix a bad value. Its environment variable is its
validation alias, `AGENT_FORGE_` followed by the field name in capitals
(`--namespace` and `--credential-namespace` keep their singular variables through
explicit aliases). The command line (cli.py) and the generated table in
docs/configuration.md (`scripts/settings_reference.py`) are built from these fields,
so they cannot drift from what is validated.

Values are validated once, at start; the model is frozen. Constructing
`Settings(...)` takes only what it is given: `load` (cli.py) adds the environment,
from the mapping it is handed, so tests and benchmarks are not changed by the
process environment. Cross-field rules: the leader-election timings obey client-go's
(lease duration > renew deadline > retry period x 1.2); the connect timeout fits in
the vSphere login timeout, and the longest login backoff is not shorter than the
first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Self

from pydantic import AliasGenerator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agentforge.settings.values import (
    BindAddress,
    ByteSize,
    Duration,
    Format,
    Level,
    LogFormat,
    LogLevel,
    Names,
    OptionalBind,
    Switch,
)

ENV_PREFIX = "AGENT_FORGE_"
JITTER_FACTOR = 1.2  # client-go leaderelection.JitterFactor

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


@dataclass(frozen=True, slots=True)
class Flag:
    """How a field appears on the command line, and how to fix a bad value of it."""

    flag: str
    fix: str
    metavar: str = "VALUE"
    repeatable: bool = False  # `--namespace a --namespace b`; the variable takes `a,b`
    switch: bool = False  # `--leader-elect` alone means true


def _variable(field: str) -> str:
    return ENV_PREFIX + field.upper()


class CrossFieldError(ValueError):
    """A value that conflicts with another; `field` names the flag the message is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ProcessSettings(BaseSettings):
    """Kubernetes access, the served endpoints, leader election and the workers."""

    model_config = SettingsConfigDict(
        # Each field's variable is its alias, `AGENT_FORGE_` + its name in capitals, used
        # as it is: AGENT_FORGE_LOG_LEVEL, not agent_forge_log_level.
        alias_generator=AliasGenerator(validation_alias=_variable),
        case_sensitive=True,
        enable_decoding=False,  # values are text for the validators, never JSON
        env_parse_enums=False,
        frozen=True,
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        validate_default=False,
    )

    kubeconfig: Annotated[
        Path | None,
        Flag(
            "--kubeconfig",
            metavar="PATH",
            fix=("pass the path of an existing kubeconfig file, or leave it unset"),
        ),
    ] = Field(
        None,
        description=(
            "kubeconfig file (default: $KUBECONFIG, then the in-cluster service "
            "account, then ~/.kube/config)"
        ),
    )
    namespaces: Annotated[
        Names,
        Flag(
            "--namespace",
            metavar="NAME",
            repeatable=True,
            fix="pass a lower-case namespace name such as clusters-demo",
        ),
    ] = Field(
        (),
        validation_alias=ENV_PREFIX + "NAMESPACE",
        description=("watch only this namespace; repeat for more (default: all namespaces)"),
    )
    credential_namespaces: Annotated[
        Names,
        Flag(
            "--credential-namespace",
            metavar="NAME",
            repeatable=True,
            fix="pass a lower-case namespace name such as tenant-a",
        ),
    ] = Field(
        (),
        validation_alias=ENV_PREFIX + "CREDENTIAL_NAMESPACE",
        description=(
            "a namespace whose Secrets pools may use as vSphere credentials; repeat for more. "
            "No Secret elsewhere is read: a pool naming one is refused (default: the "
            "--namespace list; required when all namespaces are watched)"
        ),
    )
    metrics_bind_address: Annotated[
        OptionalBind,
        Flag(
            "--metrics-bind-address",
            metavar="ADDR",
            fix=("use host:port such as :8443 or 127.0.0.1:0, or 0 to turn it off"),
        ),
    ] = Field(
        BindAddress("0.0.0.0", 8443),  # noqa: S104
        description=("address of the /metrics server (default :8443; 0 turns it off)"),
    )
    metrics_secure: Annotated[
        Switch, Flag("--metrics-secure", switch=True, fix="set true or false")
    ] = Field(
        True,
        description=(
            "serve /metrics over HTTPS to callers whose bearer token the API "
            "server authorises for GET /metrics (TokenReview + "
            "SubjectAccessReview); false serves plain HTTP to anyone, for local "
            "runs only"
        ),
    )
    metrics_cert_path: Annotated[
        Path | None,
        Flag(
            "--metrics-cert-path",
            metavar="DIR",
            fix=(
                "pass a directory holding --metrics-cert-name and --metrics-cert-key,"
                " e.g. a mounted kubernetes.io/tls Secret, and keep --metrics-secure "
                "true"
            ),
        ),
    ] = Field(
        None,
        description=(
            "directory with the /metrics serving certificate and key, re-read "
            "when they change (default: a self-signed certificate generated at "
            "start)"
        ),
    )
    metrics_cert_name: Annotated[
        str, Flag("--metrics-cert-name", metavar="FILE", fix="pass a file name such as tls.crt")
    ] = Field(
        "tls.crt",
        description=("file name of the certificate (PEM, chain included) in --metrics-cert-path"),
    )
    metrics_cert_key: Annotated[
        str, Flag("--metrics-cert-key", metavar="FILE", fix="pass a file name such as tls.key")
    ] = Field("tls.key", description="file name of the private key (PEM) in --metrics-cert-path")
    health_probe_bind_address: Annotated[
        OptionalBind,
        Flag(
            "--health-probe-bind-address",
            metavar="ADDR",
            fix=("use host:port such as :8081 or 127.0.0.1:0, or 0 to turn it off"),
        ),
    ] = Field(
        BindAddress("0.0.0.0", 8081),  # noqa: S104
        description=("address of the /healthz and /readyz server (default :8081; 0 turns it off)"),
    )
    leader_elect: Annotated[
        Switch, Flag("--leader-elect", switch=True, fix="set true or false")
    ] = Field(False, description=("run controllers only while holding a coordination.k8s.io Lease"))
    leader_election_namespace: Annotated[
        str | None,
        Flag(
            "--leader-election-namespace",
            metavar="NAME",
            fix="pass the namespace the operator runs in",
        ),
    ] = Field(
        None,
        description=("namespace of the Lease (default: the pod's namespace when in a cluster)"),
    )
    leader_election_id: Annotated[
        str,
        Flag(
            "--leader-election-id",
            metavar="NAME",
            fix="use a lower-case DNS name such as agent-forge.containeroo.ch",
        ),
    ] = Field(
        "agent-forge.containeroo.ch",
        description="name of the Lease (default agent-forge.containeroo.ch)",
    )
    lease_duration: Annotated[
        Duration,
        Flag(
            "--lease-duration",
            metavar="DURATION",
            fix="use a duration such as 15s, longer than --renew-deadline",
        ),
    ] = Field(
        timedelta(seconds=15),
        description=("how long standbys wait before taking over an unrenewed lease (default 15s)"),
    )
    renew_deadline: Annotated[
        Duration,
        Flag(
            "--renew-deadline",
            metavar="DURATION",
            fix="use a duration such as 10s, shorter than --lease-duration",
        ),
    ] = Field(
        timedelta(seconds=10),
        description=(
            "how long the leader retries renewing before it gives up and exits (default 10s)"
        ),
    )
    retry_period: Annotated[
        Duration,
        Flag(
            "--retry-period",
            metavar="DURATION",
            fix=("use a duration such as 2s; x1.2 it must stay shorter than --renew-deadline"),
        ),
    ] = Field(
        timedelta(seconds=2),
        description=("interval between attempts to acquire or renew the lease (default 2s)"),
    )
    max_concurrent_reconciles: Annotated[
        int,
        Flag("--max-concurrent-reconciles", metavar="N", fix="use a whole number from 1 to 256"),
    ] = Field(
        4,
        ge=1,
        le=256,
        description=(
            "reconciles one controller runs at once (default 4); no reconcile "
            "waits on a vCenter task, so this bounds reconcile CPU and API work, "
            "not VMs in flight"
        ),
    )

    @field_validator("kubeconfig")
    @classmethod
    def _kubeconfig_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("namespaces", "credential_namespaces")
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

    @field_validator("lease_duration", "renew_deadline", "retry_period")
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

    @field_validator("metrics_cert_name", "metrics_cert_key")
    @classmethod
    def _plain_file_name(cls, value: str) -> str:
        if not value or "/" in value or value in {".", ".."}:
            raise ValueError(f"{value!r} is not a file name")
        return value

    @model_validator(mode="after")
    def _metrics_serving(self) -> Self:
        if self.metrics_cert_path is not None:
            if not self.metrics_secure:
                raise CrossFieldError(
                    "metrics_cert_path",
                    "a serving certificate needs HTTPS, but --metrics-secure is false",
                )
            for name in (self.metrics_cert_name, self.metrics_cert_key):
                if not (self.metrics_cert_path / name).is_file():
                    raise CrossFieldError(
                        "metrics_cert_path", f"{self.metrics_cert_path / name} is not a file"
                    )
        metrics, health = self.metrics_bind_address, self.health_probe_bind_address
        if self.metrics_secure and metrics is not None and metrics == health and metrics.port:
            raise CrossFieldError(
                "health_probe_bind_address",
                f"the probes need a port of their own: {metrics} serves /metrics over HTTPS "
                "with authentication, and the kubelet probes plain HTTP without a token",
            )
        return self

    @model_validator(mode="after")
    def _leader_timings(self) -> Self:
        # client-go's NewLeaderElector refuses the same combinations.
        if self.lease_duration <= self.renew_deadline:
            raise CrossFieldError(
                "renew_deadline",
                f"the renew deadline ({fmt(self.renew_deadline)}) must be shorter than the "
                f"lease duration ({fmt(self.lease_duration)}), or a leader could lose the "
                "lease while it still believes it holds it",
            )
        if self.renew_deadline <= self.retry_period * JITTER_FACTOR:
            raise CrossFieldError(
                "retry_period",
                f"the retry period x {JITTER_FACTOR} ({fmt(self.retry_period * JITTER_FACTOR)})"
                f" must be shorter than the renew deadline ({fmt(self.renew_deadline)})",
            )
        return self

    @property
    def secret_namespaces(self) -> frozenset[str]:
        """Where the operator may read credentials Secrets: `--credential-namespace`, else
        the watched namespaces; empty (a start-up error, see cli.load) when all are watched
        and none is named."""
        return frozenset(self.credential_namespaces or self.namespaces)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what the caller passes: `load` reads the environment it is handed, and
        # no .env file or secrets directory is consulted behind the operator's back.
        return (init_settings,)


def fmt(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"


__all__ = ["Settings"]


class Settings(ProcessSettings):
    """The validated configuration of one operator process (immutable)."""

    vsphere_max_workers: Annotated[
        int, Flag("--vsphere-max-workers", metavar="N", fix="use a whole number from 1 to 128")
    ] = Field(
        8,
        ge=1,
        le=128,
        description=("threads for blocking vSphere calls, per vCenter session (default 8)"),
    )
    vsphere_qps: Annotated[
        float, Flag("--vsphere-qps", metavar="QPS", fix="use a positive number such as 50")
    ] = Field(
        50.0,
        gt=0,
        le=10_000,
        description="vSphere calls per second allowed per vCenter (default 50)",
    )
    vsphere_burst: Annotated[
        int, Flag("--vsphere-burst", metavar="N", fix="use a whole number such as 100")
    ] = Field(
        100,
        ge=1,
        le=100_000,
        description=("vSphere calls allowed in a burst above --vsphere-qps (default 100)"),
    )
    vsphere_max_tasks_in_flight: Annotated[
        int,
        Flag("--vsphere-max-tasks-in-flight", metavar="N", fix="use a whole number from 1 to 640"),
    ] = Field(
        64,
        ge=1,
        le=640,
        description=(
            "vCenter tasks (create, power on/off, destroy, CD-ROM disconnect) in "
            "flight at once per vCenter, shared by the pools in turn (default 64:"
            " a tenth of the about 640 operations vCenter runs at once)"
        ),
    )
    credentials_refresh_interval: Annotated[
        Duration,
        Flag(
            "--credentials-refresh-interval",
            metavar="DURATION",
            fix="use a duration from 1s to 24h such as 1m",
        ),
    ] = Field(
        timedelta(minutes=1),
        description=(
            "how old a copy of a vSphere credentials Secret may get before it is "
            "read again: one GET per Secret in use per interval (default 1m)"
        ),
    )
    vsphere_connect_timeout: Annotated[
        Duration,
        Flag(
            "--vsphere-connect-timeout",
            metavar="DURATION",
            fix=("use a duration such as 10s, not longer than --vsphere-login-timeout"),
        ),
    ] = Field(
        timedelta(seconds=10),
        description=(
            "longest wait for a TCP connection and TLS handshake with a vCenter (default 10s)"
        ),
    )
    vsphere_login_timeout: Annotated[
        Duration,
        Flag("--vsphere-login-timeout", metavar="DURATION", fix="use a duration such as 30s"),
    ] = Field(
        timedelta(seconds=30),
        description=(
            "longest a whole vCenter login may take before the vCenter counts as "
            "unreachable (default 30s)"
        ),
    )
    vsphere_call_timeout: Annotated[
        Duration,
        Flag("--vsphere-call-timeout", metavar="DURATION", fix="use a duration such as 2m"),
    ] = Field(
        timedelta(minutes=2),
        description="longest one vCenter request may go unanswered (default 2m)",
    )
    vsphere_login_backoff: Annotated[
        Duration,
        Flag("--vsphere-login-backoff", metavar="DURATION", fix="use a duration such as 5m"),
    ] = Field(
        timedelta(minutes=5),
        description=(
            "wait after vCenter refused a login before the same credentials are "
            "tried again, doubling per refusal (default 5m)"
        ),
    )
    vsphere_login_backoff_max: Annotated[
        Duration,
        Flag(
            "--vsphere-login-backoff-max",
            metavar="DURATION",
            fix=("use a duration such as 30m, not shorter than --vsphere-login-backoff"),
        ),
    ] = Field(
        timedelta(minutes=30),
        description=("longest wait between logins with refused credentials (default 30m)"),
    )
    vsphere_max_failed_logins: Annotated[
        int,
        Flag(
            "--vsphere-max-failed-logins",
            metavar="N",
            fix=("use a whole number from 1 to 100, below vCenter's lockout threshold"),
        ),
    ] = Field(
        2,
        ge=1,
        le=100,
        description=(
            "failed logins allowed per vCenter user and "
            "--vsphere-failed-login-window, all passwords together; keep it below"
            " the vCenter lockout threshold (default 2; vCenter locks after 5)"
        ),
    )
    vsphere_failed_login_window: Annotated[
        Duration,
        Flag("--vsphere-failed-login-window", metavar="DURATION", fix="use a duration such as 3m"),
    ] = Field(
        timedelta(minutes=3),
        description=(
            "the window --vsphere-max-failed-logins counts in; at least vCenter's"
            " lockout window (default 3m)"
        ),
    )
    vsphere_session_idle_timeout: Annotated[
        Duration,
        Flag(
            "--vsphere-session-idle-timeout", metavar="DURATION", fix="use a duration such as 30m"
        ),
    ] = Field(
        timedelta(minutes=30),
        description=(
            "log out and close a vCenter session no pool used for this long (default 30m)"
        ),
    )
    iso_ca_bundle: Annotated[
        Path | None,
        Flag(
            "--iso-ca-bundle",
            metavar="PATH",
            fix=(
                "pass the path of a PEM file (it may appear later), e.g. "
                "/etc/agent-forge/trusted-ca/ca-bundle.crt"
            ),
        ),
    ] = Field(
        None,
        description=(
            "PEM file of CA certificates trusted for ISO downloads from the image"
            " service, in addition to the system store; re-read when it changes, "
            "none while it is missing (the shipped manifests mount the optional "
            "ConfigMap agent-forge-trusted-ca here)"
        ),
    )
    iso_max_size: Annotated[
        ByteSize,
        Flag("--iso-max-size", metavar="SIZE", fix="use a size from 64Ki to 1Ti such as 8Gi"),
    ] = Field(
        8 * 2**30,
        ge=64 * 2**10,
        le=2**40,
        description=(
            "largest discovery ISO downloaded, as bytes or a quantity such as 8Gi"
            " (default 8Gi); a larger image fails with ISOReady=False, "
            "ISOTooLarge"
        ),
    )
    log_level: Annotated[
        Level, Flag("--log-level", metavar="LEVEL", fix="use debug, info, warning or error")
    ] = Field(LogLevel.INFO, description="debug, info, warning or error")
    log_format: Annotated[
        Format, Flag("--log-format", metavar="FORMAT", fix="use json or text")
    ] = Field(LogFormat.JSON, description="json (default) or text")

    @field_validator(
        "vsphere_connect_timeout",
        "vsphere_login_timeout",
        "vsphere_call_timeout",
        "vsphere_login_backoff",
        "vsphere_login_backoff_max",
        "vsphere_failed_login_window",
        "vsphere_session_idle_timeout",
    )
    @classmethod
    def _positive_vsphere(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than zero")
        return value

    @field_validator("iso_ca_bundle")
    @classmethod
    def _bundle_not_a_directory(cls, value: Path | None) -> Path | None:
        # A missing file is fine: the ConfigMap is optional and may be filled later.
        if value is not None and value.is_dir():
            raise ValueError(f"{value} is a directory, not a PEM file")
        return value

    @field_validator("credentials_refresh_interval")
    @classmethod
    def _refresh_range(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(hours=24):
            raise ValueError("must be from 1s to 24h")
        return value

    @model_validator(mode="after")
    def _vsphere_timings(self) -> Self:
        if self.vsphere_connect_timeout > self.vsphere_login_timeout:
            raise CrossFieldError(
                "vsphere_connect_timeout",
                f"the vSphere connect timeout ({fmt(self.vsphere_connect_timeout)}) must not "
                f"exceed the login timeout ({fmt(self.vsphere_login_timeout)}), which bounds "
                "a whole login including its connection",
            )
        if self.vsphere_login_backoff > self.vsphere_login_backoff_max:
            raise CrossFieldError(
                "vsphere_login_backoff_max",
                f"the longest login backoff ({fmt(self.vsphere_login_backoff_max)}) must not "
                f"be shorter than the first ({fmt(self.vsphere_login_backoff)})",
            )
        return self
