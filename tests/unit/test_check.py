"""`agentforge check` without a cluster: manifests, rendering, exit codes, usage errors."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from agentforge import __main__ as cli
from agentforge.check import command as check
from agentforge.check.render import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    Item,
    PoolReport,
    Report,
    Status,
    UsageError,
    render_json,
    render_text,
    render_usage_json,
)

GO_POOL = Path(__file__).parent / "api" / "fixtures" / "go_pool.yaml"


def pool_doc(name: str = "workers", **spec_changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hostedClusterRef": {"name": "hc1"},
        "nodePoolRef": {"name": name},
        "infraEnvRef": {"name": "discovery"},
        "controlPlaneNamespace": "clusters-hc1",
        "vsphere": {
            "credentialsSecretRef": {"name": "vsphere-credentials"},
            "datastoreCluster": "dsc1",
            "isoDatastore": "iso-ds",
            "resourcePool": "cluster/Resources",
            "network": "VM Network",
        },
        "template": {},
        "agent": {"labels": {"agent-pool": name}},
    }
    spec.update(spec_changes)
    return {
        "apiVersion": "agent-forge.containeroo.ch/v1alpha1",
        "kind": "VsphereAgentPool",
        "metadata": {"name": name},
        "spec": spec,
    }


def load(*docs: Any, text: str | None = None) -> tuple[list[check.Target], list[UsageError]]:
    body = text if text is not None else yaml.safe_dump_all(docs)
    return check.load_manifests(body, source="pools.yaml", default_namespace="team-a")


# --- manifests --------------------------------------------------------------------------


def test_every_document_is_a_pool_with_defaults_and_the_default_namespace() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [pool_doc("c")]}
    other_ns = pool_doc("b")
    other_ns["metadata"]["namespace"] = "team-b"
    targets, errors = load(pool_doc("a"), other_ns, listed)
    assert errors == []
    assert [t.source for t in targets] == [f"pools.yaml document {i}" for i in (1, 2, 3)]
    pools = [t.pool for t in targets]
    assert [(p.metadata.namespace, p.metadata.name) for p in pools if p] == [
        ("team-a", "a"),
        ("team-b", "b"),
        ("team-a", "c"),
    ]
    first = pools[0]
    assert first is not None
    assert first.effective_folder() == "hc1"
    assert first.spec.template.num_cpus == 4


def test_a_pool_as_the_go_operator_writes_it_is_accepted() -> None:
    targets, errors = check.load_manifests(
        GO_POOL.read_text(), source="go.yaml", default_namespace="x"
    )
    assert errors == []
    assert [t.pool.metadata.key for t in targets if t.pool] == ["demo/demo-worker"]


def test_schema_errors_are_reported_per_field_with_their_document() -> None:
    bad = pool_doc(template={"numCPUs": 500}, cleanupPolicy="Sometimes")
    del bad["spec"]["vsphere"]["network"]
    targets, errors = load(pool_doc("fine"), bad)
    assert targets == [check.Target(source="pools.yaml document 1", pool=targets[0].pool)]
    found = {(e.source, e.field) for e in errors}
    assert found == {
        ("pools.yaml document 2", "spec.template.numCPUs"),
        ("pools.yaml document 2", "spec.cleanupPolicy"),
        ("pools.yaml document 2", "spec.vsphere.network"),
    }
    assert str(errors[0]).startswith("pools.yaml document 2: spec.")


def test_unknown_and_snake_case_fields_are_usage_errors() -> None:
    doc = pool_doc()
    doc["spec"]["vsphere"]["folderr"] = "x"
    doc["spec"]["vsphere"]["datastore_cluster"] = doc["spec"]["vsphere"].pop("datastoreCluster")
    doc["spec"]["agent"]["labels"]["any-key"] = "maps take any key"
    targets, errors = load(doc)
    assert targets == []
    fields = {e.field: e.message for e in errors}
    assert "unknown field" in fields["spec.vsphere.folderr"]
    assert "unknown field" in fields["spec.vsphere.datastore_cluster"]
    assert fields["spec.vsphere.datastoreCluster"] == "Field required"
    assert not any("labels" in f for f in fields)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, "v1 ConfigMap"),
        (["a", "list"], "is a list"),
        ({"apiVersion": "agent-forge.containeroo.ch/v1alpha1", "kind": "VsphereAgent"}, "Agent,"),
    ],
)
def test_other_documents_are_usage_errors(doc: Any, words: str) -> None:
    targets, errors = load(doc)
    assert targets == []
    (error,) = errors
    assert words in error.message
    assert "VsphereAgentPool" in error.message


def test_a_pool_without_a_name_is_a_usage_error() -> None:
    doc = pool_doc()
    doc["metadata"] = {}
    targets, errors = load(doc)
    assert targets == []
    assert [(e.field, e.message) for e in errors] == [("metadata.name", "required")]


def test_bad_yaml_names_line_and_column() -> None:
    targets, errors = load(text="spec:\n  a: [1, 2\n")
    assert targets == []
    (error,) = errors
    assert error.message.startswith("not valid YAML: line 3, column 1:")


def test_an_empty_file_is_a_usage_error() -> None:
    assert load(text="---\n")[1] == [UsageError("pools.yaml", "no VsphereAgentPool in it")]


# --- rendering and exit codes -----------------------------------------------------------


def sample_report(*statuses: Status) -> Report:
    items = [
        Item("infraenv", status, f"InfraEnv ns/ie-{status.value}", f"is {status.value}", "do x")
        for status in statuses
    ]
    return Report([PoolReport("ns/workers", "pools.yaml document 1", items)])


def rendered(report: Report) -> str:
    out = io.StringIO()
    render_text(report, Console(file=out, width=40, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ((Status.PASS,), EXIT_OK),
        ((Status.PASS, Status.WARN, Status.SKIP), EXIT_OK),
        ((Status.PASS, Status.FAIL), EXIT_FAIL),
        ((Status.FAIL, Status.WARN), EXIT_FAIL),
    ],
)
def test_only_failures_fail(statuses: tuple[Status, ...], code: int) -> None:
    report = sample_report(*statuses)
    assert report.exit_code == code
    assert json.loads(render_json(report))["exitCode"] == code


def test_text_has_one_unwrapped_line_per_item_with_symbol_and_fix() -> None:
    text = rendered(sample_report(Status.PASS, Status.FAIL, Status.WARN, Status.SKIP))
    lines = text.splitlines()
    assert lines[0] == "VsphereAgentPool ns/workers  (pools.yaml document 1)"
    assert lines[1:5] == [
        "  ✓ InfraEnv ns/ie-pass: is pass",
        "  ✗ InfraEnv ns/ie-fail: is fail → do x",
        "  ! InfraEnv ns/ie-warn: is warn → do x",
        "  - InfraEnv ns/ie-skip: is skip",
    ]
    assert lines[-1] == "1 pool checked: 1 failed (1 problem), 1 warning"


def test_text_summary_when_all_passed_and_markup_is_not_interpreted() -> None:
    report = Report(
        [
            PoolReport("a/b", "cluster", [Item("vsphere", Status.PASS, "[iso-ds] x", "[bold]ok")]),
            PoolReport("a/c", "cluster", []),
        ]
    )
    text = rendered(report)
    assert "✓ [iso-ds] x: [bold]ok" in text
    assert text.splitlines()[-1] == "2 pools checked: all checks passed"


def test_json_report_shape() -> None:
    body = json.loads(render_json(sample_report(Status.PASS, Status.FAIL)))
    assert body["ok"] is False
    (pool,) = body["pools"]
    assert pool["pool"] == "ns/workers"
    assert pool["source"] == "pools.yaml document 1"
    assert pool["items"][1] == {
        "check": "infraenv",
        "status": "fail",
        "subject": "InfraEnv ns/ie-fail",
        "message": "is fail",
        "fix": "do x",
    }
    usage = json.loads(render_usage_json([UsageError("f", "bad", "spec.x")]))
    assert usage == {
        "ok": False,
        "exitCode": EXIT_USAGE,
        "errors": [{"source": "f", "field": "spec.x", "message": "bad"}],
    }


# --- the command line --------------------------------------------------------------------


def test_usage_errors_exit_2_without_asking_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(yaml.safe_dump(pool_doc(template={"diskGiB": 1})))
    assert cli.main(["check", "-f", str(manifest), "--kubeconfig", "/nonexistent"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"✗ {manifest} document 1: spec.template.diskGiB: Input should be greater" in err

    args = ["check", "-f", str(manifest), "-o", "json"]
    assert cli.main(args) == EXIT_USAGE
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["field"] == "spec.template.diskGiB"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--pool", "only-a-name"], "--pool: 'only-a-name' is not NAMESPACE/NAME"),
        (["--pool", "a/b", "--as-serviceaccount", "x"], "--as-serviceaccount: 'x' is not"),
        (["-f", "/nonexistent/pool.yaml"], "/nonexistent/pool.yaml: cannot be read"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check", *argv]) == EXIT_USAGE
    assert words in capsys.readouterr().err


def test_an_unusable_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(yaml.safe_dump(pool_doc()))
    argv = ["check", "-f", str(manifest), "--kubeconfig", str(tmp_path / "missing")]
    assert cli.main(argv) == EXIT_USAGE
    assert "kubeconfig: kubeconfig" in capsys.readouterr().err


def test_argparse_errors_exit_2_and_check_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["check", "-f", "a.yaml", "--pool", "a/b"])
    assert exited.value.code == EXIT_USAGE
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "check" in capsys.readouterr().out
