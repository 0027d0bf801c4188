"""Every Pod template under config/ is admitted by OpenShift's restricted-v2 SCC and the
restricted Pod Security Standard; each rule of the checker catches its violation.

The templates are read as kustomize assembles them (`scripts.kustomize`: the pinned
kustomize, which tests/packaging/test_kustomize.py compares with the kubectl
`make deploy` applies with), from every kustomization under config/, so a Pod template
added anywhere is checked. The
rules themselves are in `scripts/pod_security.py`, one by one with their source.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scripts import kustomize, pod_security

CONFIG = Path(__file__).resolve().parents[2] / "config"

Pod = dict[str, Any]


@functools.cache
def _shipped_templates() -> list[tuple[str, Pod]]:
    """Read when a test asks (not at collection): without kustomize, the tests fail saying
    how to build it, and every other test of the run still runs."""
    found: dict[str, Pod] = {}
    for kustomization in sorted(CONFIG.rglob(kustomize.KUSTOMIZATION)):
        for obj in kustomize.build(kustomization.parent):
            for pod in pod_security.pod_templates(obj):
                meta = obj["metadata"]
                found[f"{obj['kind']} {meta.get('namespace')}/{meta['name']}"] = dict(pod)
    return sorted(found.items())


def _manager() -> Pod:
    (pod,) = [pod for name, pod in _shipped_templates() if name.startswith("Deployment ")]
    return copy.deepcopy(pod)


def test_config_holds_the_operator_deployment() -> None:
    assert [name for name, _ in _shipped_templates()] == [
        "Deployment agent-forge-system/agent-forge-controller-manager"
    ]


def test_every_shipped_pod_template_meets_restricted_v2_and_the_restricted_standard() -> None:
    violations = {name: pod_security.violations(pod) for name, pod in _shipped_templates()}
    assert violations == {name: [] for name in violations}


def _container(pod: Pod) -> dict[str, Any]:
    container: dict[str, Any] = pod["containers"][0]
    return container


def _set(path: str, value: Any) -> Callable[[Pod], None]:
    """A mutation setting a dotted path; `c.` addresses the first container."""

    def mutate(pod: Pod) -> None:
        target: dict[str, Any] = pod
        keys = path.split(".")
        if keys[0] == "c":
            target, keys = _container(pod), keys[1:]
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value

    return mutate


def _delete(path: str) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        target: dict[str, Any] = pod
        keys = path.split(".")
        if keys[0] == "c":
            target, keys = _container(pod), keys[1:]
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return mutate


def _both(*mutations: Callable[[Pod], None]) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        for mutation in mutations:
            mutation(pod)

    return mutate


def _add_volume(volume: dict[str, Any]) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        pod.setdefault("volumes", []).append(volume)

    return mutate


def _add_init_container(pod: Pod) -> None:
    # An init container copied from the manager, but one that forgot to drop capabilities:
    # init containers are checked like the others.
    init = copy.deepcopy(_container(pod))
    del init["securityContext"]["capabilities"]
    pod["initContainers"] = [{**init, "name": "init"}]


# One failing example per rule: the shipped template with exactly one thing broken.
VIOLATIONS: dict[str, list[Callable[[Pod], None]]] = {
    "host-namespaces": [_set("hostNetwork", True), _set("hostPID", True), _set("hostIPC", True)],
    "privileged": [_set("c.securityContext.privileged", True)],
    "host-ports": [_set("c.ports", [{"containerPort": 8443, "hostPort": 8443}])],
    "volume-types": [
        _add_volume({"name": "host", "hostPath": {"path": "/var/run"}}),
        _add_volume({"name": "nfs", "nfs": {"server": "nfs.example", "path": "/"}}),
    ],
    "capabilities-drop-all": [
        _set("c.securityContext.capabilities", {"drop": ["NET_RAW"]}),
        _add_init_container,
    ],
    "capabilities-add": [_set("c.securityContext.capabilities.add", ["NET_ADMIN"])],
    "privilege-escalation": [
        _set("c.securityContext.allowPrivilegeEscalation", True),
        _delete("c.securityContext.allowPrivilegeEscalation"),
    ],
    "run-as-non-root": [
        _set("c.securityContext.runAsNonRoot", False),  # overrides the pod's true
        _both(_delete("c.securityContext.runAsNonRoot"), _delete("securityContext.runAsNonRoot")),
    ],
    "run-as-user-not-root": [_set("securityContext.runAsUser", 0)],
    "seccomp-runtime-default": [
        _delete("securityContext.seccompProfile"),
        _set("c.securityContext.seccompProfile", {"type": "Unconfined"}),
        _set("securityContext.seccompProfile", {"type": "Localhost", "localhostProfile": "x"}),
    ],
    "no-fixed-uid": [
        _set("securityContext.runAsUser", 65532),
        _set("c.securityContext.runAsUser", 1000),
    ],
    "no-fixed-fsgroup": [_set("securityContext.fsGroup", 65532)],
    "selinux": [
        _set("securityContext.seLinuxOptions", {"type": "spc_t"}),
        _set("c.securityContext.seLinuxOptions", {"level": "s0:c123,c456"}),
        _set("securityContext.seLinuxOptions", {"user": "system_u"}),
    ],
    "proc-mount": [_set("c.securityContext.procMount", "Unmasked")],
    "apparmor": [_set("c.securityContext.appArmorProfile", {"type": "Unconfined"})],
    "sysctls": [_set("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}])],
    "windows-host-process": [_set("securityContext.windowsOptions", {"hostProcess": True})],
    "no-fixed-gid": [
        _set("securityContext.runAsGroup", 65532),
        _set("c.securityContext.runAsGroup", 1000),
    ],
    "read-only-root-filesystem": [
        _set("c.securityContext.readOnlyRootFilesystem", False),
        _delete("c.securityContext.readOnlyRootFilesystem"),
    ],
}

# Violations that necessarily break a second rule too: UID 0 is also a fixed UID.
ALSO_BROKEN = {"run-as-user-not-root": {"no-fixed-uid"}}

EXAMPLES = [
    pytest.param(rule_id, mutate, id=f"{rule_id}-{i}")
    for rule_id, mutations in VIOLATIONS.items()
    for i, mutate in enumerate(mutations)
]


def test_every_rule_has_a_failing_example() -> None:
    assert set(VIOLATIONS) == {rule.id for rule in pod_security.RULES}


@pytest.mark.parametrize(("rule_id", "mutate"), EXAMPLES)
def test_the_checker_catches_each_violation(rule_id: str, mutate: Callable[[Pod], None]) -> None:
    pod = _manager()
    mutate(pod)
    found = pod_security.violations(pod)
    assert found, "the broken template passed"
    broken = {v.partition(":")[0] for v in found}
    assert rule_id in broken, found
    assert broken - {rule_id} == ALSO_BROKEN.get(rule_id, set()), found


def test_the_lint_reports_a_violation_in_a_manifest() -> None:
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {"template": {"spec": _manager()}},
    }
    deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 65532
    (pod,) = pod_security.pod_templates(deployment)
    assert pod_security.violations(pod) == ["no-fixed-uid: pod: runAsUser is fixed (65532)"]
