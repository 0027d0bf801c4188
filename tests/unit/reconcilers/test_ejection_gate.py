"""When an ISO ejection may start: the gate (cache only) and the start plan (one VM read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentforge import vsphere
from agentforge.api import views
from agentforge.api.conditions import ISOEjectedReason
from agentforge.reconcilers.ejection import gate
from tests.unit.reconcilers import ejection_support as es
from tests.unit.reconcilers import planner_support as ps

POOL = "demo/workers"


def agent(**kw: Any) -> views.Agent:
    return views.Agent.model_validate(es.installed_agent(**kw))


def decide(**kw: Any) -> gate.Hold | gate.Start:
    args: dict[str, Any] = {
        "enabled": True,
        "pool": POOL,
        "current": None,
        "vm_name": es.VM,
        "vm_ready": True,
        "released": False,
        "machine_deleting": None,
        "agent": agent(),
    }
    args.update(kw)
    return gate.gate(**args)


def held(result: gate.Hold | gate.Start) -> ISOEjectedReason | None:
    assert isinstance(result, gate.Hold), result
    return result.reason


# --- the gate ----------------------------------------------------------------------------


def test_installed_true_starts_an_ejection() -> None:
    assert isinstance(decide(), gate.Start)


def test_a_pool_that_has_not_opted_in_shows_disabled_and_names_the_field() -> None:
    result = decide(enabled=False)
    assert held(result) is ISOEjectedReason.DISABLED
    assert isinstance(result, gate.Hold)
    assert "spec.iso.ejectAfterInstall" in result.message


def test_bound_but_not_installed_never_starts_an_ejection() -> None:
    result = decide(agent=agent(installed="False"))
    assert held(result) is ISOEjectedReason.WAITING_FOR_INSTALLATION
    assert isinstance(result, gate.Hold)
    assert "Bound alone is not enough" in result.message


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"released": True}, "Released"),
        ({"machine_deleting": "m-1"}, "Machine m-1"),
        ({"agent": agent(deleting=True)}, "being deleted"),
    ],
)
def test_scale_down_starts_no_new_ejection(change: dict[str, Any], why: str) -> None:
    result = decide(**change)
    assert held(result) is ISOEjectedReason.DISABLED
    assert isinstance(result, gate.Hold)
    assert why in result.message


@pytest.mark.parametrize("change", [{"vm_ready": False}, {"vm_name": None}, {"agent": None}])
def test_a_vm_without_an_installed_agent_waits(change: dict[str, Any]) -> None:
    assert held(decide(**change)) is ISOEjectedReason.WAITING_FOR_INSTALLATION


@pytest.mark.parametrize(
    "change",
    [{"enabled": False}, {"released": True}, {"agent": None}, {}],
)
def test_an_ejected_condition_is_kept(change: dict[str, Any]) -> None:
    result = decide(current=ISOEjectedReason.EJECTED, **change)
    assert held(result) is None


def test_ejected_survives_opting_out_even_when_the_agent_reinstalls() -> None:
    assert (
        held(
            decide(current=ISOEjectedReason.EJECTED, enabled=False, agent=agent(installed="False"))
        )
        is None
    )


def test_a_reinstalling_worker_of_an_opted_in_pool_waits_to_be_ejected_again() -> None:
    result = decide(current=ISOEjectedReason.EJECTED, agent=agent(installed="False"))
    assert held(result) is ISOEjectedReason.WAITING_FOR_INSTALLATION


@pytest.mark.parametrize("change", [{}, {"agent": None}, {"vm_ready": False}])
def test_no_owned_media_is_kept_without_a_vsphere_read(change: dict[str, Any]) -> None:
    assert held(decide(current=ISOEjectedReason.NO_OWNED_MEDIA, **change)) is None


def test_no_owned_media_turns_disabled_when_the_pool_opts_out() -> None:
    assert (
        held(decide(current=ISOEjectedReason.NO_OWNED_MEDIA, enabled=False))
        is ISOEjectedReason.DISABLED
    )


def test_no_owned_media_is_looked_at_again_after_a_reinstall() -> None:
    result = decide(current=ISOEjectedReason.NO_OWNED_MEDIA, agent=agent(installed="False"))
    assert held(result) is ISOEjectedReason.WAITING_FOR_INSTALLATION
    assert isinstance(decide(current=ISOEjectedReason.WAITING_FOR_INSTALLATION), gate.Start)


def test_a_vm_still_waiting_for_its_first_agent_says_so() -> None:
    for unmatched in (None, gate.Unmatched(once_matched=False)):
        result = decide(agent=None, unmatched=unmatched)
        assert isinstance(result, gate.Hold)
        assert result.message == f"waiting for an Agent to register from VM {es.VM}"


def test_an_agent_whose_serial_changed_after_binding_is_named_not_waited_for() -> None:
    changed = agent(bios_uuid=ps.uuid(8))
    result = decide(
        agent=None,
        unmatched=gate.Unmatched(
            once_matched=True,
            phase="Orphaned/AgentMissing",
            bios_uuid=es.UUID,
            mac=es.MAC,
            claimants=(changed,),
        ),
    )
    assert held(result) is ISOEjectedReason.WAITING_FOR_INSTALLATION
    assert isinstance(result, gate.Hold)
    assert "register" not in result.message
    serial = changed.status.inventory.system_vendor.serial_number
    assert result.message == (
        f"no Agent is matched to VM {es.VM} any more (BIOS UUID {es.UUID}, MAC {es.MAC}; "
        f"phase Orphaned/AgentMissing): Agent {ps.NS}/{es.AGENT}, bound to AgentMachine am-1, "
        f"Installed=True reports serial {serial} and MACs {es.MAC}, which does not identify "
        "the VM; nothing is ejected until an Agent that identifies the VM reports Installed=True"
    )


def test_an_agent_that_went_away_after_binding_is_said_to_be_gone() -> None:
    result = decide(
        agent=None,
        unmatched=gate.Unmatched(once_matched=True, phase="Orphaned/AgentMissing"),
    )
    assert isinstance(result, gate.Hold)
    assert "register" not in result.message
    assert "the Agent it had is gone or no longer reports its BIOS UUID or MAC" in result.message


def test_a_released_reclaimed_worker_keeps_ejected() -> None:
    assert (
        held(
            decide(current=ISOEjectedReason.EJECTED, released=True, agent=agent(installed="False"))
        )
        is None
    )


# --- which media is ours -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backing", "ours"),
    [
        (es.ISO, True),
        (f"[iso-ds] {es.PREFIX}//{es.SHA}.iso", False),
        (f"[ds1] {es.PREFIX}/{es.SHA}.iso", False),
        (f"[iso-ds] agent-forge/other/{es.SHA}.iso", False),
        (f"[iso-ds] {es.PREFIX}/nested/{es.SHA}.iso", False),
        (f"[iso-ds] {es.PREFIX}/tools.iso", False),
        (f"[iso-ds] {es.PREFIX}/{es.SHA.upper()}.iso", False),
        (f"[iso-ds] {es.PREFIX}/{es.SHA[:-2]}.iso", False),
        (f"[iso-ds] {es.PREFIX}/{es.SHA}.img", False),
        (None, False),
    ],
)
def test_only_a_content_addressed_file_in_the_pool_datastore_and_prefix_is_ours(
    backing: str | None, ours: bool
) -> None:
    assert gate.is_content_addressed(backing, datastore="iso-ds", prefix=es.PREFIX) is ours


def test_a_prefix_given_with_slashes_still_matches() -> None:
    assert gate.is_content_addressed(es.ISO, datastore="iso-ds", prefix=f"/{es.PREFIX}/")


# --- the start plan ------------------------------------------------------------------------


def plan(vm: vsphere.VmFacts | None, **kw: Any) -> gate.StartPlan:
    args: dict[str, Any] = {
        "vm": vm,
        "vm_name": es.VM,
        "bios_uuid": es.UUID,
        "datacenter": es.DATACENTER,
        "expected": es.markers(),
        "agent": agent(),
        "datastore": "iso-ds",
        "prefix": es.PREFIX,
    }
    args.update(kw)
    return gate.plan_start(**args)


def test_the_cdrom_holding_the_pool_iso_is_chosen_and_a_second_cdrom_is_not() -> None:
    other = es.cdrom(3001, "[iso-ds] tools/vmware-tools.iso")
    result = plan(es.vm_facts(cdroms=(other, es.cdrom(3002))))
    assert result.cdrom is not None
    assert result.cdrom.key == 3002


LOOK_ALIKES = [
    pytest.param(
        f"[iso-ds] agent-forge/{ps.NS}/other-pool/{es.SHA}.iso",
        f"in folder agent-forge/{ps.NS}/other-pool/, not directly in the pool's pathPrefix "
        f"{es.PREFIX}/",
        id="another-pools-prefix",
    ),
    pytest.param(
        f"[ds1] {es.PREFIX}/{es.SHA}.iso",
        "on datastore ds1, not the pool's isoDatastore iso-ds",
        id="another-datastore",
    ),
    pytest.param(
        f"[iso-ds] {es.PREFIX}/old/{es.SHA}.iso",
        f"in sub-folder {es.PREFIX}/old/, not directly in the pool's pathPrefix {es.PREFIX}/",
        id="a-sub-folder",
    ),
    pytest.param(
        f"[iso-ds] {es.PREFIX}/rhcos-live.iso",
        "rhcos-live.iso is not a cached ISO's name (<sha256>.iso)",
        id="not-content-addressed",
    ),
    pytest.param(
        f"[iso-ds] {es.PREFIX}/{es.SHA.upper()}.iso",
        f"{es.SHA.upper()}.iso is not a cached ISO's name (<sha256>.iso)",
        id="upper-case-digest",
    ),
    pytest.param(
        f"[iso-ds] {es.SHA}.iso",
        f"in the datastore's root folder, not directly in the pool's pathPrefix {es.PREFIX}/",
        id="datastore-root",
    ),
    pytest.param(
        "/vmfs/volumes/iso-ds/x.iso",
        "not a datastore path ([datastore] folder/name.iso)",
        id="not-a-path",
    ),
]


@pytest.mark.parametrize(("backing", "why"), LOOK_ALIKES)
def test_a_look_alike_medium_is_not_ejected_nor_reported_ejected(backing: str, why: str) -> None:
    result = plan(es.vm_facts(cdroms=(es.cdrom(3000, backing),)))
    assert result.cdrom is None
    assert result.reason is ISOEjectedReason.NO_OWNED_MEDIA
    assert result.message == (
        f"VM {es.VM} holds none of the pool's cached ISOs ([iso-ds] {es.PREFIX}/<sha256>.iso), "
        f"so nothing was ejected: CD-ROM 3000 holds {backing}: {why}. What is attached stays "
        "attached"
    )


def test_every_cdrom_is_named_with_what_it_holds() -> None:
    client = dataclasses.replace(
        es.cdrom(3001, None), kind=vsphere.MediumKind.CLIENT, connected=True
    )
    host = dataclasses.replace(
        es.cdrom(3002, None), kind=vsphere.MediumKind.HOST, backing_file="/dev/sr0", connected=True
    )
    empty = es.cdrom(3003, None)  # what an eject leaves
    other = es.cdrom(3000, f"[ds1] {es.PREFIX}/{es.SHA}.iso")
    result = plan(es.vm_facts(cdroms=(other, client, host, empty)))
    assert result.reason is ISOEjectedReason.NO_OWNED_MEDIA
    assert "CD-ROM 3000 holds [ds1]" in result.message
    assert "; CD-ROM 3001 is backed by a client device, not an ISO file" in result.message
    assert "; CD-ROM 3002 is backed by the host device /dev/sr0, not an ISO file" in result.message
    assert "; CD-ROM 3003 is disconnected and empty." in result.message


def test_a_connected_client_device_alone_is_no_owned_media() -> None:
    client = dataclasses.replace(
        es.cdrom(3000, None), kind=vsphere.MediumKind.CLIENT, connected=True
    )
    assert plan(es.vm_facts(cdroms=(client,))).reason is ISOEjectedReason.NO_OWNED_MEDIA


def test_empty_cdroms_are_found_ejected_and_said_so() -> None:
    result = plan(es.vm_facts(cdroms=(es.cdrom(3000, None), es.cdrom(3001, None))))
    assert result.cdrom is None
    assert result.reason is ISOEjectedReason.EJECTED
    assert result.message == (
        f"no discovery ISO is attached to VM {es.VM}: CD-ROM 3000, CD-ROM 3001 are disconnected "
        "and empty (ejected before, by agent-forge or by hand); nothing was done"
    )


def test_a_vm_without_a_cdrom_says_so() -> None:
    facts = dataclasses.replace(es.vm_facts(), cdroms=())
    result = plan(facts)
    assert result.reason is ISOEjectedReason.EJECTED
    assert result.message == (
        f"no discovery ISO is attached to VM {es.VM}: it has no CD-ROM; nothing was done"
    )


def test_a_look_alike_beside_the_pools_iso_stays_and_the_pools_iso_is_chosen() -> None:
    alike = es.cdrom(3000, f"[iso-ds] {es.PREFIX}/old/{es.SHA}.iso")
    result = plan(es.vm_facts(cdroms=(alike, es.cdrom(3001))))
    assert result.cdrom is not None
    assert result.cdrom.key == 3001


def test_a_vm_with_another_owners_markers_is_refused() -> None:
    foreign = es.markers(vsphere_agent="someone-else")
    result = plan(es.vm_facts(owner=foreign))
    assert result.cdrom is None
    assert result.reason is ISOEjectedReason.EJECTION_FAILED
    assert "nothing was touched" in result.message


def test_an_unmarked_vm_with_the_recorded_name_counts_as_ours() -> None:
    result = plan(es.vm_facts(unmarked=True))
    assert result.cdrom is not None


def test_an_unmarked_vm_with_another_name_is_refused() -> None:
    result = plan(es.vm_facts(unmarked=True), vm_name="another-vm")
    assert result.reason is ISOEjectedReason.EJECTION_FAILED


def test_an_agent_whose_serial_is_another_vm_is_refused() -> None:
    result = plan(es.vm_facts(), agent=agent(bios_uuid=ps.uuid(8)))
    assert result.reason is ISOEjectedReason.EJECTION_FAILED
    assert "serial" in result.message


def test_an_agent_whose_macs_are_not_the_vms_is_refused() -> None:
    result = plan(es.vm_facts(), agent=agent(macs=(ps.mac(8),)))
    assert result.reason is ISOEjectedReason.EJECTION_FAILED
    assert "MAC" in result.message


def test_a_question_pending_before_the_start_is_not_ours_and_nothing_starts() -> None:
    result = plan(es.vm_facts(pending=es.question(message="msg.uuid.altered")))
    assert result.cdrom is None
    assert result.reason is ISOEjectedReason.EJECTION_FAILED
    assert "did not raise" in result.message


def test_a_vm_that_is_gone_is_reported() -> None:
    result = plan(None)
    assert result.reason is ISOEjectedReason.EJECTION_FAILED
    assert es.UUID in result.message
