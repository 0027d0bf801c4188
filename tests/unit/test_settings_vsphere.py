"""The vSphere session flags: production defaults, consistent limits, wired into the
session options and the login policy the app builds."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from agentforge import app, settings


def _load(argv: list[str], env: dict[str, str] | None = None) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser)
    return settings.load(parser.parse_args(argv), environ=env or {})


def test_defaults_stay_below_the_vcenter_sso_lockout_and_bound_every_wait() -> None:
    s = _load([])
    assert s.vsphere_connect_timeout == timedelta(seconds=10)
    assert s.vsphere_login_timeout == timedelta(seconds=30)
    assert s.vsphere_call_timeout == timedelta(minutes=2)
    assert s.vsphere_login_backoff == timedelta(minutes=5)
    assert s.vsphere_login_backoff_max == timedelta(minutes=30)
    # SSO locks after 5 failures in 180 s; a failover may add one leader's budget again
    assert 2 * s.vsphere_max_failed_logins < 5
    assert s.vsphere_failed_login_window >= timedelta(seconds=180)
    assert s.vsphere_session_idle_timeout == timedelta(minutes=30)


def test_the_flags_reach_the_session_options_and_the_login_policy() -> None:
    s = _load(
        [
            "--vsphere-connect-timeout=3s",
            "--vsphere-login-timeout=20s",
            "--vsphere-call-timeout=40s",
            "--vsphere-login-backoff=1m",
            "--vsphere-login-backoff-max=10m",
            "--vsphere-failed-login-window=5m",
            "--vsphere-session-idle-timeout=1h",
        ],
        {"AGENT_FORGE_VSPHERE_MAX_FAILED_LOGINS": "1"},
    )
    options, policy = app.vsphere_options(s), app.login_policy(s)
    assert (options.connect_timeout_seconds, options.login_timeout_seconds) == (3.0, 20.0)
    assert options.http_timeout_seconds == 40.0
    assert options.wait_max_seconds == 20, "the long poll ends well before a call times out"
    assert options.idle_close_seconds == 3600.0
    assert (policy.backoff_seconds, policy.backoff_max_seconds) == (60.0, 600.0)
    assert (policy.max_failed_logins, policy.window_seconds) == (1, 300.0)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--vsphere-connect-timeout=1m", "--vsphere-login-timeout=30s"], "login timeout"),
        (["--vsphere-login-backoff=1h", "--vsphere-login-backoff-max=30m"], "backoff"),
        (["--vsphere-max-failed-logins=0"], "--vsphere-max-failed-logins"),
        (["--vsphere-call-timeout=0s"], "greater than zero"),
    ],
)
def test_inconsistent_vsphere_limits_are_refused_naming_the_flag(
    argv: list[str], words: str
) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        _load(argv)
    assert words in str(caught.value)
