"""Settings: flags over AGENT_FORGE_* variables over defaults, validated once."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import pytest

from agentforge import settings
from agentforge.__main__ import EXIT_USAGE, main


def _load(argv: list[str], env: dict[str, str] | None = None, **kw: Path) -> settings.Settings:
    parser = argparse.ArgumentParser()
    settings.add_run_arguments(parser)
    return settings.load(parser.parse_args(argv), environ=env or {}, **kw)


def _error(argv: list[str], env: dict[str, str] | None = None, **kw: Path) -> str:
    with pytest.raises(settings.SettingsError) as caught:
        _load(argv, env, **kw)
    return str(caught.value)


def test_defaults_match_controller_runtime_conventions() -> None:
    s = _load([])
    assert s.kubeconfig is None
    assert not s.namespaces  # every namespace
    assert s.metrics_bind_address == settings.BindAddress("0.0.0.0", 8443)
    assert s.metrics_secure is True
    assert s.metrics_cert_path is None
    assert (s.metrics_cert_name, s.metrics_cert_key) == ("tls.crt", "tls.key")
    assert s.health_probe_bind_address == settings.BindAddress("0.0.0.0", 8081)
    assert not s.leader_elect
    assert s.leader_election_id == "agent-forge.containeroo.ch"
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (
        timedelta(seconds=15),
        timedelta(seconds=10),
        timedelta(seconds=2),
    )
    assert s.max_concurrent_reconciles == 4
    assert s.vsphere_max_tasks_in_flight == 64
    assert s.log_level is settings.LogLevel.INFO
    assert s.log_format is settings.LogFormat.JSON


def test_flag_wins_over_environment_and_environment_over_default() -> None:
    env = {"AGENT_FORGE_LOG_LEVEL": "debug", "AGENT_FORGE_MAX_CONCURRENT_RECONCILES": "6"}
    s = _load(["--log-level", "error"], env)
    assert s.log_level is settings.LogLevel.ERROR
    assert s.max_concurrent_reconciles == 6


def test_namespace_is_repeatable_and_the_variable_takes_a_comma_list() -> None:
    assert _load(["--namespace", "a", "--namespace", "b"]).namespaces == ("a", "b")
    assert _load([], {"AGENT_FORGE_NAMESPACE": "a, b,a"}).namespaces == ("a", "b")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("1m30s", 90), ("500ms", 0.5), ("2", 2), ("1h", 3600), ("1.5s", 1.5)],
)
def test_durations_use_go_syntax_or_plain_seconds(text: str, seconds: float) -> None:
    assert settings.parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", settings.BindAddress("0.0.0.0", 8080)),
        ("127.0.0.1:0", settings.BindAddress("127.0.0.1", 0)),
        ("[::1]:9000", settings.BindAddress("::1", 9000)),
        ("0", None),
    ],
)
def test_bind_addresses_accept_host_port_and_zero_turns_a_server_off(
    text: str, expected: settings.BindAddress | None
) -> None:
    assert _load(["--metrics-bind-address", text]).metrics_bind_address == expected


def test_leader_election_without_namespace_outside_a_cluster_names_the_flag(
    tmp_path: Path,
) -> None:
    message = _error(["--leader-elect"], namespace_file=tmp_path / "absent")
    assert "--leader-election-namespace is required" in message
    assert "AGENT_FORGE_LEADER_ELECTION_NAMESPACE" in message


def test_leader_election_namespace_defaults_to_the_pods_namespace(tmp_path: Path) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("agent-forge-system\n")
    s = _load(["--leader-elect"], namespace_file=namespace_file)
    assert s.leader_elect
    assert s.leader_election_namespace == "agent-forge-system"


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--lease-duration", "soon"], {}, "invalid --lease-duration 'soon': not a duration"),
        (["--retry-period=-1s"], {}, "invalid --retry-period"),
        (["--max-concurrent-reconciles", "0"], {}, "invalid --max-concurrent-reconciles '0'"),
        (["--metrics-bind-address", "8080"], {}, "invalid --metrics-bind-address '8080'"),
        (["--health-probe-bind-address", ":70000"], {}, "out of range"),
        (["--namespace", "Bad_NS"], {}, "not a namespace name"),
        (["--leader-election-id", "Not A Name"], {}, "not a Lease name"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], {}, "invalid --kubeconfig"),
        (["--log-format", "xml"], {}, "invalid --log-format 'xml'"),
        ([], {"AGENT_FORGE_LOG_LEVEL": "loud"}, "--log-level (from AGENT_FORGE_LOG_LEVEL)"),
        ([], {"AGENT_FORGE_LEADER_ELECT": "maybe"}, "--leader-elect (from AGENT_FORGE"),
    ],
)
def test_a_bad_value_names_the_flag_and_the_fix(
    argv: list[str], env: dict[str, str], expected: str
) -> None:
    message = _error(argv, env)
    assert expected in message
    assert "; " in message  # followed by how to fix it


def test_renew_deadline_must_be_shorter_than_lease_duration() -> None:
    message = _error(["--lease-duration", "10s", "--renew-deadline", "10s"])
    assert "--renew-deadline" in message
    assert "shorter than the lease duration" in message


def test_retry_period_times_jitter_must_be_shorter_than_renew_deadline() -> None:
    message = _error(["--renew-deadline", "5s", "--retry-period", "5s"])
    assert "--retry-period" in message


def test_plain_metrics_need_an_explicit_false() -> None:
    assert _load(["--metrics-secure=false"]).metrics_secure is False
    assert _load([], {"AGENT_FORGE_METRICS_SECURE": "false"}).metrics_secure is False
    assert _load(["--metrics-secure"]).metrics_secure is True


def test_a_mounted_certificate_directory_must_hold_the_named_pair(tmp_path: Path) -> None:
    message = _error(["--metrics-cert-path", str(tmp_path / "absent")])
    assert "invalid --metrics-cert-path" in message
    assert "is not a directory" in message
    (tmp_path / "tls.crt").write_text("cert")
    message = _error(["--metrics-cert-path", str(tmp_path)])
    assert f"{tmp_path / 'tls.key'} is not a file" in message
    assert "--metrics-cert-key" in message  # the fix names the file-name flags
    (tmp_path / "server.key").write_text("key")
    s = _load(["--metrics-cert-path", str(tmp_path), "--metrics-cert-key", "server.key"])
    assert s.metrics_cert_path == tmp_path
    assert "not a file name" in _error(["--metrics-cert-name", "../etc/tls.crt"])


def test_a_certificate_with_plain_metrics_is_refused(tmp_path: Path) -> None:
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text("x")
    message = _error(["--metrics-cert-path", str(tmp_path), "--metrics-secure=false"])
    assert "--metrics-cert-path" in message
    assert "needs HTTPS" in message


def test_secure_metrics_and_probes_need_separate_ports() -> None:
    argv = ["--metrics-bind-address", ":9000", "--health-probe-bind-address", ":9000"]
    message = _error(argv)
    assert "invalid --health-probe-bind-address" in message
    assert "the probes need a port of their own" in message
    plain = _load([*argv, "--metrics-secure=false"])  # one plain server for both is fine
    assert plain.metrics_bind_address == plain.health_probe_bind_address


def test_settings_are_immutable() -> None:
    s = _load([])
    with pytest.raises(ValueError, match="frozen"):
        s.max_concurrent_reconciles = 3  # type: ignore[misc]


def test_cli_exits_2_with_a_message_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--lease-duration", "soon"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("agentforge run: error: invalid --lease-duration")
    assert "Traceback" not in err


def test_cli_version_prints_version_python_and_platform(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["agentforge", "python", "platform"]


def test_every_variable_sets_its_setting_as_its_flag_does(tmp_path: Path) -> None:
    """The variable pydantic-settings reads for each field is the documented one
    (`AGENT_FORGE_<FLAG>`), and it gives the same value as the flag."""
    (tmp_path / "kubeconfig").write_text("{}")
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_text("x")
    values = {
        "--kubeconfig": str(tmp_path / "kubeconfig"),
        "--namespace": "clusters-demo",
        "--credential-namespace": "tenant-a",
        "--metrics-bind-address": ":9443",
        "--metrics-secure": "true",
        "--metrics-cert-path": str(tmp_path),
        "--metrics-cert-name": "server.crt",
        "--metrics-cert-key": "server.key",
        "--health-probe-bind-address": ":9081",
        "--leader-elect": "true",
        "--leader-election-namespace": "agent-forge-system",
        "--leader-election-id": "elsewhere.example.com",
        "--lease-duration": "20s",
        "--renew-deadline": "12s",
        "--retry-period": "3s",
        "--max-concurrent-reconciles": "7",
        "--vsphere-max-workers": "9",
        "--vsphere-qps": "25",
        "--vsphere-burst": "30",
        "--vsphere-max-tasks-in-flight": "11",
        "--credentials-refresh-interval": "2m",
        "--vsphere-connect-timeout": "5s",
        "--vsphere-login-timeout": "20s",
        "--vsphere-call-timeout": "1m",
        "--vsphere-login-backoff": "1m",
        "--vsphere-login-backoff-max": "10m",
        "--vsphere-max-failed-logins": "3",
        "--vsphere-failed-login-window": "5m",
        "--vsphere-session-idle-timeout": "10m",
        "--iso-ca-bundle": str(tmp_path / "ca.pem"),
        "--iso-max-size": "1Gi",
        "--log-level": "debug",
        "--log-format": "text",
    }
    assert set(values) == {option.flag for option in settings.OPTIONS}
    env = {}
    for option in settings.OPTIONS:
        assert option.env == "AGENT_FORGE_" + option.flag[2:].replace("-", "_").upper()
        env[option.env] = values[option.flag]
    from_env = _load([], env)
    from_flags = _load([f"{flag}={value}" for flag, value in values.items()])
    assert from_env == from_flags
    defaults = settings.Settings()
    # Each variable was read (--metrics-secure's false is tested above: a certificate
    # directory needs it true, its default).
    assert [
        o.field
        for o in settings.OPTIONS
        if getattr(from_env, o.field) == getattr(defaults, o.field)
    ] == ["metrics_secure"]


def test_credentials_are_read_only_in_the_named_or_else_the_watched_namespaces() -> None:
    watched = _load(["--namespace", "tenant-a", "--namespace", "clusters-a"])
    assert watched.secret_namespaces == {"tenant-a", "clusters-a"}
    settings.require_secret_namespaces(watched)
    named = _load(["--namespace", "tenant-a", "--credential-namespace", "vcenter-creds"])
    assert named.secret_namespaces == {"vcenter-creds"}
    from_env = _load([], {"AGENT_FORGE_CREDENTIAL_NAMESPACE": "tenant-a,tenant-b"})
    assert not from_env.namespaces
    assert from_env.secret_namespaces == {"tenant-a", "tenant-b"}
    settings.require_secret_namespaces(from_env)


def test_watching_all_namespaces_without_credential_namespaces_refuses_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty list is no grant of every namespace: the operator does not start."""
    for variable in ("AGENT_FORGE_NAMESPACE", "AGENT_FORGE_CREDENTIAL_NAMESPACE"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["run"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("agentforge run: error: --credential-namespace is required")
    assert "Traceback" not in err
    everything = _load([])
    assert everything.secret_namespaces == frozenset()
    with pytest.raises(settings.SettingsError) as refused:
        settings.require_secret_namespaces(everything)
    message = str(refused.value)
    assert "--credential-namespace is required" in message
    assert "agent-forge-credentials-reader" in message
    assert "AGENT_FORGE_CREDENTIAL_NAMESPACE" in message
    with pytest.raises(settings.SettingsError, match="not a namespace name"):
        _load(["--credential-namespace", "Tenant_A"])
