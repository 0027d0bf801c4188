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
    assert s.all_namespaces
    assert s.metrics_bind_address == settings.BindAddress("0.0.0.0", 8080)
    assert s.health_probe_bind_address == settings.BindAddress("0.0.0.0", 8081)
    assert not s.leader_elect
    assert s.leader_election_id == "agent-forge.containeroo.ch"
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (
        timedelta(seconds=15),
        timedelta(seconds=10),
        timedelta(seconds=2),
    )
    assert s.max_concurrent_reconciles == 1
    assert s.log_level is settings.LogLevel.INFO
    assert s.log_format is settings.LogFormat.JSON


def test_flag_wins_over_environment_and_environment_over_default() -> None:
    env = {"AGENT_FORGE_LOG_LEVEL": "debug", "AGENT_FORGE_MAX_CONCURRENT_RECONCILES": "4"}
    s = _load(["--log-level", "error"], env)
    assert s.log_level is settings.LogLevel.ERROR
    assert s.max_concurrent_reconciles == 4


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
