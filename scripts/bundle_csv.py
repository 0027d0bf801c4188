"""The ClusterServiceVersion of the OLM bundle (`scripts.bundle` supplies config/'s objects).

What the CSV declares, and why:

* install modes: AllNamespaces and MultiNamespace. The operator watches every namespace,
  or the list `--namespace` / `AGENT_FORGE_NAMESPACE` names, which the Deployment takes
  from the OperatorGroup's target namespaces. A pool needs at least two namespaces (its
  own, with the InfraEnv and credentials, and the hosted control plane namespace
  `clusters-<name>` with the AgentMachines), so OwnNamespace and SingleNamespace are
  false: either would install an operator that sees pools but never their demand;
* `minKubeVersion` 1.27 (OpenShift 4.14; the bundle metadata names `v4.14` as the
  minimum OpenShift version for Red Hat's catalogs);
* infrastructure features (`features.operators.openshift.io/*`, and the older list in
  `operators.openshift.io/infrastructure-features`):
  - disconnected: true only when every image the bundle names (the Deployment's
    containers, `containerImage`, `relatedImages`) is pinned by digest. The operator
    needs no internet: it talks to the API server, to vCenter, and downloads the
    discovery ISO from the cluster's own image service (the InfraEnv's
    `isoDownloadURL`); but a mirror for a disconnected cluster is found by digest
    (ImageContentSourcePolicy / ImageDigestMirrorSet), so a tag would not be pulled
    there. With a tag (the development bundle, `agent-forge:dev`) the CSV says false,
    and `disconnected_problems` refuses a CSV that claims true beside a tag;
  - proxy-aware: true. OLM injects the cluster proxy's HTTP(S)_PROXY/NO_PROXY into the
    Deployment; ISO downloads honour them (docs/configuration.md);
  - fips-compliant: false (not proven: the image's Python and OpenSSL are not
    FIPS-validated builds); tls-profiles: false (the /metrics server does not follow
    the cluster's TLS security profile); token-auth-aws/azure/gcp: false (no cloud
    tokens); cnf/cni/csi: false;
* maintainers, links and the provider's URL (`MAINTAINERS`, `LINKS`), which catalogs
  show and OperatorHub requires;
* owned CRDs with descriptors generated from their OpenAPI schemas: every spec leaf (three
  levels deep), every top-level status field, with the console's x-descriptors for
  booleans, numbers, enums, Secret references and conditions.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = [
    "INFRASTRUCTURE_FEATURES",
    "LINKS",
    "MAINTAINERS",
    "csv",
    "descriptors",
    "disconnected_problems",
    "display_name",
    "pinned",
]

JsonObj = dict[str, Any]

INFRASTRUCTURE_FEATURES = {
    "disconnected": "true",  # with digests only: `csv()` says false for a tag
    "fips-compliant": "false",
    "proxy-aware": "true",
    "tls-profiles": "false",
    "token-auth-aws": "false",
    "token-auth-azure": "false",
    "token-auth-gcp": "false",
    "cnf": "false",
    "cni": "false",
    "csi": "false",
}
PROVIDER = {"name": "containeroo", "url": "https://containeroo.ch"}
MAINTAINERS = [{"name": "containeroo", "email": "hello@containeroo.ch"}]
LINKS = [
    {"name": "containeroo", "url": "https://containeroo.ch"},
    {
        "name": "agent-forge-operator (the Go operator this one replaces)",
        "url": "https://github.com/containeroo/agent-forge-operator",
    },
]
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def pinned(image: str) -> bool:
    """Whether `image` names its content by digest (`name@sha256:<64 hex>`)."""
    return bool(_DIGEST.search(image))


def _images(csv: JsonObj) -> list[str]:
    images = [str(csv["metadata"]["annotations"].get("containerImage", ""))]
    images += [str(i["image"]) for i in csv["spec"].get("relatedImages") or []]
    for deployment in csv["spec"]["install"]["spec"]["deployments"]:
        pod = deployment["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            images.append(str(container["image"]))
    return images


def disconnected_problems(csv: JsonObj) -> list[str]:
    """Why `csv` may not declare `disconnected` (empty when it may, or does not)."""
    annotations = csv["metadata"]["annotations"]
    claims = annotations.get("features.operators.openshift.io/disconnected") == "true" or (
        "disconnected"
        in json.loads(annotations.get("operators.openshift.io/infrastructure-features", "[]"))
    )
    if not claims:
        return []
    problems = [
        f"{image or '(empty)'}: not pinned by digest, yet the CSV declares disconnected"
        for image in dict.fromkeys(_images(csv))
        if not _DIGEST.search(image)  # not `pinned`: the check stands apart from `csv()`
    ]
    related = {str(i["image"]) for i in csv["spec"].get("relatedImages") or []}
    problems += [
        f"{image}: run by the CSV but missing from relatedImages (a mirror would not copy it)"
        for image in dict.fromkeys(_images(csv))
        if image not in related
    ]
    return problems


DESCRIPTION = """\
agent-forge turns HyperShift Agent-platform autoscaling demand into vSphere VMs. When a
NodePool grows, CAPI's AgentMachines wait with `Ready=False, reason NoSuitableAgents`;
agent-forge creates VMs that boot the InfraEnv's discovery ISO, prepares the Agents that
appear so CAPI can bind them, optionally ejects the discovery ISO once an Agent is
installed, and cleans up what it created when CAPI scales down.

**Prerequisites**: HyperShift with the Agent platform, the multicluster engine's
Assisted Installer (InfraEnv, Agent) and cluster-api-provider-agent (AgentMachine),
and vCenter 7 or 8.

**Install mode**: all namespaces, or a list that holds each pool's namespace *and* its
hosted control plane namespace (`clusters-<name>`), where the AgentMachines are.

**Credentials**: the operator reads Secrets only in its credentials namespaces, and only
where the ClusterRole `agent-forge-credentials-reader` is bound to it by a RoleBinding:
bind it in each namespace that holds vCenter credentials Secrets, and under all
namespaces also name them in `AGENT_FORGE_CREDENTIAL_NAMESPACE` (the Subscription's
`spec.config.env`); the operator does not start without them.
"""


ICON_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">'
    '<rect width="64" height="64" rx="12" fill="#1f4e79"/>'
    '<path d="M14 40h36l-6 8H20z" fill="#f2a900"/>'
    '<path d="M22 16h20v8H22zM28 24h8v16h-8z" fill="#ffffff"/></svg>'
)
"""An anvil on a vSphere-blue tile: OperatorHub shows it next to the name."""


_WORD = re.compile(r"[KMGT]iB|[A-Z]{2,}s(?![a-z])|[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+")
_ACRONYMS = {
    "iso": "ISO",
    "scsi": "SCSI",
    "bios": "BIOS",
    "vm": "VM",
    "url": "URL",
    "sha256": "SHA-256",
}


def display_name(path: str) -> str:
    """`vsphere.credentialsSecretRef.name` -> `Credentials Secret Ref Name` (last two parts)."""
    parts = path.split(".")[-2:] if path.endswith(".name") else path.split(".")[-1:]
    words = [w for part in parts for w in _WORD.findall(part)]
    return " ".join(
        _ACRONYMS.get(w.lower(), w if w[0].isupper() else w.capitalize()) for w in words
    )


def _x_descriptors(path: str, schema: JsonObj) -> list[str]:
    if path.endswith("credentialsSecretRef.name"):
        return ["urn:alm:descriptor:io.kubernetes:Secret"]
    if path == "conditions":
        return ["urn:alm:descriptor:io.kubernetes.conditions"]
    if schema.get("enum"):
        return [f"urn:alm:descriptor:com.tectonic.ui:select:{v}" for v in schema["enum"]]
    kind = schema.get("type")
    if kind == "boolean":
        return ["urn:alm:descriptor:com.tectonic.ui:booleanSwitch"]
    if kind == "integer":
        return ["urn:alm:descriptor:com.tectonic.ui:number"]
    return []


def _leaves(schema: JsonObj, prefix: str, depth: int) -> Iterator[tuple[str, JsonObj]]:
    for name, sub in sorted((schema.get("properties") or {}).items()):
        path = f"{prefix}{name}"
        if sub.get("type") == "object" and sub.get("properties") and depth > 1:
            yield from _leaves(sub, f"{path}.", depth - 1)
        else:
            yield path, sub


def descriptors(schema: JsonObj, *, depth: int) -> list[JsonObj]:
    """OLM descriptors for the fields of `schema` (a spec or status schema)."""
    out: list[JsonObj] = []
    for path, sub in _leaves(schema, "", depth):
        item: JsonObj = {"path": path, "displayName": display_name(path)}
        description = " ".join(str(sub.get("description") or "").split())
        if description:
            item["description"] = description
        x = _x_descriptors(path, sub)
        if x:
            item["x-descriptors"] = x
        out.append(item)
    return out


def _owned(crd: JsonObj, created: dict[str, list[str]]) -> JsonObj:
    spec = crd["spec"]
    (version,) = [v for v in spec["versions"] if v.get("storage")]
    schema = version["schema"]["openAPIV3Schema"]
    kind = spec["names"]["kind"]
    props = schema.get("properties") or {}
    owned: JsonObj = {
        "name": crd["metadata"]["name"],
        "version": version["name"],
        "kind": kind,
        "displayName": display_name(kind),
        "description": " ".join(str(schema.get("description") or kind).split()),
        "specDescriptors": descriptors(props.get("spec") or {}, depth=3),
        "statusDescriptors": descriptors(props.get("status") or {}, depth=1),
    }
    if created.get(kind):
        owned["resources"] = [
            {"kind": k, "name": "", "version": "v1alpha1"} for k in sorted(created[kind])
        ]
    return owned


def _example(sample: JsonObj) -> JsonObj:
    example = copy.deepcopy(sample)
    example["metadata"].pop("namespace", None)
    return example


def csv(
    *,
    version: str,
    deployment: JsonObj,
    service_account: str,
    cluster_rules: list[JsonObj],
    rules: list[JsonObj],
    crds: list[JsonObj],
    samples: list[JsonObj],
    image: str,
    suggested_namespace: str,
) -> JsonObj:
    """The ClusterServiceVersion `agent-forge.v<version>`."""
    groups = {crd["spec"]["group"] for crd in crds}
    examples = [_example(s) for s in samples if s["apiVersion"].split("/")[0] in groups]
    infrastructure = dict(INFRASTRUCTURE_FEATURES)
    if not pinned(image):
        infrastructure["disconnected"] = "false"
    features = {f"features.operators.openshift.io/{k}": v for k, v in infrastructure.items()}
    annotations = {
        "alm-examples": json.dumps(examples, indent=2, sort_keys=True),
        "capabilities": "Seamless Upgrades",
        "categories": "Cloud Provider",
        "containerImage": image,
        "description": "Turns HyperShift Agent-platform autoscaling demand into vSphere VMs",
        "operatorframework.io/suggested-namespace": suggested_namespace,
        "operators.openshift.io/infrastructure-features": json.dumps(
            sorted(k for k, v in infrastructure.items() if v == "true")
        ),
        "support": "containeroo",
        **features,
    }
    spec = copy.deepcopy(deployment["spec"])
    labels = dict(deployment["metadata"].get("labels") or {})
    return {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {"name": f"agent-forge.v{version}", "annotations": annotations},
        "spec": {
            "displayName": "agent-forge",
            "description": DESCRIPTION,
            "version": version,
            "maturity": "alpha",
            "minKubeVersion": "1.27.0",
            "icon": [
                {
                    "base64data": base64.b64encode(ICON_SVG.encode()).decode(),
                    "mediatype": "image/svg+xml",
                }
            ],
            "provider": dict(PROVIDER),
            "maintainers": copy.deepcopy(MAINTAINERS),
            "links": copy.deepcopy(LINKS),
            "keywords": ["hypershift", "agent", "vsphere", "autoscaling", "capi"],
            "installModes": [
                {"type": "OwnNamespace", "supported": False},
                {"type": "SingleNamespace", "supported": False},
                {"type": "MultiNamespace", "supported": True},
                {"type": "AllNamespaces", "supported": True},
            ],
            "customresourcedefinitions": {
                "owned": [_owned(crd, {"VsphereAgentPool": ["VsphereAgent"]}) for crd in crds]
            },
            "install": {
                "strategy": "deployment",
                "spec": {
                    "deployments": [
                        {"name": deployment["metadata"]["name"], "label": labels, "spec": spec}
                    ],
                    "clusterPermissions": [
                        {"serviceAccountName": service_account, "rules": cluster_rules}
                    ],
                    "permissions": [{"serviceAccountName": service_account, "rules": rules}],
                },
            },
            "relatedImages": [{"name": "agent-forge", "image": image}],
        },
    }
