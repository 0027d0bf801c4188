"""A VM is ours only when every ownership marker equals the caller's expectation."""

from __future__ import annotations

from agentforge.vsphere.model import markers

OURS = markers.OwnershipMarkers(
    pool_namespace="ns", pool_name="pool", pool_uid="uid-1", vsphere_agent="va-1"
)


def test_markers_live_under_the_agentforge_owner_prefix() -> None:
    assert OURS.to_extra_config() == {
        "agentforge.owner.pool-namespace": "ns",
        "agentforge.owner.pool-name": "pool",
        "agentforge.owner.pool-uid": "uid-1",
        "agentforge.owner.vsphere-agent": "va-1",
        "agentforge.owner.created-by": "agent-forge",
    }


def test_exact_markers_are_ours() -> None:
    found = markers.extract({**OURS.to_extra_config(), "disk.enableUUID": "TRUE"})
    assert markers.verdict(found=found, expected=OURS) is markers.Verdict.OURS


def test_no_markers_is_unmarked() -> None:
    found = markers.extract({"disk.enableUUID": "TRUE"})
    assert markers.verdict(found=found, expected=OURS) is markers.Verdict.UNMARKED


def test_another_pools_uid_is_foreign() -> None:
    other = {**OURS.to_extra_config(), "agentforge.owner.pool-uid": "uid-2"}
    assert markers.verdict(found=other, expected=OURS) is markers.Verdict.FOREIGN


def test_a_partial_set_of_markers_is_foreign_not_unmarked() -> None:
    partial = {"agentforge.owner.pool-name": "pool"}
    assert markers.verdict(found=partial, expected=OURS) is markers.Verdict.FOREIGN


def test_an_extra_unknown_marker_makes_the_vm_foreign() -> None:
    extra = {**OURS.to_extra_config(), "agentforge.owner.something": "x"}
    assert markers.verdict(found=extra, expected=OURS) is markers.Verdict.FOREIGN


def test_parse_needs_all_five_markers() -> None:
    assert markers.parse(OURS.to_extra_config()) == OURS
    assert markers.parse({"agentforge.owner.pool-name": "pool"}) is None
