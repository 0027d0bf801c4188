"""The settings of the operator process: Kubernetes, servers, leader election, workers.

`ProcessSettings` is the first half of the pydantic-settings model `Settings`
(model.py adds what the operator asks of vCenter, ISO downloads and logging). Each
field carries everything a user sees of it: its type and default, its help text
(the field's description) and a `Flag` with the command-line name, the metavar and
the hint that tells how to fix a bad value. Its environment variable is its
validation alias, `AGENT_FORGE_` followed by the field name in capitals
(`--namespace` and `--credential-namespace` keep their singular variables through
explicit aliases). The command
line (cli.py) and the generated table in docs/configuration.md
(`scripts/settings_reference.py`) are built from these fields, so they cannot
drift from what is validated.

Values are validated once, at start; the model is frozen. Constructing
`Settings(...)` takes only what it is given: `load` (cli.py) adds the environment,
from the mapping it is handed, so tests and benchmarks are not changed by the
process environment. The leader-election timings obey client-go's rules: lease
duration > renew deadline > retry period x 1.2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Self

from pydantic import AliasGenerator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agentforge.settings.values import BindAddress, Duration, Names, OptionalBind, Switch

__all__ = ["ENV_PREFIX", "JITTER_FACTOR", "CrossFieldError", "Flag", "ProcessSettings", "fmt"]

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
