"""Every controller the operator runs, built from one `Deps` (the app calls this once it leads).

Order is start order; each factory installs the informer indexes it needs
(idempotently), so the list can be extended without coordinating index set-up.
"""

from __future__ import annotations

from agentforge.kube.controller import Controller
from agentforge.reconcilers.common import indexes
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.infra import reconcile as infra
from agentforge.reconcilers.pool import reconcile as pool
from agentforge.reconcilers.scaleup import reconcile as scaleup
from agentforge.reconcilers.spread import reconcile as spread_rules
from agentforge.reconcilers.vm import reconcile as vm


def controllers(deps: Deps) -> list[Controller]:
    """Build every controller over the app's informers."""
    indexes.install(deps.informers)
    return [
        scaleup.controller(deps),
        pool.controller(deps),
        infra.controller(deps),
        vm.controller(deps, ejection=ejection.Ejection()),
        ejection.controller(deps),
        spread_rules.controller(deps),
    ]
