"""The user docs agree with the code: generated tables current, names real, links alive.

Docs drift silently; these tests pin every name a reader might copy from them
(condition and event reasons, metric names, make targets, the demo's objects)
to the code that defines it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agentforge.api.conditions import (
    ISOEjectedReason,
    PoolConditionType,
    PoolReason,
    VsphereAgentConditionType,
    VsphereAgentReason,
)
from agentforge.api.pool import PlannedActionType
from agentforge.api.vm import VMPhase, VMReason
from agentforge.reconcilers.ejection_status import EjectionEvent
from agentforge.reconcilers.event_reasons import InfraEvent, VmEvent
from agentforge.reconcilers.metrics import CapacityState
from agentforge.reconcilers.pool import PoolEvent
from agentforge.reconcilers.scaleup import ScaleUpEvent
from scripts import settings_reference, validate_manifests
from sim.world import DEFAULT_INFRAENV, DEFAULT_SECRET, samples

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
OPERATIONS = DOCS / "operations.md"
USER_DOCS = [*sorted(DOCS.glob("*.md")), REPO / "README.md"]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", _text(path), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_settings_table_in_configuration_md_matches_the_code() -> None:
    current = _text(settings_reference.TARGET)
    assert settings_reference.update(current) == current, "run `make docs`"
    for flag in ("--leader-elect", "--namespace", "--vsphere-qps", "--log-format"):
        assert f"`{flag}" in current


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", _text(path), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = bool(anchor) and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize(
    "names",
    [
        PoolConditionType,
        PoolReason,
        VsphereAgentConditionType,
        VsphereAgentReason,
        ISOEjectedReason,
        VMPhase,
        VMReason,
        PlannedActionType,
        PoolEvent,
        InfraEvent,
        VmEvent,
        ScaleUpEvent,
        EjectionEvent,
        CapacityState,
    ],
    ids=lambda e: e.__name__,
)
def test_every_reason_phase_and_state_is_documented_in_operations(names: type) -> None:
    text = _text(OPERATIONS)
    missing = [member.value for member in names if f"`{member.value}`" not in text]
    assert missing == []


def _families() -> set[str]:
    exported = validate_manifests.exported_metric_names()
    suffixes = ("_total", "_created", "_bucket", "_sum", "_count", "_info")
    return {n for n in exported if not n.endswith(suffixes)} | {
        n for n in exported if n.endswith(("_total", "_info"))
    }


def test_every_operator_metric_is_documented_in_operations() -> None:
    text = _text(OPERATIONS)
    ours = {
        n
        for n in _families()
        if n.startswith(("agent_forge_", "workqueue_", "leader_election_"))
        and f"{n}_total" not in _families()
        and f"{n}_info" not in _families()
    }
    missing = sorted(n for n in ours if f"`{n}`" not in text)
    assert missing == []


def test_every_metric_named_in_the_docs_exists() -> None:
    exported = validate_manifests.exported_metric_names()
    pattern = r"`((?:agent_forge|workqueue|leader_election|process)_[a-z_]+)"
    named = {m for path in USER_DOCS for m in re.findall(pattern, _text(path))}
    assert named, "the docs name metrics"
    assert sorted(n for n in named if n not in exported and not n.endswith("_")) == []


def _make_targets() -> set[str]:
    makefile = _text(REPO / "Makefile")
    return set(re.findall(r"^([a-zA-Z][\w-]*):", makefile, flags=re.M))


def test_make_targets_named_in_the_docs_exist() -> None:
    command = re.compile(r"(?:`|^)make ([a-z][a-z0-9-]*)", flags=re.M)  # in code, not prose
    named = {m for path in USER_DOCS for m in command.findall(_text(path))}
    assert {"deploy", "install", "demo"} <= named
    assert sorted(named - _make_targets()) == []


def test_alerts_point_at_sections_that_exist() -> None:
    rule = yaml.safe_load(_text(REPO / "config" / "prometheus" / "prometheus_rule.yaml"))
    cited = []
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            description = alert["annotations"].get("description", "")
            cited += re.findall(r"docs/([\w.-]+\.md), \"([^\"]+)\"", description)
    assert cited, "alert descriptions cite the docs"
    missing = [
        f"{doc}: {title}" for doc, title in cited if _slug(title) not in _anchors(DOCS / doc)
    ]
    assert missing == []


def _guide_pool() -> dict[str, object]:
    guide = _text(DOCS / "getting-started.md")
    heredoc = re.search(r"kubectl apply -f - <<'EOF'\n(.*?)\nEOF", guide, flags=re.S)
    assert heredoc, "the guide creates a pool from a heredoc"
    pool = yaml.safe_load(heredoc.group(1))
    assert isinstance(pool, dict)
    return pool


def test_getting_started_uses_the_names_of_the_demo() -> None:
    from sim import demo  # noqa: PLC0415 (imports rich; only this test needs it)

    guide = _text(DOCS / "getting-started.md")
    assert (demo.POOL_NAMESPACE, demo.CONTROL_PLANE_NAMESPACE, demo.HOSTED_CLUSTER) == (
        "demo",
        "clusters-demo",
        "demo",
    )
    assert demo.STATE.name == "demo-state"
    assert 'workdir=state / "controlplane"' in _text(REPO / "sim" / "demo.py")
    assert "$PWD/demo-state/controlplane/admin.kubeconfig" in guide
    assert f"get infraenv {DEFAULT_INFRAENV} " in guide
    assert f"get secret {DEFAULT_SECRET} " in guide
    assert demo.LEASE_NAME in guide

    pool = _guide_pool()
    spec = pool["spec"]
    assert isinstance(spec, dict)
    assert spec["controlPlaneNamespace"] == demo.CONTROL_PLANE_NAMESPACE
    assert spec["hostedClusterRef"] == {"name": demo.HOSTED_CLUSTER}
    assert spec["infraEnvRef"] == {"name": DEFAULT_INFRAENV}
    reference = samples.pool_manifest(
        name="x",
        namespace=demo.POOL_NAMESPACE,
        control_plane_namespace=demo.CONTROL_PLANE_NAMESPACE,
        hosted_cluster=demo.HOSTED_CLUSTER,
        nodepool="x",
        infraenv=DEFAULT_INFRAENV,
        secret=DEFAULT_SECRET,
        labels={"agent-pool": "x"},
    )
    assert spec["vsphere"] == reference["spec"]["vsphere"], "the simulator's inventory"


def test_getting_started_pool_is_valid_against_the_crd() -> None:
    crds = validate_manifests.crd_schemas()
    assert validate_manifests.validate_object(_guide_pool(), crds=crds) == []


def test_the_reasons_marked_logged_in_operations_are_exactly_the_actionable_ones() -> None:
    from agentforge.api.conditions import ACTIONABLE  # noqa: PLC0415

    text = _text(OPERATIONS)
    marked: set[tuple[str, str, str]] = set()
    for kind, start, end in (
        ("VsphereAgentPool", "### VsphereAgentPool\n", "### Sharing a credentials Secret"),
        ("VsphereAgent", "### VsphereAgent\n", "### VM phases"),
    ):
        section = text[text.index(start) : text.index(end)]
        condition = ""
        for row in re.finditer(r"^\| (?:`(\w+)`)? *\| `(\w+)` \| ([^|]+) \|", section, re.M):
            condition = row.group(1) or condition
            if "logged" in row.group(3):
                marked.add((kind, condition, row.group(2)))
    assert marked == {(a.kind, a.type, a.reason) for a in ACTIONABLE}
