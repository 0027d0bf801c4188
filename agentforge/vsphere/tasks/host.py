"""What the task waiter needs of a session, as a narrow Protocol.

`Session` owns a `TaskWaiter`, and the waiter calls back into its session (calls,
re-login, the login generation, pacing options). Typing those call-backs against
this Protocol instead of `Session` keeps the import graph acyclic: `session` imports
`tasks`, and nothing under `tasks`, `task_run` or `task_view` imports `session`.
`Session` satisfies it structurally (mypy checks that where the waiter is built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import tenacity

T = TypeVar("T")


class TaskPacing(Protocol):
    """The session options the waiter reads (`SessionOptions`)."""

    @property
    def retry_initial_seconds(self) -> float: ...
    @property
    def retry_max_seconds(self) -> float: ...
    @property
    def task_batch_seconds(self) -> float: ...
    @property
    def wait_max_seconds(self) -> int: ...


class TaskWaits(Protocol):
    """The one waiter call `task_run` makes."""

    async def wait(self, task: Any, *, subject: str, action: str) -> Any: ...


class TaskHost(Protocol):
    """A logged-in vCenter session as the task modules use it."""

    @property
    def generation(self) -> int: ...
    @property
    def content(self) -> Any: ...
    @property
    def options(self) -> TaskPacing: ...
    @property
    def waiter(self) -> TaskWaits: ...

    def retrying(self) -> tenacity.AsyncRetrying: ...
    async def call(self, fn: Callable[[], T], *, subject: str, action: str) -> T: ...
    async def run_blocking(self, fn: Callable[[], T]) -> T: ...
    def touch(self) -> None: ...
    async def relogin(self, *, seen: int) -> None: ...
