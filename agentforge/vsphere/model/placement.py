"""Where a pool's VMs go (pure values): what the user wrote, what resolving it found,
and every problem found on the way (`vsphere.placement` resolves and checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentforge.vsphere.model import errors
from agentforge.vsphere.model.specs import NetworkTarget


@dataclass(frozen=True, slots=True)
class Placement:
    datacenter: str
    resource_pool: str
    folder: str
    network: str
    datastore_cluster: str
    iso_datastore: str
    datastore: str = ""
    """A single datastore for the disks instead of `datastore_cluster` (a failure domain
    may name one); empty: the datastore cluster."""
    host: str = ""
    """The ESXi host to create the VM on, below the datacenter's host folder
    (`<cluster>/<host>`: a spread pool's chosen host); empty: DRS picks."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a placement: which object, what, and how to fix it."""

    subject: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message} ({self.fix})"


class PlacementInvalid(errors.InvalidSpec):
    """The placement has problems; `problems` lists all of them."""

    def __init__(self, problems: list[Problem]) -> None:
        text = "; ".join(str(p) for p in problems) or "placement could not be resolved"
        super().__init__(text, subject=problems[0].subject if problems else "placement")
        self.problems = problems


@dataclass(frozen=True, slots=True)
class ResolvedPlacement:
    placement: Placement
    datacenter: Any
    vm_root: Any
    folder: Any | None
    resource_pool: Any
    network: NetworkTarget
    storage_pod: Any
    pod_datastores: Mapping[str, str]
    iso_datastore: Any
    host: Any = None
    """The chosen HostSystem (`placement.host`), else None."""
    free_storage: int = 0
    """Free bytes for the disks when resolved: the datastore's, or the sum over the
    datastore cluster's accessible datastores (a spread pool's tie-break between domains;
    as old as the resolution, so `VsphereService.inspect_storage` reads it fresh)."""
