"""VM facts are parsed from one property read, without further requests."""

from __future__ import annotations

from agentforge.vsphere.vm import read_facts as facts
from agentforge.vsphere.vmomi import vim

Dev = vim.vm.device
ISO = "[iso-ds] p/abc.iso"


def _props(**overrides: object) -> dict[str, object]:
    nic_b = Dev.VirtualVmxnet3(key=4001, macAddress="00:50:56:AA:BB:02")
    nic_a = Dev.VirtualVmxnet3(key=4000, macAddress="00-50-56-AA-BB-01")
    cd_iso = Dev.VirtualCdrom(
        key=3000,
        controllerKey=200,
        unitNumber=0,
        backing=Dev.VirtualCdrom.IsoBackingInfo(fileName=ISO),
        connectable=Dev.VirtualDevice.ConnectInfo(connected=True, startConnected=True),
    )
    cd_client = Dev.VirtualCdrom(
        key=3001,
        controllerKey=200,
        unitNumber=1,
        backing=Dev.VirtualCdrom.RemotePassthroughBackingInfo(deviceName=""),
        connectable=Dev.VirtualDevice.ConnectInfo(connected=False, startConnected=False),
    )
    base: dict[str, object] = {
        "name": "vm-1",
        "config.uuid": "421C5A3B-1122-3344-5566-778899AABBCC",
        "config.instanceUuid": "501c5a3b-1122-3344-5566-778899aabbcc",
        "config.hardware.device": [nic_b, cd_iso, nic_a, cd_client],
        "config.extraConfig": [
            vim.option.OptionValue(key="agentforge.owner.pool-name", value="p"),
            vim.option.OptionValue(key="disk.enableUUID", value="TRUE"),
        ],
        "runtime.powerState": "poweredOn",
        "runtime.question": None,
    }
    base.update(overrides)
    return base


def test_identity_is_normalized() -> None:
    got = facts.parse_vm("vm-7", _props())
    assert got.bios_uuid == "421c5a3b-1122-3344-5566-778899aabbcc"
    assert got.primary_mac == "00:50:56:aa:bb:01"  # lowest device key, lower-case colons
    assert got.macs == ("00:50:56:aa:bb:01", "00:50:56:aa:bb:02")


def test_only_ownership_markers_are_kept_from_extra_config() -> None:
    assert facts.parse_vm("vm-7", _props()).markers == {"agentforge.owner.pool-name": "p"}


def test_every_cdrom_is_reported_with_its_medium() -> None:
    got = facts.parse_vm("vm-7", _props())
    iso, client = got.cdroms
    assert (iso.key, iso.kind, iso.backing_file, iso.connected) == (
        3000,
        facts.MediumKind.ISO,
        ISO,
        True,
    )
    assert (client.kind, client.backing_file, client.connected) == (
        facts.MediumKind.CLIENT,
        None,
        False,
    )
    assert got.cdrom(3001) == client
    assert got.cdrom(1) is None


def test_a_pending_question_is_reported_with_ids_and_choices() -> None:
    question = vim.vm.QuestionInfo(
        id="_vmx1",
        text="locked",
        choice=vim.option.ChoiceOption(
            choiceInfo=[
                vim.ElementDescription(key="0", label="Yes", summary="Yes"),
                vim.ElementDescription(key="1", label="No", summary="No"),
            ],
            defaultIndex=1,
        ),
        message=[vim.vm.Message(id="msg.cdromdisconnect.locked", text="locked")],
    )
    got = facts.parse_vm("vm-7", _props(**{"runtime.question": question}))
    assert got.question is not None
    assert got.question.id == "_vmx1"
    assert got.question.is_cdrom_lock
    assert [c.key for c in got.question.choices] == ["0", "1"]


def test_unknown_power_state_is_not_guessed() -> None:
    assert (
        facts.parse_vm("vm-7", _props(**{"runtime.powerState": "weird"})).power_state
        is facts.PowerState.UNKNOWN
    )
