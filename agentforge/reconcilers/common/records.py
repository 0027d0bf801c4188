"""The one typed record each cached object of a parsed kind is parsed into, once per version.

The informer keeps a trimmed dict per object for the reconcilers that write back,
and, for the kinds the reconcilers read (VsphereAgentPools as their model; Agents,
AgentMachines, Machines, VsphereAgents and InfraEnvs as planner facts), a record
parsed once per object version, on its first read, by the parser named here
(`PARSERS`, `parser`; the composition root hands it to each informer). Reconcilers
read those records (`record`), never parse the cached dict again: the rules that
decide a fact live in one place (`planning.snapshot`), and a record is read-only
(facts by type; a pool's model by convention: `model_copy` it to change it), so no
reader can change the shared cache through it.

An object its parser rejects is logged by the informer once per version and has no
record; readers skip it as if it were not cached (one odd object never stops a plan).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agentforge.api import kinds
from agentforge.api.pool import VsphereAgentPool
from agentforge.kube.informer import Informer
from agentforge.kube.store import ObjectKey
from agentforge.reconcilers.planning.snapshot import (
    agent_facts,
    agent_machine_facts,
    infra_env_facts,
    machine_facts,
    vsphere_agent_facts,
)

__all__ = ["PARSERS", "parser", "record"]

Parser = Callable[[dict[str, Any]], object]
R = TypeVar("R")

PARSERS: Mapping[kinds.Kind, Parser] = {
    kinds.VSPHERE_AGENT_POOL: VsphereAgentPool.model_validate,
    kinds.AGENT: agent_facts,
    kinds.AGENT_MACHINE: agent_machine_facts,
    kinds.MACHINE: machine_facts,
    kinds.VSPHERE_AGENT: vsphere_agent_facts,
    kinds.INFRA_ENV: infra_env_facts,
}
"""Each parsed kind's parser; a kind not named here is cached as a dict only."""


def parser(kind: kinds.Kind) -> Parser | None:
    """The parse hook for the informer of `kind` (None: keep dicts only)."""
    return PARSERS.get(kind)


def record(informer: Informer, key: ObjectKey, kind: type[R]) -> R | None:
    """The `kind` record of the cached object `key` (None when it is not cached or its
    parser rejected it). An informer built without this kind's parser is a wiring
    mistake, not an empty cache: TypeError naming it."""
    found = informer.record(key)
    if found is None:
        if not informer.parses:
            raise TypeError(f"the {informer.kind.kind} informer keeps no records (no parser)")
        return None
    if not isinstance(found, kind):
        raise TypeError(f"a {informer.kind.kind} record is a {type(found).__name__}, not {kind}")
    return found
