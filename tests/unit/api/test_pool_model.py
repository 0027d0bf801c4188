"""VsphereAgentPool: defaults, bounds and derived values, as DOMAIN.md section 2 lists them.

Every bound is checked twice: the pydantic model and the generated CRD schema must
reject (and accept) the same values, so an object the server stores always parses and
an object the operator builds is never refused.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from agentforge.api import crdgen, names
from agentforge.api.conditions import ISOEjectedReason
from agentforge.api.pool import (
    CleanupPolicy,
    Firmware,
    ISOEjectionCounts,
    VsphereAgentPool,
    VsphereAgentPoolSpec,
)
from tests.unit.api.support import MINIMAL_SPEC, crd_validator, pool_object

VALIDATOR = crd_validator(crdgen.POOL)


def spec_with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(MINIMAL_SPEC)
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


def crd_errors(spec: dict[str, Any]) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(pool_object(spec))]


def make_pool(spec: dict[str, Any] | None = None) -> VsphereAgentPool:
    return VsphereAgentPool.model_validate(pool_object(spec or MINIMAL_SPEC))


def test_omitted_fields_take_the_documented_defaults() -> None:
    spec = VsphereAgentPoolSpec.model_validate(MINIMAL_SPEC)
    assert (spec.template.num_cpus, spec.template.memory_mib, spec.template.disk_gib) == (
        4,
        16384,
        100,
    )
    assert spec.vsphere.datacenter == "dc1"
    assert spec.vsphere.guest_id == "rhel9_64Guest"
    assert spec.vsphere.scsi_type == "pvscsi"
    assert spec.vsphere.firmware is Firmware.EFI
    assert spec.vsphere.network_adapter_type == "vmxnet3"
    assert spec.vsphere.disk_eagerly_scrub is False
    assert spec.vsphere.vm_tags == []
    assert spec.vsphere.folder is None
    assert spec.agent.role == "worker"
    assert spec.agent.approve is True
    assert spec.iso.check_interval == "10m"
    assert spec.iso.retain_versions == 2
    assert spec.iso.path_prefix is None
    assert spec.iso.eject_after_install is False
    assert spec.cleanup_policy is CleanupPolicy.DELETE


def test_minimal_spec_is_accepted_by_model_and_crd() -> None:
    VsphereAgentPoolSpec.model_validate(MINIMAL_SPEC)
    assert crd_errors(MINIMAL_SPEC) == []


REJECTED = [
    ("template.numCPUs", 0),
    ("template.numCPUs", 129),
    ("template.memoryMiB", 1023),
    ("template.memoryMiB", 1048577),
    ("template.diskGiB", 19),
    ("template.diskGiB", 65537),
    ("template.namePrefix", "Demo"),
    ("template.namePrefix", "a" * 59),
    ("iso.retainVersions", 0),
    ("iso.retainVersions", 21),
    ("iso.checkInterval", "10 minutes"),
    ("iso.checkInterval", "-5m"),
    ("iso.checkInterval", "10"),
    ("iso.pathPrefix", "/absolute/path"),
    ("iso.pathPrefix", "has space"),
    ("iso.pathPrefix", "a" * 513),
    ("vsphere.vmTags", [f"tag-{i}" for i in range(65)]),
    ("vsphere.firmware", "uefi"),
    ("vsphere.guestID", "rhel 9"),
    ("vsphere.scsiType", "a" * 65),
    ("vsphere.datacenter", ""),
    ("vsphere.datastoreCluster", ""),
    ("vsphere.resourcePool", "a" * 513),
    ("vsphere.folder", "a" * 513),
    ("vsphere.network", "a" * 257),
    ("vsphere.credentialsSecretRef.name", "Vsphere_Credentials"),
    ("vsphere.credentialsSecretRef.namespace", "Bad_NS"),
    ("agent.labels", {}),
    ("agent.labels", {f"k{i}": "v" for i in range(33)}),
    ("agent.role", ""),
    ("agent.role", "-worker"),
    ("agent.role", "a" * 64),
    ("cleanupPolicy", "Orphan"),
    ("hostedClusterRef.name", ""),
    ("hostedClusterRef.name", "Demo"),
    ("hostedClusterRef.name", "-demo"),
    ("hostedClusterRef.name", "a" * 254),
    ("nodePoolRef.name", "demo_worker"),
    ("infraEnvRef.name", "demo."),
    ("controlPlaneNamespace", "Demo-Demo"),
    ("controlPlaneNamespace", "demo.demo"),
    ("controlPlaneNamespace", "a" * 64),
]


@pytest.mark.parametrize(("path", "value"), REJECTED, ids=[f"{p}={v!r:.20}" for p, v in REJECTED])
def test_values_out_of_bounds_are_rejected_by_model_and_crd(path: str, value: Any) -> None:
    spec = spec_with(path, value)
    with pytest.raises(ValidationError):
        VsphereAgentPoolSpec.model_validate(spec)
    assert crd_errors(spec), f"the CRD accepts {path}={value!r} but the model does not"


ACCEPTED = [
    ("template.numCPUs", 1),
    ("template.numCPUs", 128),
    ("template.memoryMiB", 1024),
    ("template.memoryMiB", 1048576),
    ("template.diskGiB", 20),
    ("template.diskGiB", 65536),
    ("template.namePrefix", ""),
    ("template.namePrefix", "a" * 58),
    ("iso.retainVersions", 1),
    ("iso.retainVersions", 20),
    ("iso.checkInterval", "1h30m"),
    ("iso.checkInterval", "10m0s"),
    ("iso.checkInterval", "90s"),
    ("iso.checkInterval", "0"),
    ("iso.pathPrefix", ""),
    ("iso.pathPrefix", "agent-forge/custom/"),
    ("iso.ejectAfterInstall", True),
    ("vsphere.vmTags", [f"tag-{i}" for i in range(64)]),
    ("vsphere.firmware", "bios"),
    ("vsphere.credentialsSecretRef.namespace", ""),
    ("vsphere.credentialsSecretRef.namespace", "vsphere-secrets"),
    ("agent.labels", {f"k{i}": "v" for i in range(32)}),
    ("agent.role", "infra.worker_1"),
    ("agent.approve", False),
    ("cleanupPolicy", "Retain"),
    ("hostedClusterRef.name", "a" * 253),
    ("hostedClusterRef.name", "demo.cluster-1"),
    ("controlPlaneNamespace", "a" * 63),
]


@pytest.mark.parametrize(("path", "value"), ACCEPTED, ids=[f"{p}={v!r:.20}" for p, v in ACCEPTED])
def test_values_at_the_bounds_are_accepted_by_model_and_crd(path: str, value: Any) -> None:
    spec = spec_with(path, value)
    VsphereAgentPoolSpec.model_validate(spec)
    assert crd_errors(spec) == []


def test_unknown_fields_are_ignored_when_parsing() -> None:
    spec = spec_with("dryRun", True)
    spec["vsphere"]["isoPath"] = "legacy/path"
    parsed = VsphereAgentPoolSpec.model_validate(spec)
    assert "dryRun" not in parsed.model_dump(mode="json")


def test_a_pool_without_status_parses_with_an_empty_status() -> None:
    pool = make_pool()
    assert pool.status.owned_vms == []
    assert pool.status.conditions == []
    assert pool.status.waiting_agent_machines == 0


def test_folder_defaults_to_the_hosted_cluster_name() -> None:
    assert make_pool().effective_folder() == "demo"
    assert make_pool(spec_with("vsphere.folder", "")).effective_folder() == "demo"
    assert make_pool(spec_with("vsphere.folder", "vms/demo")).effective_folder() == "vms/demo"


def test_name_prefix_defaults_to_hosted_cluster_and_role() -> None:
    assert make_pool().effective_name_prefix() == "demo-worker"
    assert make_pool(spec_with("agent.role", "infra")).effective_name_prefix() == "demo-infra"
    assert make_pool(spec_with("template.namePrefix", "w")).effective_name_prefix() == "w"


def test_path_prefix_defaults_to_namespace_and_pool_without_trailing_slash() -> None:
    assert make_pool().effective_path_prefix() == "agent-forge/demo/demo-worker"
    custom = make_pool(spec_with("iso.pathPrefix", "isos/custom/"))
    assert custom.effective_path_prefix() == "isos/custom"


def test_check_interval_is_parsed_and_zero_means_the_default() -> None:
    assert make_pool().effective_check_interval() == timedelta(minutes=10)
    hour = make_pool(spec_with("iso.checkInterval", "1h30m"))
    assert hour.effective_check_interval() == timedelta(minutes=90)
    assert make_pool(spec_with("iso.checkInterval", "0s")).effective_check_interval() == (
        timedelta(minutes=10)
    )


def test_credentials_secret_namespace_defaults_to_the_pool_namespace() -> None:
    assert make_pool().credentials_secret_namespace() == "demo"
    other = make_pool(spec_with("vsphere.credentialsSecretRef.namespace", "secrets"))
    assert other.credentials_secret_namespace() == "secrets"


def test_node_pool_annotation_is_pool_namespace_slash_node_pool() -> None:
    assert make_pool().node_pool_annotation() == "demo/demo-worker"


def test_force_refresh_token_comes_from_the_annotation() -> None:
    assert make_pool().force_refresh_token() is None
    obj = pool_object(MINIMAL_SPEC)
    obj["metadata"]["annotations"] = {names.ANNOTATION_FORCE_ISO_REFRESH: "7"}
    assert VsphereAgentPool.model_validate(obj).force_refresh_token() == "7"


def test_cleanup_is_enabled_only_by_the_delete_policy() -> None:
    assert make_pool().cleanup_enabled
    assert not make_pool(spec_with("cleanupPolicy", "Retain")).cleanup_enabled


def test_iso_ejection_counts_count_each_reason() -> None:
    counts = ISOEjectionCounts.from_reasons(
        [ISOEjectedReason.EJECTED, ISOEjectedReason.EJECTED, ISOEjectedReason.DISABLED]
    )
    assert counts.model_dump(mode="json") == {
        "disabled": 1,
        "waitingForInstallation": 0,
        "ejectionInProgress": 0,
        "ejected": 2,
        "ejectionFailed": 0,
        "noOwnedMedia": 0,
    }


DOMAINS = [
    {"name": "zone-a", "computeCluster": "cluster-a", "datastoreCluster": "pod-a"},
    {"name": "zone-b", "computeCluster": "cluster-b", "datastore": "ds-b", "network": "VM Network"},
]


def test_without_failure_domains_placement_is_unchanged() -> None:
    pool = make_pool()
    assert pool.spec.vsphere.failure_domains == []
    assert pool.spec.vsphere.spread_policy == "None"
    assert pool.spread_domains() == []
    listed = make_pool(spec_with("vsphere.failureDomains", DOMAINS))
    assert listed.spread_domains() == []  # listed but not in effect without Spread


def test_spread_over_failure_domains_is_accepted_by_model_and_crd() -> None:
    spec = spec_with("vsphere.failureDomains", DOMAINS)
    spec["vsphere"]["spreadPolicy"] = "Spread"
    assert crd_errors(spec) == []
    pool = make_pool(spec)
    assert [d.name for d in pool.spread_domains()] == ["zone-a", "zone-b"]
    assert pool.spread_domains()[0].resource_pool() == "cluster-a/Resources"


@pytest.mark.parametrize(
    ("domains", "policy", "error"),
    [
        ([], "Spread", "needs failureDomains"),
        ([{**DOMAINS[0], "datastore": "ds-a"}], "Spread", "exactly one of"),
        ([{"name": "zone-a", "computeCluster": "c"}], "None", "exactly one of"),
        ([DOMAINS[0], DOMAINS[0]], "Spread", "unique"),
    ],
)
def test_bad_failure_domains_are_refused_with_the_fix(
    domains: list[dict[str, Any]], policy: str, error: str
) -> None:
    spec = spec_with("vsphere.failureDomains", domains)
    spec["vsphere"]["spreadPolicy"] = policy
    with pytest.raises(ValidationError, match=error):
        make_pool(spec)


def test_the_crd_carries_the_cel_rules_of_failure_domains() -> None:
    schema = crdgen.render(crdgen.POOL)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    vsphere = schema["properties"]["spec"]["properties"]["vsphere"]
    assert "Spread" in vsphere["x-kubernetes-validations"][0]["rule"]
    domains = vsphere["properties"]["failureDomains"]
    assert domains["x-kubernetes-list-type"] == "map"
    assert domains["x-kubernetes-list-map-keys"] == ["name"]
    assert domains["items"]["x-kubernetes-validations"][0]["rule"] == (
        "has(self.datastoreCluster) != has(self.datastore)"
    )
    assert crd_errors(spec_with("vsphere.spreadPolicy", "Everywhere"))
