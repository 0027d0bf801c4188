"""Where the next VM of a spread pool goes, and which DRS rule is the pool's (pure).

A pool with failure domains (`spreadPolicy: Spread`) places each new VM in two steps,
both decided here from counts and capacities the caller read, so the choice can be
tested without vCenter and repeated after a crash from the same facts:

1. `choose_domain`: of the usable domains, the one holding the fewest of the pool's
   VMs; ties go to the most free capacity, then to the name (deterministic).
2. `choose_host`: of the usable hosts of that domain's cluster (connected, not in
   maintenance, in its host group when one is set), the one holding the fewest of the
   pool's VMs; ties by free capacity, then name.

Filling the least loaded bucket first keeps any two usable buckets within one VM of
each other, so after N VMs over H hosts no host holds more than ceil(N/H), and losing
one host costs at most that many (tests/unit/vsphere/test_spread.py, property-tested).
An unusable domain or host is never chosen and never silently dropped: the caller gets
it back in `Choice.skipped` with its reason, to report as a pool condition.

The anti-affinity rule the operator keeps per pool and cluster is recognised by its
name only when it carries both the prefix and the pool's own UID marker
(`owned_rule`); a rule that lacks either is someone else's and never touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

RULE_PREFIX: Final = "agent-forge-spread"
"""Every rule the operator creates is named `<prefix>-<pool uid>-<namespace>-<pool>`."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """A domain or a host as the choice sees it."""

    name: str
    vms: int
    """How many of the pool's VMs it holds now (including creations in flight)."""
    free: int = 0
    """Free capacity (bytes of storage for a domain, MiB of memory for a host)."""
    unusable: str | None = None
    """Why it cannot take a VM (datastore full, cluster gone, host disconnected)."""


@dataclass(frozen=True, slots=True)
class Choice:
    chosen: Bucket | None
    """None when no bucket is usable."""
    skipped: tuple[Bucket, ...] = ()
    """The unusable buckets, each with its reason, to be reported."""


def choose(buckets: Iterable[Bucket]) -> Choice:
    """The usable bucket holding the fewest VMs; ties by most free, then name."""
    usable: list[Bucket] = []
    skipped: list[Bucket] = []
    for bucket in buckets:
        (skipped if bucket.unusable else usable).append(bucket)
    chosen = min(usable, key=lambda b: (b.vms, -b.free, b.name), default=None)
    return Choice(chosen=chosen, skipped=tuple(sorted(skipped, key=lambda b: b.name)))


choose_domain = choose
choose_host = choose


def rule_name(*, pool_uid: str, namespace: str, pool: str) -> str:
    """The pool's rule name (vCenter allows 80 characters: the tail is cut, the UID kept,
    and a cut that ends on a separator drops it: no `...-a-`)."""
    return f"{RULE_PREFIX}-{pool_uid}-{namespace}-{pool}"[:80].rstrip("-")


def owned_rule(names: Sequence[str], *, pool_uid: str) -> str | None:
    """The one rule name proven to be this pool's: the prefix and its UID marker."""
    marker = f"{RULE_PREFIX}-{pool_uid}-"
    mine = [n for n in names if pool_uid and n.startswith(marker)]
    return mine[0] if len(mine) == 1 else None


@dataclass(frozen=True, slots=True)
class RuleChange:
    """What to do with the pool's rule in one cluster."""

    action: str
    """`none`, `add`, `edit` or `remove`."""
    members: tuple[str, ...] = ()
    """The VM morefs the rule should hold (sorted)."""


def rule_change(*, existing: Sequence[str] | None, members: Iterable[str]) -> RuleChange:
    """The rule keeps the pool's VMs of the cluster apart: it needs two of them to mean
    anything (vCenter refuses fewer), so with fewer it is removed."""
    want = tuple(sorted(set(members)))
    if len(want) < 2:
        return RuleChange("remove") if existing is not None else RuleChange("none")
    if existing is None:
        return RuleChange("add", want)
    if tuple(sorted(existing)) == want:
        return RuleChange("none", want)
    return RuleChange("edit", want)


__all__ = [
    "RULE_PREFIX",
    "Bucket",
    "Choice",
    "RuleChange",
    "choose",
    "choose_domain",
    "choose_host",
    "owned_rule",
    "rule_change",
    "rule_name",
]
