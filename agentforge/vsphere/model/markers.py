"""Ownership markers: how a VM says which pool (and VsphereAgent) created it.

They live in the VM's extraConfig under `agentforge.owner.*` (see the contracts
doc). A VM is *ours* for a caller only when every marker equals the caller's
expectation; a VM with no marker at all is *unmarked* (a user's VM, or one made by
the Go operator, which may be adopted by stamping); anything else is *foreign* and
nothing destructive or overwriting may happen to it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "agentforge.owner."
CREATED_BY = "agent-forge"


class Verdict(enum.Enum):
    OURS = "ours"
    UNMARKED = "unmarked"
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class OwnershipMarkers:
    pool_namespace: str
    pool_name: str
    pool_uid: str
    vsphere_agent: str
    created_by: str = CREATED_BY

    def to_extra_config(self) -> dict[str, str]:
        return {
            PREFIX + "pool-namespace": self.pool_namespace,
            PREFIX + "pool-name": self.pool_name,
            PREFIX + "pool-uid": self.pool_uid,
            PREFIX + "vsphere-agent": self.vsphere_agent,
            PREFIX + "created-by": self.created_by,
        }

    def describe(self) -> str:
        return (
            f"pool {self.pool_namespace}/{self.pool_name} (uid {self.pool_uid}), "
            f"agent {self.vsphere_agent}"
        )


def extract(extra_config: Mapping[str, str]) -> dict[str, str]:
    """Only the `agentforge.owner.*` entries of an extraConfig mapping."""
    return {k: v for k, v in extra_config.items() if k.startswith(PREFIX)}


def parse(extra_config: Mapping[str, str]) -> OwnershipMarkers | None:
    """The markers if all five are present, else None."""
    found = extract(extra_config)
    try:
        return OwnershipMarkers(
            pool_namespace=found[PREFIX + "pool-namespace"],
            pool_name=found[PREFIX + "pool-name"],
            pool_uid=found[PREFIX + "pool-uid"],
            vsphere_agent=found[PREFIX + "vsphere-agent"],
            created_by=found[PREFIX + "created-by"],
        )
    except KeyError:
        return None


def verdict(*, found: Mapping[str, str], expected: OwnershipMarkers) -> Verdict:
    """Compare a VM's marker entries (from `extract`) with what the caller expects."""
    if not found:
        return Verdict.UNMARKED
    if dict(found) == expected.to_extra_config():
        return Verdict.OURS
    return Verdict.FOREIGN
