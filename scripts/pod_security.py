"""Pod templates against OpenShift's `restricted-v2` SCC and the `restricted` Pod Security Standard.

`make lint` (`scripts.validate_manifests`) runs `violations()` on every Pod template
under `config/`; `tests/packaging/test_pod_security.py` shows each rule catching a broken
template. The rules are written out one by one, each naming where it comes from:

* `PSS` - the upstream Pod Security Standards, profile `restricted` (which includes
  `baseline`): https://kubernetes.io/docs/concepts/security/pod-security-standards/
* `SCC` - OpenShift's default SecurityContextConstraints for namespaced workloads,
  `restricted-v2` (OpenShift 4.11+): no host namespaces, ports or paths, no
  privileged containers, `allowPrivilegeEscalation: false`, capabilities: drop ALL
  and add at most NET_BIND_SERVICE, seccomp `runtime/default`, volumes limited to
  configMap/csi/downwardAPI/emptyDir/ephemeral/persistentVolumeClaim/projected/secret,
  and `runAsUser`, `fsGroup` and SELinux levels allocated from the namespace's
  ranges (`openshift.io/sa.scc.*` annotations). A manifest cannot know those ranges,
  so it must leave the fields unset and let the SCC assign them.
* `image` - the contract of our image with OpenShift's arbitrary UID: the process
  runs as some UID in group 0 and the image's files are group-owned by 0, so a
  manifest must not pin another group, and the root filesystem is read-only.

A template "sets" a field when the pod's or any container's security context does;
container values override pod values as the kubelet applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RULES", "Rule", "pod_templates", "violations"]

JsonObj = Mapping[str, Any]

ALLOWED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
ALLOWED_ADDED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
ALLOWED_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ping_group_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})


@dataclass(frozen=True, slots=True)
class Rule:
    """One admission rule: an id, where it comes from, and its check over a pod spec."""

    id: str
    source: str
    text: str
    check: Callable[[JsonObj], Iterator[str]]


def _containers(pod: JsonObj) -> Iterator[JsonObj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or ()


def _sc(obj: JsonObj) -> JsonObj:
    return obj.get("securityContext") or {}


def _effective(pod: JsonObj, container: JsonObj, field: str) -> Any:
    """A security-context field as the kubelet applies it: the container's, else the pod's."""
    value = _sc(container).get(field)
    return _sc(pod).get(field) if value is None else value


def _name(container: JsonObj) -> str:
    return f"container {container.get('name', '?')}"


def _host_namespaces(pod: JsonObj) -> Iterator[str]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"{field}: true"


def _privileged(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        if _sc(c).get("privileged"):
            yield f"{_name(c)}: privileged: true"


def _host_ports(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        for port in c.get("ports") or ():
            if port.get("hostPort"):
                yield f"{_name(c)}: hostPort {port['hostPort']}"


def _volume_types(pod: JsonObj) -> Iterator[str]:
    for volume in pod.get("volumes") or ():
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            yield f"volume {volume.get('name')}: type {sorted(kinds - ALLOWED_VOLUMES)}"


def _drop_all(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        dropped = (_sc(c).get("capabilities") or {}).get("drop") or ()
        if "ALL" not in dropped:
            yield f"{_name(c)}: capabilities.drop does not include ALL"


def _added_capabilities(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        added = set((_sc(c).get("capabilities") or {}).get("add") or ())
        if added - ALLOWED_ADDED_CAPABILITIES:
            yield f"{_name(c)}: adds {sorted(added - ALLOWED_ADDED_CAPABILITIES)}"


def _privilege_escalation(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        if _sc(c).get("allowPrivilegeEscalation") is not False:
            yield f"{_name(c)}: allowPrivilegeEscalation is not false"


def _run_as_non_root(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        if _effective(pod, c, "runAsNonRoot") is not True:
            yield f"{_name(c)}: runAsNonRoot is not true (pod or container)"


def _not_uid_zero(pod: JsonObj) -> Iterator[str]:
    if _sc(pod).get("runAsUser") == 0:
        yield "pod: runAsUser: 0"
    for c in _containers(pod):
        if _sc(c).get("runAsUser") == 0:
            yield f"{_name(c)}: runAsUser: 0"


def _seccomp(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        profile = _effective(pod, c, "seccompProfile") or {}
        kind = profile.get("type") or "unset"
        if kind != "RuntimeDefault":
            yield f"{_name(c)}: seccompProfile is {kind}, not RuntimeDefault"


def _fixed(field: str) -> Callable[[JsonObj], Iterator[str]]:
    def check(pod: JsonObj) -> Iterator[str]:
        if _sc(pod).get(field) is not None:
            yield f"pod: {field} is fixed ({_sc(pod)[field]})"
        for c in _containers(pod):
            if _sc(c).get(field) is not None:
                yield f"{_name(c)}: {field} is fixed ({_sc(c)[field]})"

    return check


def _fs_group(pod: JsonObj) -> Iterator[str]:
    if _sc(pod).get("fsGroup") is not None:
        yield f"pod: fsGroup is fixed ({_sc(pod)['fsGroup']})"


def _selinux(pod: JsonObj) -> Iterator[str]:
    contexts = [("pod", _sc(pod))] + [(_name(c), _sc(c)) for c in _containers(pod)]
    for where, sc in contexts:
        options = sc.get("seLinuxOptions") or {}
        if options.get("type", "") not in ALLOWED_SELINUX_TYPES:
            yield f"{where}: seLinuxOptions.type {options['type']}"
        for field in ("user", "role", "level"):
            if options.get(field):
                yield f"{where}: seLinuxOptions.{field} is fixed"


def _proc_mount(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        if _sc(c).get("procMount", "Default") != "Default":
            yield f"{_name(c)}: procMount {_sc(c)['procMount']}"


def _apparmor(pod: JsonObj) -> Iterator[str]:
    contexts = [("pod", _sc(pod))] + [(_name(c), _sc(c)) for c in _containers(pod)]
    for where, sc in contexts:
        kind = (sc.get("appArmorProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            yield f"{where}: appArmorProfile {kind}"


def _sysctls(pod: JsonObj) -> Iterator[str]:
    for sysctl in _sc(pod).get("sysctls") or ():
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"pod: sysctl {sysctl.get('name')} is not in the safe set"


def _host_process(pod: JsonObj) -> Iterator[str]:
    contexts = [("pod", _sc(pod))] + [(_name(c), _sc(c)) for c in _containers(pod)]
    for where, sc in contexts:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{where}: windowsOptions.hostProcess: true"


def _read_only_root(pod: JsonObj) -> Iterator[str]:
    for c in _containers(pod):
        if _sc(c).get("readOnlyRootFilesystem") is not True:
            yield f"{_name(c)}: readOnlyRootFilesystem is not true"


RULES: tuple[Rule, ...] = (
    Rule("host-namespaces", "PSS baseline; SCC allowHost{Network,PID,IPC}: false",
         "hostNetwork, hostPID and hostIPC are unset or false", _host_namespaces),
    Rule("privileged", "PSS baseline; SCC allowPrivilegedContainer: false",
         "no container is privileged", _privileged),
    Rule("host-ports", "PSS baseline; SCC allowHostPorts: false",
         "no container port has a hostPort", _host_ports),
    Rule("volume-types", "PSS restricted; SCC volumes (hostPath excluded)",
         f"volumes only of the types {sorted(ALLOWED_VOLUMES)}", _volume_types),
    Rule("capabilities-drop-all", "PSS restricted; SCC requiredDropCapabilities: [ALL]",
         "every container drops ALL capabilities", _drop_all),
    Rule("capabilities-add", "PSS restricted; SCC allowedCapabilities: [NET_BIND_SERVICE]",
         "a container adds no capability but NET_BIND_SERVICE", _added_capabilities),
    Rule("privilege-escalation", "PSS restricted; SCC allowPrivilegeEscalation: false",
         "every container sets allowPrivilegeEscalation: false", _privilege_escalation),
    Rule("run-as-non-root", "PSS restricted",
         "runAsNonRoot: true for every container (pod or container level)", _run_as_non_root),
    Rule("run-as-user-not-root", "PSS restricted",
         "runAsUser is never 0", _not_uid_zero),
    Rule("seccomp-runtime-default", "PSS restricted; SCC seccompProfiles: [runtime/default]",
         "every container's seccomp profile is RuntimeDefault", _seccomp),
    Rule("no-fixed-uid", "SCC runAsUser: MustRunAsRange (the namespace's range)",
         "runAsUser is not set anywhere: the SCC assigns it", _fixed("runAsUser")),
    Rule("no-fixed-fsgroup", "SCC fsGroup: MustRunAs (the namespace's range)",
         "fsGroup is not set: the SCC assigns it", _fs_group),
    Rule("selinux", "PSS baseline; SCC seLinuxContext: MustRunAs (the namespace's level)",
         "seLinuxOptions: only an allowed type; user, role and level unset", _selinux),
    Rule("proc-mount", "PSS baseline", "procMount is Default", _proc_mount),
    Rule("apparmor", "PSS baseline",
         "AppArmor profile, when set, is RuntimeDefault or Localhost", _apparmor),
    Rule("sysctls", "PSS baseline", "only the safe sysctls", _sysctls),
    Rule("windows-host-process", "PSS baseline", "no Windows HostProcess", _host_process),
    Rule("no-fixed-gid", "image: arbitrary UID in group 0",
         "runAsGroup is not set: the image's files belong to group 0", _fixed("runAsGroup")),
    Rule("read-only-root-filesystem", "image: read-only root filesystem",
         "every container's root filesystem is read-only", _read_only_root),
)  # fmt: skip


def violations(pod: JsonObj) -> list[str]:
    """`<rule id>: <what is wrong>` for every rule `pod` (a PodSpec) breaks."""
    return [f"{rule.id}: {problem}" for rule in RULES for problem in rule.check(pod)]


def pod_templates(obj: JsonObj) -> Iterator[JsonObj]:
    """The PodSpecs an object would create: its own (Pod) or its template's."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind in _POD_TEMPLATE_KINDS:
        yield (spec.get("template") or {}).get("spec") or {}
    elif kind == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        yield (job.get("template") or {}).get("spec") or {}
