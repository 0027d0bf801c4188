"""`Settings`: the process settings plus what the operator asks of vCenter, ISOs, logs.

The second half of the pydantic-settings model (base.py has the first, and says how
a field declares its flag, variable, help and fix). The vSphere timings obey one
rule each: the connect timeout fits in the login timeout, and the longest login
backoff is not shorter than the first.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator

from agentforge.settings.base import CrossFieldError, Flag, ProcessSettings, fmt
from agentforge.settings.values import ByteSize, Duration, Format, Level, LogFormat, LogLevel

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
