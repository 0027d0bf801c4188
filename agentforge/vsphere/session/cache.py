"""What a session remembers between calls, one typed field per kind of thing.

Managed object references are valid for one vCenter session's lifetime at most, and
a stale one is detected by the next call that uses it (`ManagedObjectNotFound`, or a
read whose `config.uuid` no longer matches), never trusted: callers drop the entry
and resolve afresh. Each field says what it maps; `Memo` computes a value once even
when many callers ask for it at the same time (concurrent reconciles of one pool
resolve its placement, and create its folder, once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentforge.vsphere.model.datastore import Location
from agentforge.vsphere.model.placement import Placement, ResolvedPlacement

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """Values by key, each made at most once at a time."""

    def __init__(self) -> None:
        self._values: dict[K, V] = {}
        self._locks: dict[K, asyncio.Lock] = {}

    def get(self, key: K) -> V | None:
        return self._values.get(key)

    def put(self, key: K, value: V) -> None:
        self._values[key] = value

    def forget(self, key: K) -> None:
        self._values.pop(key, None)

    async def get_or_make(self, key: K, make: Callable[[], Awaitable[V]]) -> V:
        """The value for `key`, made by `make()` once for concurrent callers."""
        if key in self._values:
            return self._values[key]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self._values:
                return self._values[key]
            value = await make()
            self._values[key] = value
            return value


@dataclass(slots=True)
class SessionCache:
    """Per-session lookups. Morefs are pyVmomi objects, hence `Any` values."""

    datacenters: Memo[str, Any] = field(default_factory=Memo)
    """Datacenter inventory path -> `vim.Datacenter`."""
    datastores: Memo[Location, tuple[Any, Any, Any]] = field(default_factory=Memo)
    """Datastore -> (datacenter, datastore, its browser) morefs."""
    placements: Memo[Placement, ResolvedPlacement] = field(default_factory=Memo)
    """A pool's placement -> its resolved morefs (replaced once its folder exists)."""
    folders: Memo[Placement, Any] = field(default_factory=Memo)
    """A placement -> its VM folder, created on first use."""
    directories: Memo[tuple[Location, str], bool] = field(default_factory=Memo)
    """(datastore, folder) -> True once `mkdir -p` of the folder succeeded."""
    vms: dict[str, Any] = field(default_factory=dict)
    """Canonical BIOS UUID -> `vim.VirtualMachine`, re-checked on every read."""
    vapi_token: str | None = None
    """The vAPI (REST) session token for tagging, made on first use."""
