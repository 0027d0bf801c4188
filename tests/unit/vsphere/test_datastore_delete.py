"""`datastore.delete`: only the task's FileNotFound means "was not there".

A `NotFound` can also mean that vCenter forgot the delete task (tasks expire; the waiter
fails a forgotten one with `NotFound` naming the task) or that another object of the
call went missing: the delete's outcome is then unknown, and one HEAD decides. The
task and the HEAD are scripted here; the simulator covers the injected faults.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentforge.vsphere import faults
from agentforge.vsphere.iso import datastore_files as datastore
from agentforge.vsphere.model import errors
from agentforge.vsphere.tasks import view as task_view
from agentforge.vsphere.tasks import waiter
from agentforge.vsphere.vmomi import vim, vmodl

WHERE = datastore.Location(datacenter="dc1", datastore="iso-ds")
PATH = "agent-forge/ns/pool/x.iso"


class Script:
    """What the delete task ends in, and what a HEAD says afterwards."""

    def __init__(
        self, *, task_error: BaseException | None, exists: bool | BaseException = False
    ) -> None:
        self.task_error = task_error
        self.exists = exists
        self.heads = 0

    async def run_task(self, session: Any, start: Any, **_: Any) -> Any:
        if self.task_error is not None:
            raise self.task_error
        return None

    async def head(self, session: Any, *, where: datastore.Location, path: str) -> bool:
        self.heads += 1
        if isinstance(self.exists, BaseException):
            raise self.exists
        return self.exists


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    current = Script(task_error=None)

    async def refs(session: Any, where: datastore.Location) -> tuple[Any, Any, Any]:
        return (vim.Datacenter("datacenter-1"), None, None)

    monkeypatch.setattr(datastore, "_refs", refs)
    monkeypatch.setattr(waiter, "run_task", current.run_task)
    monkeypatch.setattr(datastore, "exists", current.head)
    return current


class FakeSession:
    content = type("Content", (), {"fileManager": object()})()


async def delete() -> bool:
    return await datastore.delete(FakeSession(), where=WHERE, path=PATH)  # type: ignore[arg-type]


def task_fault(fault: BaseException) -> errors.VsphereError:
    return faults.classify(fault, subject=WHERE.path(PATH), action="delete")


async def test_a_finished_delete_means_deleted_without_asking_again(script: Script) -> None:
    assert await delete() is True
    assert script.heads == 0


async def test_the_tasks_file_not_found_fault_means_it_was_not_there(script: Script) -> None:
    script.task_error = task_fault(vim.fault.FileNotFound(file=PATH))
    assert await delete() is False
    assert script.heads == 0


async def test_a_forgotten_task_and_an_absent_file_mean_gone(script: Script) -> None:
    script.task_error = task_view.gone_error(vim.Task("task-42"))
    script.exists = False
    assert await delete() is True
    assert script.heads == 1


async def test_a_forgotten_task_and_a_file_still_there_is_not_absent_but_retried(
    script: Script,
) -> None:
    script.task_error = task_view.gone_error(vim.Task("task-42"))
    script.exists = True
    with pytest.raises(errors.TransientError, match="still there") as info:
        await delete()
    assert "task-42" in str(info.value)


@pytest.mark.parametrize(
    "fault",
    [
        vmodl.fault.ManagedObjectNotFound(obj=vim.Datacenter("datacenter-1")),
        vim.fault.NotFound(),
    ],
    ids=["ManagedObjectNotFound", "NotFound"],
)
async def test_another_not_found_fault_is_not_taken_for_an_absent_file(
    script: Script, fault: BaseException
) -> None:
    script.task_error = task_fault(fault)
    script.exists = True
    with pytest.raises(errors.TransientError):
        await delete()
    script.exists = False
    assert await delete() is True
    assert script.heads == 2


async def test_a_failing_check_after_an_unknown_outcome_is_raised_not_read_as_absent(
    script: Script,
) -> None:
    script.task_error = task_view.gone_error(vim.Task("task-42"))
    script.exists = errors.TransientError("HEAD timed out", subject=PATH)
    with pytest.raises(errors.TransientError, match="HEAD timed out"):
        await delete()


async def test_other_errors_are_raised_unchanged(script: Script) -> None:
    script.task_error = errors.PermissionDenied("no privilege", subject=PATH)
    with pytest.raises(errors.PermissionDenied):
        await delete()
    assert script.heads == 0
