"""Pruning asks vSphere who holds a file, deletes nothing on doubt, and counts what it did."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentforge import vsphere
from agentforge.api import wire
from agentforge.api.pool import ISOHistoryEntry, ISOStatus, VsphereAgentPool
from agentforge.api.vsphereagent import CreationRecord, Ownership, VsphereAgent
from agentforge.reconcilers.infra import iso_step

NOW = datetime(2026, 5, 1, tzinfo=UTC)
PREFIX = "agent-forge/ns/pool"


def sha(n: int) -> str:
    return f"{n:064x}"


def path(n: int) -> str:
    return f"{PREFIX}/{sha(n)}.iso"


def entry(n: int) -> ISOHistoryEntry:
    return ISOHistoryEntry(path=path(n), sha256=sha(n), size_bytes=1, uploaded_at=NOW)


def holding(n: int, *, uuid: str = "42000000-0000-0000-0000-000000000001") -> vsphere.VmFacts:
    return vsphere.VmFacts(
        moid="vm-1",
        name="w-1",
        bios_uuid=uuid,
        instance_uuid=None,
        primary_mac=None,
        macs=(),
        power_state=vsphere.PowerState.ON,
        markers={},
        cdroms=(
            vsphere.Cdrom(
                key=3000,
                controller_key=200,
                unit_number=0,
                kind=vsphere.MediumKind.ISO,
                backing_file=f"[iso-ds] {path(n)}",
                connected=True,
                start_connected=True,
            ),
        ),
        question=None,
    )


@dataclass
class FakeService:
    """The five calls pruning makes, scripted."""

    files: list[str]
    ages: dict[str, timedelta] = field(default_factory=dict)
    on_datastore: list[vsphere.VmFacts] = field(default_factory=list)
    by_uuid: dict[str, vsphere.VmFacts] = field(default_factory=dict)
    usage_error: vsphere.VsphereError | None = None
    delete_error: dict[str, vsphere.VsphereError] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    async def list_files(self, *, where: Any, prefix: str) -> list[vsphere.DatastoreFile]:
        self.asked.append("list_files")
        day = timedelta(days=1)
        return [
            vsphere.DatastoreFile(path=p, size=1, modified=NOW - self.ages.get(p, day))
            for p in self.files
        ]

    async def vms_using_datastore(self, *, where: Any) -> list[vsphere.VmFacts]:
        self.asked.append("vms_using_datastore")
        if self.usage_error is not None:
            raise self.usage_error
        return self.on_datastore

    async def vms_in_folder(self, *, placement: Any) -> list[vsphere.VmFacts]:
        self.asked.append("vms_in_folder")
        return []

    async def vms_by_uuid(
        self, *, datacenter: str, bios_uuids: Sequence[str]
    ) -> dict[str, vsphere.VmFacts]:
        self.asked.append("vms_by_uuid")
        return {u: self.by_uuid[u] for u in bios_uuids if u in self.by_uuid}

    async def delete_file(self, *, where: Any, path: str) -> bool:
        self.asked.append("delete_file")
        if path in self.delete_error:
            raise self.delete_error[path]
        self.deleted.append(path)
        return True


def pool(retain: int = 1) -> VsphereAgentPool:
    return VsphereAgentPool.model_validate(
        {
            "metadata": {"name": "pool", "namespace": "ns", "uid": "uid-1"},
            "spec": {
                "hostedClusterRef": {"name": "hc"},
                "nodePoolRef": {"name": "np"},
                "infraEnvRef": {"name": "ie"},
                "controlPlaneNamespace": "cp",
                "vsphere": {
                    "credentialsSecretRef": {"name": "s"},
                    "datastoreCluster": "dsc1",
                    "isoDatastore": "iso-ds",
                    "resourcePool": "cluster/Resources",
                    "network": "VM Network",
                },
                "template": {},
                "agent": {"labels": {"a": "b"}},
                "iso": {"retainVersions": retain, "pathPrefix": PREFIX},
            },
        }
    )


def status(*ns: int) -> ISOStatus:
    return ISOStatus(path=path(ns[0]), sha256=sha(ns[0]), history=[entry(n) for n in ns])


def prune_count(result: str) -> float:
    value = REGISTRY.get_sample_value(
        "agent_forge_iso_operations_total", {"operation": "prune", "result": result}
    )
    return value or 0.0


async def run(service: FakeService, st: ISOStatus, **kw: Any) -> iso_step.PruneOutcome:
    return await iso_step.prune(
        service=service,  # type: ignore[arg-type]
        pool=pool(),
        status=st,
        agents=kw.get("agents", []),
        kept_elsewhere=kw.get("kept_elsewhere", set()),
        now=NOW,
    )


async def test_vsphere_is_not_asked_when_nothing_is_beyond_retention() -> None:
    service = FakeService(files=[path(2)])
    outcome = await run(service, status(2))
    assert outcome.deleted == ()
    assert service.asked == ["list_files"]


async def test_an_unused_file_beyond_retention_is_deleted_and_counted() -> None:
    before = prune_count("success")
    service = FakeService(files=[path(1), path(2)])
    outcome = await run(service, status(2, 1))
    assert service.deleted == [path(1)]
    assert [e.path for e in outcome.history] == [path(2)]
    assert prune_count("success") == before + 1


async def test_nothing_is_deleted_when_usage_cannot_be_established() -> None:
    before = prune_count("transient")
    service = FakeService(
        files=[path(1), path(2)],
        usage_error=vsphere.TransientError("vCenter did not answer", subject="vCenter"),
    )
    with pytest.raises(iso_step.PruneError, match="which VMs hold"):
        await run(service, status(2, 1))
    assert service.deleted == []
    assert prune_count("transient") == before + 1


async def test_a_file_a_vm_on_the_datastore_holds_is_kept_and_counted_in_use() -> None:
    before = prune_count("in_use")
    service = FakeService(files=[path(1), path(2)], on_datastore=[holding(1)])
    outcome = await run(service, status(2, 1))
    assert service.deleted == []
    assert outcome.in_use == (path(1),)
    assert [e.path for e in outcome.history] == [path(2), path(1)]
    assert prune_count("in_use") == before + 1


async def test_a_file_a_recorded_vm_holds_is_kept_even_if_vcenter_does_not_list_it() -> None:
    uuid = "42000000-0000-0000-0000-0000000000aa"
    service = FakeService(files=[path(1), path(2)], by_uuid={uuid: holding(1, uuid=uuid)})
    agent = VsphereAgent.model_validate(
        {
            "metadata": {"name": "va", "namespace": "ns"},
            "spec": {"poolRef": {"name": "pool"}},
            "status": {"vm": {"name": "w-1", "biosUUID": uuid}},
        }
    )
    outcome = await run(service, status(2, 1), agents=[agent])
    assert service.deleted == []
    assert outcome.in_use == (path(1),)


async def test_the_iso_of_an_in_flight_creation_counts_as_in_use() -> None:
    record = CreationRecord(
        vm_name="w-1",
        bios_uuid="42000000-0000-0000-0000-0000000000bb",
        ownership=Ownership(
            pool_namespace="ns", pool_name="pool", pool_uid="uid-1", vsphere_agent="va"
        ),
        datacenter="dc1",
        folder="f",
        iso_path=f"[iso-ds] {path(1)}",
        started_at=NOW,
    )
    agent = VsphereAgent.model_validate(
        {
            "metadata": {"name": "va", "namespace": "ns"},
            "spec": {"poolRef": {"name": "pool"}},
            "status": {"creation": wire.to_wire(record)},
        }
    )
    service = FakeService(files=[path(1), path(2)])
    outcome = await run(service, status(2, 1), agents=[agent])
    assert service.deleted == []
    assert outcome.in_use == (path(1),)


async def test_a_failed_delete_stays_in_history_is_reported_and_counted() -> None:
    before = prune_count("denied")
    service = FakeService(
        files=[path(1), path(2)],
        delete_error={path(1): vsphere.PermissionDenied("no privilege", subject="iso-ds")},
    )
    outcome = await run(service, status(2, 1))
    assert outcome.deleted == ()
    assert len(outcome.failures) == 1
    assert path(1) in outcome.failures[0]
    assert [e.path for e in outcome.history] == [path(2), path(1)]
    assert prune_count("denied") == before + 1


# --- temporary uploads a killed process left behind ---------------------------------------

UPLOAD = f"{PREFIX}/.upload-{'0f' * 16}.iso"


async def test_a_stale_upload_is_deleted_and_counted_even_with_nothing_beyond_retention() -> None:
    before = prune_count("stale_upload")
    service = FakeService(files=[path(2), UPLOAD])
    outcome = await run(service, status(2))
    assert service.deleted == [UPLOAD]
    assert outcome.stale_uploads == (UPLOAD,)
    assert outcome.deleted == ()
    assert [e.path for e in outcome.history] == [path(2)]
    assert prune_count("stale_upload") == before + 1


async def test_a_recent_upload_may_be_another_replicas_running_one_and_is_not_touched() -> None:
    service = FakeService(files=[path(2), UPLOAD], ages={UPLOAD: timedelta(minutes=59)})
    outcome = await run(service, status(2))
    assert outcome.stale_uploads == ()
    assert service.asked == ["list_files"]


async def test_the_stale_age_given_is_the_one_applied() -> None:
    service = FakeService(files=[path(2), UPLOAD], ages={UPLOAD: timedelta(hours=2)})
    outcome = await iso_step.prune(
        service=service,  # type: ignore[arg-type]
        pool=pool(),
        status=status(2),
        agents=[],
        kept_elsewhere=set(),
        now=NOW,
        stale_upload_age=timedelta(hours=3),
    )
    assert outcome.stale_uploads == ()
    assert service.deleted == []


async def test_uploads_outside_the_pools_prefix_are_never_touched() -> None:
    elsewhere = [
        f"agent-forge/ns/other/.upload-{'0f' * 16}.iso",
        f"{PREFIX}/nested/.upload-{'0f' * 16}.iso",
    ]
    service = FakeService(files=[path(2), *elsewhere])
    outcome = await run(service, status(2))
    assert outcome.stale_uploads == ()
    assert "delete_file" not in service.asked


async def test_stale_uploads_wait_while_usage_cannot_be_established() -> None:
    service = FakeService(
        files=[path(2), UPLOAD],
        usage_error=vsphere.TransientError("vCenter did not answer", subject="vCenter"),
    )
    with pytest.raises(iso_step.PruneError):
        await run(service, status(2))
    assert service.deleted == []


async def test_a_failed_delete_of_a_stale_upload_is_reported_and_counted() -> None:
    before = prune_count("transient")
    service = FakeService(
        files=[path(2), UPLOAD],
        delete_error={UPLOAD: vsphere.TransientError("busy", subject="iso-ds")},
    )
    outcome = await run(service, status(2))
    assert outcome.stale_uploads == ()
    assert len(outcome.failures) == 1
    assert UPLOAD in outcome.failures[0]
    assert [e.path for e in outcome.history] == [path(2)]
    assert prune_count("transient") == before + 1
