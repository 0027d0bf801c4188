"""Wire compatibility with the Go operator: its objects parse and serialize back unchanged.

"Unchanged" means every field the Go operator wrote comes back with the same value;
the only additions are the defaults our CRD declares that the Go CRD did not, listed
here explicitly so a new one is a deliberate decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from agentforge.api import crdgen
from agentforge.api.conditions import Condition
from agentforge.api.pool import VsphereAgentPool
from agentforge.api.vm import VMPhase
from agentforge.api.vsphereagent import ISOEjectionPhase, VsphereAgent
from agentforge.api.wire import to_wire
from tests.unit.api.support import MINIMAL_SPEC, crd_validator, pool_object

Load = Callable[[str], dict[str, Any]]

# Metadata the models do not keep (the informer cache drops it too).
DROPPED_METADATA = {"managedFields"}


def leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every scalar and empty container in `obj`."""
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(obj, list) and obj:
        for index, value in enumerate(obj):
            yield from leaves(value, f"{prefix}[{index}]")
    else:
        yield prefix, obj


def without_dropped(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k not in DROPPED_METADATA}
    return obj


def added_paths(original: dict[str, Any], dumped: dict[str, Any]) -> set[str]:
    before = dict(leaves(original))
    return {path for path, _ in leaves(dumped) if path not in before}


def test_go_pool_round_trips_without_loss(fixture: Load) -> None:
    original = without_dropped(fixture("go_pool.yaml"))
    dumped = to_wire(VsphereAgentPool.model_validate(original))

    assert dict(leaves(original)).items() <= dict(leaves(dumped)).items()
    assert added_paths(original, dumped) == {
        "spec.iso.ejectAfterInstall",
        "spec.spares",
        "spec.vsphere.failureDomains",  # (issue 15: spreading, opt-in)
        "spec.vsphere.spreadPolicy",
        "status.isoEjections.disabled",
        "status.isoEjections.waitingForInstallation",
        "status.isoEjections.ejectionInProgress",
        "status.isoEjections.ejected",
        "status.isoEjections.ejectionFailed",
        "status.isoEjections.noOwnedMedia",
    }


def test_go_pool_parses_into_typed_values(fixture: Load) -> None:
    pool = VsphereAgentPool.model_validate(fixture("go_pool.yaml"))
    bound = pool.status.owned_vms[0]
    assert bound.phase is VMPhase.BOUND
    assert bound.mac == "00:50:56:aa:bb:cc"
    assert bound.agent_ref is not None
    assert bound.agent_ref.kind == "Agent"
    assert bound.last_transition_time == datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    assert pool.spec.iso.check_interval == "10m0s"
    assert pool.status.iso.history[1].size_bytes == 1073737728


def test_go_vsphere_agent_round_trips_and_gains_the_derived_phase(fixture: Load) -> None:
    original = without_dropped(fixture("go_vsphereagent.yaml"))
    agent = VsphereAgent.model_validate(original)
    dumped = to_wire(agent)

    assert dict(leaves(original)).items() <= dict(leaves(dumped)).items()
    assert added_paths(original, dumped) == {
        "status.isoEjection.phase",
        "status.isoEjection.attempts",
    }
    assert agent.status.iso_ejection is not None
    assert agent.status.iso_ejection.phase is ISOEjectionPhase.QUESTION_RECORDED


def test_round_tripped_objects_reparse_equal(fixture: Load) -> None:
    pool = VsphereAgentPool.model_validate(fixture("go_pool.yaml"))
    agent = VsphereAgent.model_validate(fixture("go_vsphereagent.yaml"))
    assert VsphereAgentPool.model_validate(to_wire(pool)) == pool
    assert VsphereAgent.model_validate(to_wire(agent)) == agent


@pytest.mark.parametrize(
    ("resource", "name"),
    [(crdgen.POOL, "go_pool.yaml"), (crdgen.VSPHERE_AGENT, "go_vsphereagent.yaml")],
)
def test_serialized_objects_are_valid_against_our_crd(
    fixture: Load, resource: crdgen.Resource, name: str
) -> None:
    model = resource.root.model_validate(fixture(name))
    errors = [e.message for e in crd_validator(resource).iter_errors(to_wire(model))]
    assert errors == []


def test_timestamps_serialize_as_kubernetes_writes_them() -> None:
    condition = Condition.model_validate(
        {
            "type": "Ready",
            "status": "True",
            "reason": "VMReady",
            "lastTransitionTime": "2026-03-01T10:00:00.123456+01:00",
        }
    )
    assert to_wire(condition)["lastTransitionTime"] == "2026-03-01T09:00:00Z"


def test_status_without_none_fields_but_with_empty_lists() -> None:
    pool_status = to_wire(VsphereAgentPool.model_validate(pool_object(MINIMAL_SPEC)))["status"]
    assert pool_status["ownedVMs"] == []
    assert pool_status["conditions"] == []
    assert "observedGeneration" not in pool_status
