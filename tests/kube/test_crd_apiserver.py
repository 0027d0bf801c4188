"""The generated CRDs in a real kube-apiserver: accepted as structural, defaulting as
the models do, refusing what the models refuse, and pruning none of the status fields
(in particular the crash-recovery records `status.creation` and `status.isoEjection`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentforge.api import crdgen
from agentforge.api.pool import VsphereAgentPool, VsphereAgentPoolSpec
from agentforge.api.vsphereagent import ISOEjectionPhase, VsphereAgent
from agentforge.api.wire import to_wire
from sim.controlplane.controlplane import ControlPlane
from sim.controlplane.rest import RestClient
from tests.unit.api.support import MINIMAL_SPEC, pool_object, read_fixture


@pytest.fixture(scope="module")
def api(controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> RestClient:
    """An admin client, with the CRDs exactly as generated now installed."""
    crd_dir: Path = tmp_path_factory.mktemp("crds")
    for name, crd in crdgen.render_all().items():
        (crd_dir / name).write_text(yaml.safe_dump(crd))
    controlplane.install_crds([crd_dir])
    return controlplane.direct_client()


@pytest.fixture
def pools(api: RestClient, namespace: str) -> str:
    return f"/apis/agent-forge.containeroo.ch/v1alpha1/namespaces/{namespace}/vsphereagentpools"


@pytest.fixture
def agents(api: RestClient, namespace: str) -> str:
    return f"/apis/agent-forge.containeroo.ch/v1alpha1/namespaces/{namespace}/vsphereagents"


def new_pool(spec: dict[str, Any]) -> dict[str, Any]:
    """A pool object for the namespace in the request path."""
    obj = pool_object(spec)
    del obj["metadata"]["namespace"]
    return obj


def without_empty_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_empty_lists(v) for k, v in value.items() if v != []}
    return value


def test_the_server_defaults_a_minimal_pool_as_the_model_does(api: RestClient, pools: str) -> None:
    created = api.post(pools, new_pool(MINIMAL_SPEC)).body
    expected = to_wire(VsphereAgentPoolSpec.model_validate(MINIMAL_SPEC))
    assert created["spec"] == without_empty_lists(expected)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("template", "numCPUs"), 129),
        (("vsphere", "firmware"), "uefi"),
        (("agent", "labels"), {}),
        (("iso", "checkInterval"), "ten minutes"),
        (("controlPlaneNamespace",), "Demo"),
    ],
)
def test_the_server_refuses_what_the_model_refuses(
    api: RestClient, pools: str, path: tuple[str, ...], value: Any
) -> None:
    spec = copy.deepcopy(MINIMAL_SPEC)
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    api.post(pools, new_pool(spec), expect=(422,))


def test_references_and_control_plane_namespace_are_immutable(api: RestClient, pools: str) -> None:
    api.post(pools, new_pool(MINIMAL_SPEC))
    for patch in (
        {"spec": {"controlPlaneNamespace": "other"}},
        {"spec": {"nodePoolRef": {"name": "other"}}},
    ):
        api.request(
            "PATCH",
            f"{pools}/demo-worker",
            body=patch,
            content_type="application/merge-patch+json",
            expect=(422,),
        )


def _patch(api: RestClient, url: str, vsphere: dict[str, Any], *, expect: int) -> str:
    answer = api.request(
        "PATCH",
        url,
        body={"spec": {"vsphere": vsphere}},
        content_type="application/merge-patch+json",
        expect=(expect,),
    )
    return str(answer.body)


def test_the_effective_folder_cannot_change_by_setting_changing_or_clearing_it(
    api: RestClient, pools: str
) -> None:
    """An unset folder means the hosted cluster's name ("demo"): setting it to another
    folder would send new VMs elsewhere, so it is refused as a change is."""
    api.post(pools, new_pool(MINIMAL_SPEC))
    url = f"{pools}/demo-worker"
    refused = _patch(api, url, {"folder": "elsewhere"}, expect=422)  # unset -> set
    assert "the VM folder (spec.vsphere.folder, else spec.hostedClusterRef.name)" in refused
    _patch(api, url, {"folder": "demo"}, expect=200)  # the folder in effect already
    assert "immutable" in _patch(api, url, {"folder": "elsewhere"}, expect=422)  # set -> set
    _patch(api, url, {"folder": None}, expect=200)  # cleared: still "demo"

    other = copy.deepcopy(MINIMAL_SPEC)
    other["nodePoolRef"] = {"name": "other"}
    other["vsphere"]["folder"] = "vms/other"
    created = new_pool(other)
    created["metadata"]["name"] = "other"
    api.post(pools, created)
    refused = _patch(api, f"{pools}/other", {"folder": None}, expect=422)  # set -> unset
    assert "setting, changing or clearing spec.vsphere.folder" in refused
    _patch(api, f"{pools}/other", {"datastoreCluster": "dsc2"}, expect=200)  # others may change


def test_a_full_pool_status_survives_a_status_write_unpruned(api: RestClient, pools: str) -> None:
    created = api.post(pools, new_pool(MINIMAL_SPEC)).body
    status = to_wire(VsphereAgentPool.model_validate(read_fixture("go_pool.yaml")))["status"]
    stored = api.request(
        "PUT", f"{pools}/demo-worker/status", body=created | {"status": status}
    ).body
    assert stored["status"] == status


def test_vsphere_agent_recovery_records_survive_a_status_write_unpruned(
    api: RestClient, agents: str, namespace: str
) -> None:
    agent = VsphereAgent.model_validate(read_fixture("go_vsphereagent.yaml"))
    assert agent.status.iso_ejection is not None
    agent.status.iso_ejection = agent.status.iso_ejection.advanced(
        ISOEjectionPhase.ANSWERED, task_ref="task-81"
    )
    created = api.post(
        agents,
        {
            "apiVersion": agent.api_version,
            "kind": agent.kind,
            "metadata": {"name": agent.metadata.name, "namespace": namespace},
            "spec": to_wire(agent.spec),
        },
    ).body
    status = to_wire(agent.status)
    stored = api.request(
        "PUT", f"{agents}/{agent.metadata.name}/status", body=created | {"status": status}
    ).body
    assert stored["status"] == status
    assert VsphereAgent.model_validate(stored).status == agent.status
