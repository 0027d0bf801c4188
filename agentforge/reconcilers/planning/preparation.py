"""Agent preparation: what an Available VM's Agent must carry so its AgentMachine binds it.

DOMAIN.md section 3: the pool's labels, the nodepool discriminator (the pool's own
`agent-forge.containeroo.ch/nodepool` label value, else the NodePool's name), the
role label and `spec.role`, `spec.hostname` = the VM name, the selection label (the
AgentMachine the VM serves: the target of a hand-over as the plan records it in
`status.handover`, else the one it was made for; the VM name for an adopted VM) and,
unless the pool says `approve: false`, `spec.approved=true`. A patch holds only the
fields that differ, so a prepared Agent costs nothing and the patch is safe to
repeat. A patch that names a hand-over's target before its record is stored waits
for that record (`AgentPatch.after_record`, applied by `pool_apply`).

A warm spare's Agent (its selection is a spare value, `naming.is_spare_selection`)
gets the spare selection label, hostname, role and approval, but none of the pool's
labels: no AgentMachine's selector matches it, pinned or not, so CAPI cannot bind it
before a hand-over prepares it for one AgentMachine.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from agentforge.api import names
from agentforge.api.pool import VsphereAgentPool
from agentforge.reconcilers.planning.naming import is_spare_selection
from agentforge.reconcilers.planning.snapshot import AgentFacts, HandoverFacts, VsphereAgentFacts

_SELECTION: Final = names.LABEL_AGENT_MACHINE


class AgentPatch(NamedTuple):
    agent: str
    vm: str
    patch: Mapping[str, Any]
    """An RFC 7386 merge patch holding only the fields that differ."""
    after_record: str | None = None
    """The VsphereAgent whose `status.handover` this plan writes and whose AgentMachine
    the selection label names: apply only once that record is stored (it is the
    checkpoint of the hand-over)."""


def discriminator(pool: VsphereAgentPool) -> str:
    """The `nodepool` label value telling this pool's Agents from other pools' ones."""
    return pool.spec.agent.labels.get(names.LABEL_NODEPOOL) or pool.spec.node_pool_ref.name


def desired_labels(pool: VsphereAgentPool, *, selection: str) -> dict[str, str]:
    labels = dict(pool.spec.agent.labels)
    labels[names.LABEL_NODEPOOL] = discriminator(pool)
    labels[names.LABEL_NODEPOOL_ROLE] = pool.spec.agent.role
    labels[names.LABEL_AGENT_MACHINE] = selection
    return labels


@dataclass(frozen=True, slots=True)
class Preparation:
    """What a prepared Agent of this pool carries, computed once per plan."""

    labels: Mapping[str, str]
    role: str
    approve: bool

    @classmethod
    def of(cls, pool: VsphereAgentPool) -> Preparation:
        base = desired_labels(pool, selection="")
        del base[names.LABEL_AGENT_MACHINE]
        return cls(labels=base, role=pool.spec.agent.role, approve=pool.spec.agent.approve)

    def patch(
        self, va: VsphereAgentFacts, agent: AgentFacts, handover: HandoverFacts | None
    ) -> AgentPatch | None:
        """The patch preparing `agent` for `va`, whose `status.handover` the plan keeps
        (or writes) as `handover`: the selection label follows the plan's decision, so
        the next plan, once this one is applied, finds nothing to patch."""
        have = agent.labels
        vm_name = va.vm_name
        labels: dict[str, str] = {}
        # `va.target` with the plan's record, inlined: this runs per VM per plan
        target = handover.selection if handover is not None and handover.to else va.agent_machine
        selection = target or vm_name
        if not is_spare_selection(selection):
            for key, value in self.labels.items():
                if have.get(key) != value:
                    labels[key] = value
        after = None
        if have.get(_SELECTION) != selection:
            labels[_SELECTION] = selection
            if handover != va.handover:
                after = va.name
        spec: dict[str, Any] = {}
        if agent.role != self.role:
            spec["role"] = self.role
        if agent.spec_hostname != vm_name:
            spec["hostname"] = vm_name
        if self.approve and not agent.approved:
            spec["approved"] = True
        if not labels and not spec:
            return None
        patch: dict[str, Any] = {}
        if labels:
            patch["metadata"] = {"labels": labels}
        if spec:
            patch["spec"] = spec
        return AgentPatch(agent.name, vm_name, patch, after)
