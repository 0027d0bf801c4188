"""Deterministic names: the same inputs give the same name after any crash or restart.

A restart that recomputes a different name would create a second object or VM, so
every name the operator invents is a pure function of stable identifiers
(docs/design/0002-reconcilers.md, "Names").
"""

from __future__ import annotations

import hashlib
import re

MAX_OBJECT_NAME = 253
MAX_DNS_LABEL = 63
_NON_DNS = re.compile(r"[^a-z0-9-]+")


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def vsphere_agent_name(*, agent_machine: str) -> str:
    """The first choice for the VsphereAgent made for an AgentMachine: its own name."""
    return agent_machine


def vsphere_agent_fallback_name(
    *, namespace: str, pool: str, agent_machine: str, uid: str = ""
) -> str:
    """The name used when `agent_machine` is taken by an object of another pool or AM;
    with the AgentMachine's `uid`, the one used when that is taken too (a VsphereAgent
    handed to another AgentMachine keeps its name)."""
    key = f"{namespace}/{pool}/{agent_machine}" + (f"/{uid}" if uid else "")
    suffix = "-" + _digest(key, 10)
    stem = f"{agent_machine}-{pool}"[: MAX_OBJECT_NAME - len(suffix)].rstrip("-.")
    return stem + suffix


_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")


def selection_label_value(*, agent_machine: str) -> str:
    """The `agent-machine` selection label value for an AgentMachine: its name.

    Object names may be 253 characters, label values only 63; a longer name becomes
    `<first 52>-<10 hex of sha256(name)>`, still unique and stable.
    """
    if _LABEL_VALUE.fullmatch(agent_machine):
        return agent_machine
    suffix = "-" + _digest(agent_machine, 10)
    stem = agent_machine[: MAX_DNS_LABEL - len(suffix)].rstrip("-.")
    return stem + suffix


def vm_name(*, name_prefix: str, namespace: str, vsphere_agent: str) -> str:
    """`<namePrefix>-<8 hex>`: a valid DNS label, because it becomes the Agent's hostname."""
    suffix = "-" + _digest(f"{namespace}/{vsphere_agent}", 8)
    stem = _NON_DNS.sub("-", name_prefix.lower()).strip("-") or "agent"
    return stem[: MAX_DNS_LABEL - len(suffix)].rstrip("-") + suffix


SPARE_SELECTION_PREFIX = "spare_"
"""Warm spares' selection label values start with this: an AgentMachine's value
(`selection_label_value`: a lower-case DNS name, or its stem and hex digits) never
holds an underscore, so no AgentMachine's pinned selector matches a spare's Agent."""


def spare_selection(*, vsphere_agent: str) -> str:
    """The selection label value of the warm spare `vsphere_agent` (stable, unique)."""
    return SPARE_SELECTION_PREFIX + _digest(vsphere_agent, 16)


def is_spare_selection(value: str | None) -> bool:
    return value is not None and value.startswith(SPARE_SELECTION_PREFIX)


def spare_name(*, pool: str, index: int) -> str:
    """The name of the pool's `index`-th warm spare VsphereAgent: `<pool>-spare-<index>`."""
    suffix = f"-spare-{index}"
    return pool[: MAX_OBJECT_NAME - len(suffix)].rstrip("-.") + suffix


def spare_index(name: str) -> int | None:
    """The index in a `spare_name`, if `name` is one."""
    stem, sep, index = name.rpartition("-spare-")
    return int(index) if sep and stem and index.isdigit() else None
