"""A finished task yields its result, or its fault as a typed error."""

from __future__ import annotations

import pytest

from agentforge.vsphere.model import errors
from agentforge.vsphere.tasks import waiter as tasks
from agentforge.vsphere.vmomi import vim


def test_success_returns_the_result() -> None:
    assert (
        tasks.task_outcome({"info.state": "success", "info.result": 7}, subject="s", action="a")
        == 7
    )


def test_a_transient_task_fault_is_transient() -> None:
    props = {"info.state": "error", "info.error": vim.fault.TaskInProgress()}
    with pytest.raises(errors.TransientError):
        tasks.task_outcome(props, subject="VM x", action="power on")


def test_a_permanent_task_fault_names_the_object() -> None:
    props = {"info.state": "error", "info.error": vim.fault.GenericVmConfigFault(reason="no")}
    with pytest.raises(errors.TaskFailed, match="power on VM x"):
        tasks.task_outcome(props, subject="VM x", action="power on")


def test_an_error_without_a_fault_is_still_a_failure() -> None:
    with pytest.raises(errors.TaskFailed):
        tasks.task_outcome({"info.state": "error"}, subject="VM x", action="power on")
