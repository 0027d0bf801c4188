"""The user docs agree with the code: generated tables current, names real, links alive.

Docs drift silently; these tests pin every name a reader might copy from them
(condition and event reasons, condition types, metric names, alert names, operator
flags, make targets, immutable fields, the demo's objects, the memory figures of the
benchmark) to the code that defines it. A failure names the page and the unknown name.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

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
from agentforge.reconcilers.common.event_reasons import InfraEvent, RuleEvent, VmEvent
from agentforge.reconcilers.ejection.status import EjectionEvent
from agentforge.reconcilers.pool.apply import PoolEvent
from agentforge.reconcilers.pool.reconcile import CapacityState
from agentforge.reconcilers.scaleup.reconcile import ScaleUpEvent
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
def test_every_reason_phase_and_state_is_documented_in_operations(names: type[Enum]) -> None:
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


# --- every name the docs use exists in the code ------------------------------------------
#
# Each test scans every page under docs/ (design records and the generated reference
# included) and the README, and fails listing "<page>: <unknown name>".

ALL_DOCS = [*sorted(DOCS.rglob("*.md")), REPO / "README.md"]
EXTERNAL_REASONS = frozenset({"NoSuitableAgents", "InstallationInProgress"})
"""Condition reasons of other projects the docs quote (CAPI's AgentMachine `Ready`, the
Assisted Installer's Agent `Installed`)."""
EXTERNAL_CONDITIONS = frozenset(
    {"Installed", "Bound", "ImageCreated", "Validated", "RequirementsMet"}
)
"""Condition types of the Assisted Installer's Agents and InfraEnvs."""


def _named(pattern: str, *, group: int = 1) -> list[tuple[str, str]]:
    """(page, name) for every match of `pattern` in every page."""
    return [
        (str(path.relative_to(REPO)), match.group(group))
        for path in ALL_DOCS
        for match in re.finditer(pattern, _text(path))
    ]


def _unknown(named: list[tuple[str, str]], known: set[str] | frozenset[str]) -> list[str]:
    return sorted({f"{page}: {name}" for page, name in named if name not in known})


def _assert_known(
    named: list[tuple[str, str]], known: set[str] | frozenset[str], what: str
) -> None:
    unknown = _unknown(named, known)
    assert not unknown, f"{what} named in the docs but not in the code:\n  " + "\n  ".join(unknown)


def _reasons() -> set[str]:
    enums: list[type[Enum]] = [
        PoolReason, VsphereAgentReason, ISOEjectedReason, VMReason,
        PoolEvent, InfraEvent, VmEvent, RuleEvent, ScaleUpEvent, EjectionEvent,
    ]  # fmt: skip
    return {member.value for enum in enums for member in enum} | EXTERNAL_REASONS


def _conditions() -> set[str]:
    types = {t.value for t in PoolConditionType} | {t.value for t in VsphereAgentConditionType}
    return types | EXTERNAL_CONDITIONS


def test_every_metric_named_in_the_docs_exists() -> None:
    named = _named(r"\b((?:agent_forge|workqueue|leader_election|process)_[a-z0-9_]*[a-z0-9])\b")
    assert named, "the docs name metrics"
    _assert_known(named, validate_manifests.exported_metric_names(), "metrics")


def test_every_alert_named_in_the_docs_is_a_rule() -> None:
    rule = yaml.safe_load(_text(REPO / "config" / "prometheus" / "prometheus_rule.yaml"))
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    named = _named(r"\b(AgentForge[A-Z]\w+)")
    assert named, "the docs name alerts"
    _assert_known(named, alerts, "alerts (config/prometheus/prometheus_rule.yaml)")


def test_every_operator_flag_named_in_the_docs_exists() -> None:
    """A flag of several words whose first word is one of the operator's (`--vsphere-...`,
    `--iso-...`, `--metrics-...`) must be a flag of `agentforge run` or `agentforge
    check` (one-word flags such as kubectl's `--as` are left alone)."""
    from agentforge import settings  # noqa: PLC0415
    from agentforge.check import command as check  # noqa: PLC0415

    ours = {option.flag for option in settings.OPTIONS}
    ours |= {flag for action in check.parser()._actions for flag in action.option_strings}
    words = {flag.removeprefix("--").split("-")[0] for flag in ours if flag.startswith("--")}
    named = [
        (page, flag)
        for page, flag in _named(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")
        if "-" in flag.removeprefix("--") and flag.removeprefix("--").split("-")[0] in words
    ]
    assert named, "the docs name flags"
    _assert_known(named, ours, "flags (settings.OPTIONS, agentforge check)")


def test_every_condition_reason_named_in_the_docs_exists() -> None:
    """`reason X`, `Type=False, X` / `Type=False/X` and `Type=False` alone name
    conditions and reasons; each must be one the code sets (or a quoted external one)."""
    reasons = _named(r"\breasons? `([A-Z]\w+)`")
    typed = r"`([A-Z]\w+)=(?:True|False|Unknown)(?:[,/] ?(?:reason )?([A-Z]\w+))?`"
    reasons += [(page, name) for page, name in _named(typed, group=2) if name]
    conditions = _named(typed)
    assert reasons, "the docs name condition reasons"
    _assert_known(reasons, _reasons(), "condition or event reasons")
    _assert_known(conditions, _conditions(), "condition types")


@pytest.mark.parametrize("page", ["operations.md", "iso-ejection.md", "upgrade.md"])
def test_every_reason_in_a_table_exists(page: str) -> None:
    """In a table with a `reason` column, each backticked reason is one the code has."""
    named: list[tuple[str, str]] = []
    column = None
    for line in _text(DOCS / page).splitlines():
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        if not cells:
            column = None
        elif column is None and "reason" in cells:
            column = cells.index("reason")
        elif column is not None and column < len(cells):
            named += [(page, m) for m in re.findall(r"^`([A-Z]\w+)`$", cells[column])]
    assert named or page != "operations.md"
    _assert_known(named, _reasons(), "reasons")


def test_the_immutable_fields_listed_in_upgrade_are_the_crds() -> None:
    from agentforge.api import crdgen  # noqa: PLC0415

    def immutable(schema: dict[str, Any], path: str) -> set[str]:
        found: set[str] = set()
        rules = schema.get("x-kubernetes-validations") or []
        if any(r.get("rule") == "self == oldSelf" for r in rules):
            found.add(path)
        for key, child in (schema.get("properties") or {}).items():
            found |= immutable(child, f"{path}.{key}" if path else key)
        return found

    fields: set[str] = set()
    for crd in crdgen.render_all().values():
        root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        fields |= immutable(root["properties"]["spec"], "spec")
    upgrade = _text(DOCS / "upgrade.md")
    section = upgrade[upgrade.index("**Nine spec fields are immutable.**") :]
    section = section[: section.index("\n\n- **")]
    listed = set(re.findall(r"`(spec\.[\w.]+)`", section.split("For `spec.vsphere.folder`")[0]))
    assert listed == fields
    assert len(fields) == 9, "the heading says nine"


def test_memory_figures_agree_with_the_benchmark() -> None:
    bench = _text(REPO / "bench" / "results" / "latest.md")
    steady = re.search(r"\| RSS, steady, caches synced \| ([\d.]+) \| MB", bench)
    empty = re.search(r"\| RSS, same process with empty caches \| ([\d.]+) \| MB", bench)
    per_object = re.search(r"\| cache cost per object \| ([\d,]+) \| bytes", bench)
    assert steady is not None
    assert empty is not None
    assert per_object is not None
    figures = [
        f"{round(float(steady.group(1)))} MB",
        f"{round(float(empty.group(1)))} MB",
        f"{int(per_object.group(1).replace(',', '')) / 1000:.1f} KB",
    ]
    manager = _text(REPO / "config" / "manager" / "manager.yaml")
    for page, text in (
        ("docs/installation.md", _text(DOCS / "installation.md")),
        ("docs/scaling.md", _text(DOCS / "scaling.md")),
        ("config/manager/manager.yaml", manager),
    ):
        assert [f for f in figures if f not in " ".join(text.split())] == [], page
    deployment = next(d for d in yaml.safe_load_all(manager) if d and d["kind"] == "Deployment")
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    request, limit = resources["requests"]["memory"], resources["limits"]["memory"]
    installation = _text(DOCS / "installation.md")
    for quantity in (request, limit):
        mib = f"{quantity.removesuffix('Mi')} MiB"
        assert mib in installation
        assert mib in _text(DOCS / "scaling.md")


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
