"""Datastores and their files as values (pure): a datastore of a datacenter by name,
and a file found on it (`vsphere.datastore` does the I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentforge.vsphere.model.specs import datastore_path


@dataclass(frozen=True, slots=True)
class Location:
    """A datastore of a datacenter, by name."""

    datacenter: str
    datastore: str

    def path(self, relative: str) -> str:
        return datastore_path(self.datastore, relative.strip("/"))


@dataclass(frozen=True, slots=True)
class DatastoreFile:
    path: str  # relative to the datastore root
    size: int | None
    modified: datetime | None
