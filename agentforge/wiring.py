"""Settings to parts: what each flag makes of the operator's clients, caches and sessions.

The composition root (`agentforge.app`) runs the process; this module only turns
`Settings` into the values and objects it wires together, so each translation is
one small function a unit test can call without starting anything:

* the informers: which kinds are cached (`CACHED_KINDS`, each declared for RBAC
  `list`/`watch` here), trimmed by `agentforge.api.trim` (`cache_transform`), parsed
  into the reconcilers' records (`reconcilers.common.records`), in LIST pages of
  `LIST_PAGE_SIZE`, over `--namespace` (or all);
* the vSphere session tunables and lockout protection (`vsphere_options`,
  `login_policy`) and how ISO downloads reach the image service (`iso_access`);
* the leader elector (`elector`);
* every controller the operator runs, built from one `Deps` once it leads
  (`build_controllers`): order is start order; each factory installs the informer
  indexes it needs (idempotently), so the list grows without coordinating index set-up.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentforge import vsphere
from agentforge.api import kinds, rbac
from agentforge.api import trim as api_trim
from agentforge.kube import leader
from agentforge.kube.client import KubeClient
from agentforge.kube.controller import Controller
from agentforge.kube.informer import Informer
from agentforge.reconcilers.common import indexes, records
from agentforge.reconcilers.common.deps import Deps
from agentforge.reconcilers.ejection import eject as ejection
from agentforge.reconcilers.infra import reconcile as infra
from agentforge.reconcilers.pool import reconcile as pool
from agentforge.reconcilers.scaleup import reconcile as scaleup
from agentforge.reconcilers.spread import reconcile as spread_rules
from agentforge.reconcilers.vm import reconcile as vm
from agentforge.settings import Settings

__all__ = [
    "CACHED_KINDS",
    "LIST_PAGE_SIZE",
    "build_controllers",
    "cache_transform",
    "elector",
    "informers",
    "iso_access",
    "login_policy",
    "vsphere_options",
]

# Objects per LIST page. client-go's 500 costs ~25 MB of RSS for good: a page of 500
# full Agents (~5 KB of JSON each) is parsed at once, and the freed memory stays
# fragmented around the trimmed objects kept from it (bench/bench_memory.py).
LIST_PAGE_SIZE = 100

CACHED_KINDS: tuple[kinds.Kind, ...] = (
    kinds.VSPHERE_AGENT_POOL,
    kinds.VSPHERE_AGENT,
    kinds.AGENT,
    kinds.AGENT_MACHINE,
    kinds.MACHINE,
    kinds.INFRA_ENV,
)

for _kind in CACHED_KINDS:
    rbac.needs(_kind, "list", "watch", why="informer cache the reconcilers read")


def vsphere_options(settings: Settings) -> vsphere.SessionOptions:
    """The session tunables the flags set (timeouts in seconds)."""
    call_timeout = settings.vsphere_call_timeout.total_seconds()
    return vsphere.SessionOptions(
        max_workers=settings.vsphere_max_workers,
        calls_per_second=settings.vsphere_qps,
        burst=settings.vsphere_burst,
        max_tasks_in_flight=settings.vsphere_max_tasks_in_flight,
        connect_timeout_seconds=settings.vsphere_connect_timeout.total_seconds(),
        login_timeout_seconds=settings.vsphere_login_timeout.total_seconds(),
        http_timeout_seconds=call_timeout,
        idle_close_seconds=settings.vsphere_session_idle_timeout.total_seconds(),
        # the task waiter's long poll must end well before a request times out
        wait_max_seconds=max(1, min(60, int(call_timeout / 2))),
    )


def login_policy(settings: Settings) -> vsphere.LoginPolicy:
    """The lockout protection the flags set."""
    return vsphere.LoginPolicy(
        backoff_seconds=settings.vsphere_login_backoff.total_seconds(),
        backoff_max_seconds=settings.vsphere_login_backoff_max.total_seconds(),
        max_failed_logins=settings.vsphere_max_failed_logins,
        window_seconds=settings.vsphere_failed_login_window.total_seconds(),
    )


def iso_access(settings: Settings, environ: Mapping[str, str]) -> vsphere.IsoAccess:
    """How ISO downloads reach the image service: `--iso-max-size`, `--iso-ca-bundle`
    and the proxy variables of `environ` (ValueError naming a variable that is no
    proxy URL). vCenter connections never use a proxy."""
    bundle = settings.iso_ca_bundle
    return vsphere.IsoAccess(
        limits=vsphere.IsoLimits(max_bytes=settings.iso_max_size),
        proxies=vsphere.Proxies.from_environ(environ),
        ca_bundle=vsphere.CaBundleFile(bundle) if bundle is not None else None,
    )


def cache_transform(kind: kinds.Kind) -> api_trim.Trim:
    """What the informer of `kind` keeps of each object: the kind's trim (which interns
    keys and short strings and shares repeated small mappings, see `api.trim`; nothing
    may copy its output again), else `trim_any`."""
    return api_trim.BY_KIND.get(kind, api_trim.trim_any)


def informers(settings: Settings, client: KubeClient) -> dict[kinds.Kind, Informer]:
    """One informer per cached kind: trimmed, parsed into records where the kind has a
    parser (`reconcilers.common.records`), over `--namespace` (or all)."""
    namespaces = settings.namespaces or None
    return {
        kind: Informer(
            client=client,
            kind=kind,
            namespaces=namespaces,
            transform=cache_transform(kind),
            parse=records.parser(kind),
            page_size=LIST_PAGE_SIZE,
        )
        for kind in CACHED_KINDS
    }


def elector(settings: Settings, lease_client: KubeClient) -> leader.LeaderElector:
    """The Lease elector `--leader-election-*` describe (its own client, no retries)."""
    namespace = settings.leader_election_namespace
    assert namespace is not None  # settings.load resolves it when leader_elect is set
    return leader.LeaderElector(
        store=leader.KubeLeaseStore(
            client=lease_client, namespace=namespace, name=settings.leader_election_id
        ),
        name=settings.leader_election_id,
        identity=leader.default_identity(),
        lease_duration=settings.lease_duration.total_seconds(),
        renew_deadline=settings.renew_deadline.total_seconds(),
        retry_period=settings.retry_period.total_seconds(),
    )


def build_controllers(deps: Deps) -> list[Controller]:
    """Build every controller over the app's informers (the app calls this once it leads)."""
    indexes.install(deps.informers)
    return [
        scaleup.controller(deps),
        pool.controller(deps),
        infra.controller(deps),
        vm.controller(deps, ejection=ejection.Ejection()),
        ejection.controller(deps),
        spread_rules.controller(deps),
    ]
