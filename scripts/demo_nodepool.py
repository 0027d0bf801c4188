"""Scale a NodePool of the demo's simulated HyperShift (`make demo KEEP=1`).

In a real management cluster a NodePool is scaled with
`oc -n <namespace> scale nodepool <name> --replicas N` (or by the autoscaler), and
HyperShift and CAPI render one Machine + AgentMachine pair per replica. The demo has
no HyperShift; this command plays that part for docs/getting-started.md: it creates
(or, scaling down, deletes the newest) Machine + AgentMachine pairs in the hosted
control plane namespace exactly as `sim.actors.nodepool.NodePoolDriver` does for the
tests, so the demo's CAPI and Assisted Installer stand-ins and the operator take it
from there.

The NodePool is described by the VsphereAgentPool that serves it (the pool's
`spec.nodePoolRef`, `spec.controlPlaneNamespace`, `spec.hostedClusterRef` and
`spec.agent.labels`, which a real NodePool's agentLabelSelector matches), so create
the pool first.

    python -m scripts.demo_nodepool demo/burst --replicas 2
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from agentforge.api import kinds
from agentforge.kube import config as kube_config
from agentforge.kube import errors
from agentforge.kube.client import KubeClient
from sim.actors.base import Journal
from sim.actors.nodepool import NodePoolDriver

__all__ = ["main", "scale"]


async def scale(
    client: KubeClient, *, namespace: str, nodepool: str, replicas: int
) -> tuple[int, list[str]]:
    """Scale NodePool `namespace/nodepool` to `replicas`.

    Returns the replicas before and the names of the Machines created or deleted.
    """
    pools = (await client.list(kinds.VSPHERE_AGENT_POOL, namespace=namespace)).items
    serving = [p for p in pools if p["spec"]["nodePoolRef"]["name"] == nodepool]
    if not serving:
        raise SystemExit(
            f"error: no VsphereAgentPool in namespace {namespace} serves NodePool {nodepool}; "
            "create the pool first (its spec.nodePoolRef.name names the NodePool)"
        )
    spec = serving[0]["spec"]
    driver = NodePoolDriver(
        client=client,
        namespace=namespace,
        nodepool=nodepool,
        control_plane_namespace=spec["controlPlaneNamespace"],
        cluster_name=spec["hostedClusterRef"]["name"],
        labels=dict(spec["agent"]["labels"]),
        journal=Journal(),
    )
    before = await driver.replicas()
    return before, await driver.scale(replicas)


async def _run(args: argparse.Namespace) -> int:
    namespace, _, nodepool = args.nodepool.partition("/")
    if not nodepool:
        print("error: name the NodePool as <namespace>/<name>, e.g. demo/burst", file=sys.stderr)
        return 2
    cfg = await kube_config.load_config(kubeconfig=args.kubeconfig)
    async with KubeClient(config=cfg, user_agent="agent-forge-demo-nodepool") as client:
        before, touched = await scale(
            client, namespace=namespace, nodepool=nodepool, replicas=args.replicas
        )
    if not touched:
        print(f"NodePool {args.nodepool} already has {before} replica(s)")
    elif args.replicas > before:
        print(
            f"NodePool {args.nodepool} scaled {before} -> {args.replicas}: created Machine + "
            f"AgentMachine {', '.join(touched)}"
        )
    else:
        print(
            f"NodePool {args.nodepool} scaled {before} -> {args.replicas}: deleting Machine(s) "
            f"{', '.join(touched)} (CAPI drains them, then removes their AgentMachines)"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.demo_nodepool", description=__doc__)
    parser.add_argument("nodepool", help="<namespace>/<name> of the NodePool")
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--kubeconfig", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.replicas < 0:
        parser.error("--replicas must be 0 or more")
    try:
        return asyncio.run(_run(args))
    except (kube_config.ConfigError, errors.KubeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
