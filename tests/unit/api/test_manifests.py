"""`manifests` writes deterministic files, and `--check` fails on drift with a diff."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentforge import manifests

REPO = Path(__file__).parents[3]


def test_writing_twice_produces_identical_files(tmp_path: Path) -> None:
    config = tmp_path / "config"
    assert manifests.main(config, check=False) == 0
    first = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert manifests.main(config, check=False) == 0
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == first
    assert (tmp_path / "docs" / "reference" / "api.md") in first


def test_check_passes_on_fresh_output(tmp_path: Path) -> None:
    config = tmp_path / "config"
    manifests.main(config, check=False)
    assert manifests.main(config, check=True) == 0


def test_check_reports_a_changed_file_with_a_diff_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    manifests.main(config, check=False)
    role = config / "rbac" / "role.yaml"
    role.write_text(role.read_text().replace("agent-forge-manager-role", "edited"))
    assert manifests.main(config, check=True) == 1
    out, err = capsys.readouterr()
    assert "-  name: edited" in out
    assert "+  name: agent-forge-manager-role" in out
    assert "make manifests" in err
    assert "edited" in role.read_text()


def test_check_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    manifests.main(config, check=False)
    (config / "crd" / "kustomization.yaml").unlink()
    assert manifests.main(config, check=True) == 1
    assert "/dev/null" in capsys.readouterr().out


def test_generated_yaml_parses_to_one_document_per_file(tmp_path: Path) -> None:
    config = tmp_path / "config"
    manifests.main(config, check=False)
    for path in config.rglob("*.yaml"):
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert len(documents) == 1, path


def test_committed_manifests_are_current() -> None:
    manifests.load_declarations()
    assert manifests.drift(manifests.render_files(REPO / "config")) == ""
