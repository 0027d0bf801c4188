"""Offline validation of everything under `config/` (`make lint`; no cluster, no network).

What is checked, and against what:

* every `*.yaml` parses, and every kustomization renders with kustomize itself
  (`scripts.kustomize`, the pinned binary): resources and generator files exist, no
  object is defined twice; every YAML file is named by a kustomization, so nothing
  shipped is left out of `kubectl apply -k` by accident;
* Kubernetes kinds against the OpenAPI schemas bundled with `kubernetes-validate`,
  strictly (unknown fields are errors), for the oldest and the newest Kubernetes
  version we support (`KUBERNETES_VERSIONS`);
* our own kinds (VsphereAgentPool, VsphereAgent) against the `openAPIV3Schema` of the
  generated CRDs in `config/crd`, with unknown fields refused as the API server
  would prune them (CEL rules are left to the API server tests);
* ServiceMonitor and PrometheusRule, cert-manager's Certificate and Issuer (whose
  CRDs are not ours) against the minimal schemas below, plus a structural check of
  each PromQL expression;
* the Grafana dashboard JSON: parses, unique panel ids, every target has an `expr`;
* every Pod template against OpenShift's `restricted-v2` SCC and the `restricted` Pod
  Security Standard, rule by rule (`scripts.pod_security`);
* every metric an alert or a dashboard panel queries is one the operator exports
  (`exported_metric_names`: the names registered once every `agentforge` module is
  imported), so a renamed metric cannot leave a silent alert behind.

Run as `python -m scripts.validate_manifests [DIR]`; exit 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from scripts import kustomize, pod_security

__all__ = [
    "KUBERNETES_VERSIONS",
    "Problem",
    "crd_schemas",
    "exported_metric_names",
    "main",
    "promql_metric_names",
    "validate_config",
    "validate_object",
]

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
KUBERNETES_VERSIONS = ("1.27", "1.36")
"""Oldest supported (OpenShift 4.14, the first with HyperShift's Agent platform GA) and
newest (the version the test control plane runs)."""

OUR_GROUP = "agent-forge.containeroo.ch"
MONITORING_GROUP = "monitoring.coreos.com"
CERT_MANAGER_GROUP = "cert-manager.io"

JsonObj = dict[str, Any]
Problem = str

_DURATION = r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
    "additionalProperties": False,
}
SERVICE_MONITOR_SCHEMA: JsonObj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": f"{MONITORING_GROUP}/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": _SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "additionalProperties": False,
                },
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                            "tlsConfig": {"type": "object"},
                            "bearerTokenFile": {"type": "string"},
                            "authorization": {"type": "object"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
PROMETHEUS_RULE_SCHEMA: JsonObj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": f"{MONITORING_GROUP}/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {
                                            "type": "string",
                                            "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                                        },
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "keep_firing_for": {"type": "string"},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                    "additionalProperties": False,
                                },
                            },
                        },
                        "additionalProperties": False,
                    },
                }
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
_MONITORING_SCHEMAS = {
    "ServiceMonitor": SERVICE_MONITOR_SCHEMA,
    "PrometheusRule": PROMETHEUS_RULE_SCHEMA,
}
_ISSUER_REF: JsonObj = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "group": {"type": "string"},
    },
    "additionalProperties": False,
}
_CERT_MANAGER_SCHEMAS: dict[str, JsonObj] = {
    "Certificate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": f"{CERT_MANAGER_GROUP}/v1"},
            "kind": {"const": "Certificate"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "properties": {
                    "secretName": {"type": "string", "minLength": 1},
                    "issuerRef": _ISSUER_REF,
                    "isCA": {"type": "boolean"},
                    "commonName": {"type": "string", "maxLength": 64},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "duration": {"type": "string", "pattern": _DURATION},
                    "renewBefore": {"type": "string", "pattern": _DURATION},
                    "privateKey": {
                        "type": "object",
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                        "additionalProperties": False,
                    },
                    "usages": {"type": "array", "items": {"type": "string"}},
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
    "Issuer": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": f"{CERT_MANAGER_GROUP}/v1"},
            "kind": {"const": "Issuer"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "oneOf": [{"required": ["selfSigned"]}, {"required": ["ca"]}],
                "properties": {
                    "selfSigned": {"type": "object"},
                    "ca": {
                        "type": "object",
                        "required": ["secretName"],
                        "properties": {"secretName": {"type": "string", "minLength": 1}},
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
}
_SEVERITIES = frozenset({"critical", "warning", "info"})


# --- schemas of our kinds --------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """A copy where objects with `properties` refuse unknown fields (the apiserver prunes
    them, which would silently drop a misspelt field of a sample)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schemas(crd_dir: Path = CONFIG / "crd") -> dict[tuple[str, str], JsonObj]:
    """`{(apiVersion, kind): strict openAPIV3Schema}` of every CRD in `crd_dir`."""
    schemas: dict[tuple[str, str], JsonObj] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = schema
    return schemas


# --- PromQL (structure only) -------------------------------------------------------------

_PAIRS = {")": "(", "]": "[", "}": "{"}


def promql_problems(expr: str) -> list[Problem]:
    """Structural mistakes in a PromQL expression: unbalanced brackets or quotes."""
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for char in expr:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            continue
        if char in "\"'`":
            quote = char
        elif char in "([{":
            stack.append(char)
        elif char in ")]}" and (not stack or stack.pop() != _PAIRS[char]):
            return [f"unbalanced {char!r}"]
    if quote:
        return [f"unterminated {quote} string"]
    if stack:
        return [f"unclosed {stack[-1]!r}"]
    return []


def _rule_problems(obj: Mapping[str, Any]) -> Iterator[Problem]:
    names: set[str] = set()
    for group in obj["spec"]["groups"]:
        for rule in group["rules"]:
            label = rule.get("alert") or rule.get("record")
            for problem in promql_problems(rule["expr"]):
                yield f"rule {label}: {problem}"
            for name in _unknown_metrics(rule["expr"]):
                yield f"rule {label}: metric {name} is not exported by the operator"
            if "alert" in rule:
                if rule["alert"] in names:
                    yield f"alert {rule['alert']} is defined twice"
                names.add(rule["alert"])
                severity = (rule.get("labels") or {}).get("severity")
                if severity not in _SEVERITIES:
                    allowed = sorted(_SEVERITIES)
                    yield f"alert {rule['alert']}: severity {severity!r} not in {allowed}"
                if not (rule.get("annotations") or {}).get("summary"):
                    yield f"alert {rule['alert']}: no summary annotation"


# --- metric names ----------------------------------------------------------------------

# Series every Prometheus target has, and suffixes client libraries add to a family.
_TARGET_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
_PROMQL_WORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"offset", "bool", "inf", "nan", "atan2", "x"}
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


@cache
def exported_metric_names() -> frozenset[str]:
    """Every sample name the operator can export (metrics of all modules registered)."""
    from prometheus_client import REGISTRY  # noqa: PLC0415 (only this check needs it)

    import agentforge  # noqa: PLC0415

    for module in pkgutil.walk_packages(agentforge.__path__, "agentforge."):
        importlib.import_module(module.name)
    names: set[str] = set()
    for collector in list(REGISTRY._collector_to_names):
        names.update(REGISTRY._collector_to_names[collector])
    return frozenset(names | _TARGET_SERIES)


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, labels, keywords aside)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists
    text = re.sub(r"\boffset\s+\S+", " ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        after = text[match.end() :].lstrip()
        if after.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue  # a function call or a keyword
        if match.start() and text[match.start() - 1].isdigit():
            continue  # a unit of a number, e.g. 1e3
        names.add(word)
    return names


def _unknown_metrics(expr: str) -> list[str]:
    return sorted(promql_metric_names(expr) - exported_metric_names())


# --- objects ---------------------------------------------------------------------------


def validate_object(
    obj: Mapping[str, Any], *, crds: Mapping[tuple[str, str], JsonObj]
) -> list[Problem]:
    """Problems of one object (empty when it is valid)."""
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    group = api_version.rpartition("/")[0]
    if group == OUR_GROUP:
        schema = crds.get((api_version, kind))
        if schema is None:
            return [f"{kind} {api_version}: no CRD in config/crd serves it"]
        body = {k: v for k, v in obj.items() if k != "metadata"}
        problems = _jsonschema_problems({**schema, "properties": _no_meta(schema)}, body)
        meta = obj.get("metadata") or {}
        if not meta.get("namespace"):
            problems.append("metadata.namespace: our kinds are namespaced; set it")
        return problems
    if group == CERT_MANAGER_GROUP:
        cm_schema = _CERT_MANAGER_SCHEMAS.get(kind)
        if cm_schema is None:
            return [f"{kind}: no schema for this cert-manager kind; add one to {__name__}"]
        return _jsonschema_problems(cm_schema, obj)
    if group == MONITORING_GROUP:
        mon_schema = _MONITORING_SCHEMAS.get(kind)
        if mon_schema is None:
            return [f"{kind}: no schema for this monitoring kind; add one to {__name__}"]
        problems = _jsonschema_problems(mon_schema, obj)
        if not problems and kind == "PrometheusRule":
            problems.extend(_rule_problems(obj))
        return problems
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(dict(obj), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "(root)"
            problems.append(f"Kubernetes {version}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"Kubernetes {version}: {exc.message}")
    for pod in pod_security.pod_templates(obj):
        problems.extend(f"pod security: {v}" for v in pod_security.violations(pod))
    return problems


def _no_meta(schema: Mapping[str, Any]) -> JsonObj:
    return {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}


def _jsonschema_problems(schema: Mapping[str, Any], obj: Mapping[str, Any]) -> list[Problem]:
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]


# --- the whole tree --------------------------------------------------------------------


def _yaml_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.name != kustomize.KUSTOMIZATION)


def _kustomizations(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(kustomize.KUSTOMIZATION))


def validate_dashboard(path: Path) -> list[Problem]:
    try:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    problems: list[Problem] = []
    ids: set[int] = set()
    for panel in dashboard.get("panels", []):
        if panel.get("id") in ids:
            problems.append(f"panel id {panel.get('id')} is used twice")
        ids.add(panel.get("id"))
        if panel.get("type") == "row":
            continue
        if not panel.get("targets"):
            problems.append(f"panel {panel.get('title')!r} has no targets")
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            if not expr:
                problems.append(f"panel {panel.get('title')!r}: a target without expr")
            problems.extend(
                f"panel {panel.get('title')!r}: {p}" for p in promql_problems(_grafana(expr))
            )
            problems.extend(
                f"panel {panel.get('title')!r}: metric {name} is not exported by the operator"
                for name in _unknown_metrics(_grafana(expr))
            )
    return problems


def _grafana(expr: str) -> str:
    """Grafana's `$var` and `${var}` placeholders made neutral for the structure check."""
    return re.sub(r"\$\{?\w+\}?", "x", expr)


def validate_config(root: Path = CONFIG) -> tuple[int, list[Problem]]:
    """(objects checked, problems) for every manifest under `root`."""
    problems: list[Problem] = []
    try:
        kustomize.binary()
    except kustomize.KustomizeError as exc:
        return 0, [str(exc)]
    crds = crd_schemas(root / "crd")
    reachable: set[Path] = set()
    for directory in _kustomizations(root):
        rel = directory.relative_to(root.parent)
        try:
            kustomize.build(directory)
        except kustomize.KustomizeError as exc:
            problems.append(f"{rel}: {exc}")
        reachable.update(kustomize.listed_files(directory))
    checked = 0
    for path in _yaml_files(root):
        rel = path.relative_to(root.parent)
        if path.resolve() not in reachable:
            problems.append(f"{rel}: not listed by any kustomization.yaml")
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        except yaml.YAMLError as exc:
            problems.append(f"{rel}: {exc}")
            continue
        for doc in docs:
            checked += 1
            label = f"{rel}: {doc.get('kind')} {(doc.get('metadata') or {}).get('name')}"
            problems.extend(f"{label}: {p}" for p in validate_object(doc, crds=crds))
    for path in sorted(root.rglob("*.json")):
        checked += 1
        rel = path.relative_to(root.parent)
        problems.extend(f"{rel}: {p}" for p in validate_dashboard(path))
    return checked, problems


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.validate_manifests")
    parser.add_argument("root", nargs="?", type=Path, default=CONFIG)
    args = parser.parse_args(None if argv is None else list(argv))
    checked, problems = validate_config(args.root)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in {args.root}", file=sys.stderr)
        return 1
    versions = " and ".join(KUBERNETES_VERSIONS)
    print(f"{checked} manifests under {args.root} valid (Kubernetes {versions} schemas)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
