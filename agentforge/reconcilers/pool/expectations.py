"""Writes a pool's last pass made that the cache does not show yet (client-go's expectations).

A pool's plan is only as good as the cache it was made from: planned again before
the cache shows the VsphereAgents the last pass created or relabelled, the planner
would hand over or create a second time. So the applier records each such write
here (name -> the selection label it must carry), and the pool is not planned again
while the cache shows any of them without it. A write the cache never shows stops
holding the pool back after `EXPECTATION_TIMEOUT` (the object may have been deleted
meanwhile; the next plan sees whatever is there).

The cache is read through the VsphereAgents' parsed records (`common.records`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey, key_for
from agentforge.reconcilers.common import records
from agentforge.reconcilers.planning.snapshot import VsphereAgentFacts

log = logging.getLogger(__name__)

EXPECTATION_TIMEOUT = 10.0
"""Seconds after which a write the cache never showed stops holding the pool back."""


@dataclass
class Expectations:
    """VsphereAgents a pool's last pass created or relabelled, until the cache shows
    them: name -> the selection label they must carry."""

    by_pool: dict[ObjectKey, tuple[float, dict[str, str]]] = field(default_factory=dict)

    def expect(self, key: ObjectKey, name: str, selection: str) -> None:
        _, wanted = self.by_pool.get(key, (0.0, {}))
        wanted[name] = selection
        self.by_pool[key] = (time.monotonic() + EXPECTATION_TIMEOUT, wanted)

    def pending(self, key: ObjectKey, cache: Informer, namespace: str) -> list[str]:
        """The names the cache does not show as written yet (forgotten after the timeout)."""
        entry = self.by_pool.get(key)
        if entry is None:
            return []
        deadline, wanted = entry
        missing = [
            name
            for name, selection in wanted.items()
            if _selection(cache, namespace=namespace, name=name) != selection
        ]
        if not missing or time.monotonic() > deadline:
            if missing:
                log.debug("cache never showed VsphereAgents %s of pool %s", missing, key)
            del self.by_pool[key]
            return []
        return missing


def _selection(cache: Informer, *, namespace: str, name: str) -> str | None:
    """The selection label the cached VsphereAgent carries (None: not cached, or none)."""
    facts = records.record(cache, key_for(namespace=namespace, name=name), VsphereAgentFacts)
    return facts.agent_machine if facts is not None else None
