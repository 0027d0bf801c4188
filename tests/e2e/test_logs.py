"""Logs that tell: each problem an admin must fix is one warning line, its end one info line.

The real operator process (its ServiceAccount, JSON logs at the shipped `info` level)
meets, in one world, the problems a platform team meets first: a wrong password, an
untrusted vCenter certificate, a missing datastore cluster, an ISO URL that fails,
and a refused ISO ejection. For each the test waits until the operator has retried
it several times (its Warning events count up, the image service saw the requests,
the refused-ejection counter grows), fixes it, waits for the condition to clear, and
then greps the log: for that object and condition exactly one `warning` line
(`transition: started`, naming the object, the reason and the fix) and exactly one
`info` line (`transition: cleared`), whatever the number of retries.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentforge.api import kinds, names
from sim.operator import MetricsReader
from sim.world import Snapshot, World
from sim.world.snapshot import condition_of
from tests.e2e import ejection_support as ej
from tests.e2e.conftest import OPERATOR_KEY
from tests.e2e.support import OperatorHarness, eventually

WITHIN = 120.0
FAST_LOGINS = (
    # Refused logins retried within seconds (production: 5 min doubling), so the test
    # sees retries; the failure budget raised so LoginDeferred does not take over.
    "--vsphere-login-backoff=1s",
    "--vsphere-login-backoff-max=2s",
    "--vsphere-max-failed-logins=100",
    "--credentials-refresh-interval=2s",
)


class Harness(OperatorHarness):
    def _args(self) -> list[str]:
        return [*super()._args(), *FAST_LOGINS]


@pytest.fixture
async def quick_operator(
    request: pytest.FixtureRequest,
    operator_kubeconfig: Path,
    metrics_reader: MetricsReader,
    world: World,
    tmp_path: Path,
) -> AsyncIterator[OperatorHarness]:
    harness = Harness(
        kubeconfig=operator_kubeconfig,
        namespaces=(world.namespace, world.control_plane_namespace),
        log_path=tmp_path / "operator.log",
        metrics=metrics_reader,
    )
    request.node.stash[OPERATOR_KEY] = harness
    try:
        await harness.start()
        yield harness
    finally:
        await harness.stop()
    assert world.vcsim.password not in harness.log_text(), "the operator logged a password"


def transitions(harness: OperatorHarness, obj: str, condition: str) -> list[tuple[str, str, str]]:
    """(level, transition, reason) of the condition log's lines about `obj`/`condition`."""
    assert harness.process is not None
    return [
        (e["level"], e["transition"], e["reason"])
        for e in harness.process.log_entries()
        if e.get("logger") == "agentforge.kube.condition_log"
        and e.get("object") == obj
        and e.get("condition") == condition
    ]


def lines_about(harness: OperatorHarness, obj: str, condition: str) -> list[dict[str, Any]]:
    assert harness.process is not None
    return [
        e
        for e in harness.process.log_entries()
        if e.get("object") == obj and e.get("condition") == condition
    ]


def retries(snap: Snapshot, pool: str, reason: str) -> int:
    """How often the operator reported `reason` about `pool` (aggregated Events)."""
    return sum(
        int(e.get("count") or 1)
        for e in snap.events_about("VsphereAgentPool", pool)
        if e.get("reason") == reason
    )


def shows(pool: str, condition: str, status: str, reason: str) -> Callable[[Snapshot], bool]:
    def check(snap: Snapshot) -> bool:
        found = condition_of(snap.pool(pool), condition)
        return found is not None and (found["status"], found["reason"]) == (status, reason)

    return check


async def secret(world: World, name: str, **data: str) -> None:
    await world.client.create(
        kinds.SECRET,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": world.namespace},
            "stringData": data,
        },
    )


async def test_each_problem_is_one_warning_when_it_starts_and_one_info_when_it_clears(
    world: World, quick_operator: OperatorHarness
) -> None:
    ns, vc = world.namespace, world.vcsim
    ca = await asyncio.to_thread(Path(vc.ca_file).read_text)
    folder = f"e2e/{ns}"
    await world.create_infraenv("discovery")
    await world.create_infraenv("failing")
    world.iso_server.fail(ns, "failing", status=404)
    await world.create_credentials()
    await secret(
        world,
        "wrong-password",
        server=vc.server,
        username=vc.username,
        password="wrong",
        **{"caBundle": ca},
    )
    await secret(world, "no-ca", server=vc.server, username=vc.username, password=vc.password)
    problems = {
        # pool: (condition, reason of the problem, Event that counts the retries)
        "password": ("VsphereReady", "LoginFailed", "LoginFailed"),
        "untrusted": ("VsphereReady", "VcenterUntrusted", "VcenterUntrusted"),
        "placement": ("VsphereReady", "VsphereUnavailable", "VsphereUnavailable"),
        "iso": ("ISOReady", "ISOCacheFailed", "ISOCacheFailed"),
    }
    await world.create_pool("password", secret="wrong-password", folder=folder)
    await world.create_pool("untrusted", secret="no-ca", folder=folder)
    await world.create_pool(
        "placement", folder=folder, overrides={"vsphere": {"datastoreCluster": "no-such-dsc"}}
    )
    await world.create_pool("iso", infraenv="failing", folder=folder)

    # Each problem reported, then retried (the untrusted certificate, the missing
    # datastore cluster and the refused image after 30 s, the others within seconds).
    for pool, (condition, reason, event) in problems.items():

        def retried(
            s: Snapshot, p: str = pool, c: str = condition, r: str = reason, e: str = event
        ) -> bool:
            return shows(p, c, "False", r)(s) and retries(s, p, e) >= 2

        await eventually(
            world.snapshot,
            retried,
            within=WITHIN,
            what=f"pool {pool}: {condition}=False/{reason}, retried",
        )
    assert world.iso_server.stats(ns, "failing").requests >= 2

    # Fix each the way an admin would.
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=ns,
        name="wrong-password",
        patch={"data": {"password": base64.b64encode(vc.password.encode()).decode()}},
    )
    await world.client.patch_merge(
        kinds.SECRET,
        namespace=ns,
        name="no-ca",
        patch={"data": {"caBundle": base64.b64encode(ca.encode()).decode()}},
    )
    await world.client.patch_merge(
        kinds.VSPHERE_AGENT_POOL,
        namespace=ns,
        name="placement",
        patch={"spec": {"vsphere": {"datastoreCluster": "dsc1"}}},
    )
    world.iso_server.heal(ns, "failing")
    await world.client.patch_merge(  # try the healed image service now, not at its back-off
        kinds.VSPHERE_AGENT_POOL,
        namespace=ns,
        name="iso",
        patch={"metadata": {"annotations": {names.ANNOTATION_FORCE_ISO_REFRESH: "healed"}}},
    )
    for pool, (condition, _, _) in problems.items():

        def fixed(s: Snapshot, p: str = pool, c: str = condition) -> bool:
            return (condition_of(s.pool(p), c) or {}).get("status") == "True"

        await eventually(
            world.snapshot,
            fixed,
            within=WITHIN,
            what=f"pool {pool}: {condition}=True",
        )

    for pool, (condition, reason, _) in problems.items():
        obj = f"{ns}/{pool}"
        assert transitions(quick_operator, obj, condition) == [
            ("warning", "started", reason),
            ("info", "cleared", reason),
        ], f"pool {pool}"
        started = lines_about(quick_operator, obj, condition)[0]["msg"]
        assert started.startswith(f"VsphereAgentPool {obj}: {condition} is False ({reason}): ")
        assert "; to fix: " in started
    # Nothing else was a warning: the retries (logins, downloads) are info or debug lines.
    assert quick_operator.process is not None
    loud = [
        (e["logger"], e["msg"][:80])
        for e in quick_operator.process.log_entries()
        if e["level"] in ("warning", "error")
    ]
    assert len(loud) == len(problems)
    assert {logger for logger, _ in loud} == {"agentforge.kube.condition_log"}


async def test_a_refused_ejection_is_one_warning_and_its_end_one_info(
    world: World, operator: OperatorHarness
) -> None:
    await ej.set_up(world, eject_after_install=True)
    ej.hold_installation(world)
    await world.nodepool(ej.POOL).scale(1)
    snap = await ej.bound(world, 1)
    (va,) = ej.vas_of(snap)
    vm = ej.vm_of(snap, va)
    agent = snap.agent_of_vm(vm)
    assert agent is not None
    inventory = dict(agent["status"]["inventory"])
    mismatched = [
        {**i, "macAddress": "00:50:56:3f:ff:fe"} for i in inventory.get("interfaces") or []
    ]
    await world.client.patch_status(
        kinds.AGENT,
        namespace=world.namespace,
        name=agent["metadata"]["name"],
        patch={"status": {"inventory": {**inventory, "interfaces": mismatched}}},
    )
    ej.release_installation(world)
    await ej.wait_reasons(world, {"EjectionFailed"})

    async def refusals() -> float:
        assert operator.process is not None
        found = await operator.process.metric(
            "agent_forge_iso_operations_total", operation="eject", result="refused"
        )
        return found or 0.0

    await eventually(refusals, lambda n: n >= 3, within=WITHIN, what="3 refused ejections")
    # The Agent's identity matches the VM again: the ejection goes ahead.
    await world.client.patch_status(
        kinds.AGENT,
        namespace=world.namespace,
        name=agent["metadata"]["name"],
        patch={"status": {"inventory": inventory}},
    )
    await ej.wait_reasons(world, {"Ejected"})

    obj = f"{world.namespace}/{va['metadata']['name']}"
    assert transitions(operator, obj, "ISOEjected") == [
        ("warning", "started", "EjectionFailed"),
        ("info", "cleared", "EjectionFailed"),
    ]
    started = lines_about(operator, obj, "ISOEjected")[0]["msg"]
    assert started.startswith(f"VsphereAgent {obj}: ISOEjected is False (EjectionFailed): ")
    assert "MAC" in started
    assert operator.process is not None
    loud = [e for e in operator.process.log_entries() if e["level"] in ("warning", "error")]
    assert [e["msg"] for e in loud] == [started], "each refusal retried is not a warning again"
