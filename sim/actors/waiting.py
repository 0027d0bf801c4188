"""Waiting for named conditions with deadlines, never for time to pass.

`eventually(probe, until, what=, within=)` calls `probe()` (a plain function or a
coroutine function) until `until(value)` holds, truthy by default, and returns that
value: the one poll-until helper of every suite. When the deadline passes it fails
with an `AssertionError` that says what was awaited and shows the last observed value
(its `describe()` when it has one, else its repr), or the last error the probe raised:
a failed run then reads as "waited 60 s for 3 bound Agents; last observed: ...", not
as a bare timeout.

`consistently(probe, holds, duration=, what=)` is the converse, for rules of the form
"nothing happens": it keeps observing for `duration` seconds and fails at the first
observation that breaks the rule. It watches, it does not sleep blindly.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["WaitTimeout", "consistently", "describe", "eventually"]

T = TypeVar("T")
_MAX_DESCRIPTION = 6000


class WaitTimeout(AssertionError):
    """A named condition did not come true in time; the message shows the last state."""


def describe(value: Any) -> str:
    """A readable rendering of an observed value for failure messages."""
    render = getattr(value, "describe", None)
    text = render() if callable(render) else repr(value)
    if len(text) > _MAX_DESCRIPTION:
        text = text[:_MAX_DESCRIPTION] + f"... ({len(text) - _MAX_DESCRIPTION} more characters)"
    return text


# The overloads type the result: without `until` it is truthy, so never None.
@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    within: float = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], object],
    *,
    what: str,
    within: float = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    *,
    what: str,
    within: float = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T],
    until: Callable[[T], object],
    *,
    what: str,
    within: float = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    until: Callable[[Any], object] = bool,
    *,
    what: str,
    within: float = 30.0,
    interval: float = 0.2,
) -> Any:
    """The first value of `probe()` for which `until` holds, within `within` seconds of
    the loop's clock (virtual under looptime)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: str = "(never observed)"
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except (AssertionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            last = f"probe raised {type(exc).__name__}: {exc}"
        else:
            if until(value):
                return value
            last = describe(value)
        if loop.time() >= deadline:
            raise WaitTimeout(f"waited {within:g}s for {what}; last observed:\n{last}")
        await asyncio.sleep(interval)


async def consistently(
    probe: Callable[[], Awaitable[T]],
    holds: Callable[[T], bool],
    *,
    duration: float,
    what: str,
    interval: float = 0.25,
) -> T:
    """Observe for `duration` seconds that `holds` stays true; return the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration
    while True:
        value = await probe()
        if not holds(value):
            raise AssertionError(f"expected {what} to hold, but observed:\n{describe(value)}")
        if loop.time() >= deadline:
            return value
        await asyncio.sleep(interval)
