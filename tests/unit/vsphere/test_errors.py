"""pyVmomi faults become typed errors; unknown failures are never 'not found'."""

from __future__ import annotations

import http.client

import pytest

from agentforge.vsphere import faults
from agentforge.vsphere.model import errors
from agentforge.vsphere.vmomi import vim, vmodl


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (vim.fault.NotAuthenticated(), errors.SessionExpired),
        (vim.fault.InvalidLogin(), errors.PermissionDenied),
        (
            vim.fault.NoPermission(privilegeId="VirtualMachine.Inventory.Create"),
            errors.PermissionDenied,
        ),
        (vim.fault.TaskInProgress(), errors.TransientError),
        (vmodl.fault.SystemError(reason="x"), errors.TransientError),
        (vmodl.fault.ManagedObjectNotFound(), errors.NotFound),
        (vim.fault.FileNotFound(file="[ds] x"), errors.NotFound),
        (vim.fault.DuplicateName(name="vm"), errors.AlreadyExists),
        (vim.fault.FileAlreadyExists(file="[ds] x"), errors.AlreadyExists),
        (vmodl.fault.InvalidArgument(invalidProperty="x"), errors.InvalidSpec),
        (vim.fault.InvalidPowerState(), errors.InvalidState),
        (vim.fault.GenericVmConfigFault(reason="no"), errors.TaskFailed),
    ],
)
def test_faults_are_classified_by_type(fault: BaseException, expected: type) -> None:
    err = faults.classify(fault, subject="VM web-1", action="power on")
    assert type(err) is expected


def test_a_session_expiry_is_transient_so_it_is_retried() -> None:
    err = faults.classify(vim.fault.NotAuthenticated(), subject="s", action="a")
    assert faults.is_transient(err)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(),
        TimeoutError(),
        http.client.HTTPException("503 Service Unavailable"),
    ],
)
def test_transport_errors_are_transient(exc: BaseException) -> None:
    assert faults.is_transient(faults.classify(exc, subject="s", action="a"))


def test_an_unknown_error_is_neither_transient_nor_not_found() -> None:
    err = faults.classify(RuntimeError("weird"), subject="VM x", action="read")
    assert not isinstance(err, errors.NotFound | errors.TransientError)


def test_messages_name_the_object_and_the_action() -> None:
    err = faults.classify(vim.fault.DuplicateName(name="vm"), subject="VM web-1", action="create")
    assert "create VM web-1" in str(err)
    assert err.fault == "DuplicateName"


def test_a_permission_fault_names_the_missing_privilege() -> None:
    fault = vim.fault.NoPermission(privilegeId="VirtualMachine.Inventory.Create")
    err = faults.classify(fault, subject="folder f", action="create VM in")
    assert "VirtualMachine.Inventory.Create" in str(err)
