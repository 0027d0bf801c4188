"""A control plane holding a fleet: N Agents, N AgentMachines and N Machines (N=10,000).

Objects look like production ones where the size matters: an Agent carries a full
discovery inventory (disks, interfaces, CPU flags, memory, boot, a VMware system
vendor whose serial encodes a BIOS UUID), conditions and validation results, about
5 KB of JSON; AgentMachines and Machines carry the nodePool annotation, spec and a
status. Status is a subresource, so each object costs two writes (create, then
status), sent concurrently under a semaphore straight to the apiserver (the proxy's
counters stay for the operator).

`AGENT_FORGE_BENCH_SCALE` overrides N (for trying the benchmarks quickly).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentforge.api import kinds
from agentforge.kube import client, config
from bench.harness import Context
from sim.controlplane import ControlPlane
from sim.operator import install_operator

SCALE = int(os.environ.get("AGENT_FORGE_BENCH_SCALE", "10000"))
AGENT_NAMESPACE = "bench-agents"
CLUSTER_NAMESPACE = "clusters-bench"
CONCURRENCY = 48
NODEPOOL = "bench/np"

# fmt: off
_CPU_FLAGS = (
    "fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "sep", "mtrr", "pge",
    "mca", "cmov", "pat", "pse36", "clflush", "mmx", "fxsr", "sse", "sse2", "ss", "syscall",
    "nx", "pdpe1gb", "rdtscp", "lm", "constant_tsc", "arch_perfmon", "nopl", "xtopology",
    "tsc_reliable", "nonstop_tsc", "cpuid", "tsc_known_freq", "pni", "pclmulqdq", "ssse3",
    "fma", "cx16", "pcid", "sse4_1", "sse4_2", "x2apic", "movbe", "popcnt",
    "tsc_deadline_timer", "aes", "xsave", "avx", "f16c", "rdrand", "hypervisor", "lahf_lm",
    "abm", "3dnowprefetch", "invpcid_single", "ssbd", "ibrs", "ibpb", "stibp", "ibrs_enhanced",
    "fsgsbase", "tsc_adjust", "bmi1", "avx2", "smep", "bmi2", "erms", "invpcid", "avx512f",
    "avx512dq", "rdseed", "adx", "smap", "clflushopt", "clwb", "avx512cd", "sha_ni",
    "avx512bw",
)
# fmt: on


@dataclass(frozen=True, slots=True)
class Fleet:
    controlplane: ControlPlane
    operator_kubeconfig: Path
    admin: client.KubeClient
    scale: int
    create_seconds: float
    requests: int
    agent_bytes: int


def _serial(bios_uuid: uuid.UUID) -> str:
    h = bios_uuid.hex
    pairs = [h[i : i + 2] for i in range(0, 32, 2)]
    return f"VMware-{' '.join(pairs[:8])}-{' '.join(pairs[8:])}"


def _mac(i: int, nic: int) -> str:
    return f"00:50:56:{nic:02x}:{(i >> 8) & 0xFF:02x}:{i & 0xFF:02x}"


def agent_name(i: int) -> str:
    """Agents are named by a UUID, as the Assisted Installer names them."""
    return str(uuid.UUID(int=i + 1))


def agent(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """An Agent (object, status) as the Assisted Installer reports a discovered VM."""
    name = agent_name(i)
    hostname = f"bench-worker-{i:05d}"
    now = "2026-09-01T10:00:00Z"
    disks = [
        {
            "id": f"/dev/disk/by-path/pci-0000:03:00.0-scsi-0:0:{d}:0",
            "byPath": f"/dev/disk/by-path/pci-0000:03:00.0-scsi-0:0:{d}:0",
            "driveType": "HDD",
            "hctl": f"0:0:{d}:0",
            "model": "Virtual disk",
            "name": f"sd{'ab'[d]}",
            "path": f"/dev/sd{'ab'[d]}",
            "serial": f"6000c29{i:09x}{d:016x}",
            "sizeBytes": 107374182400,
            "vendor": "VMware",
            "wwn": f"0x6000c29{i:09x}{d:016x}",
            "bootable": d == 0,
            "smart": '{"json_format_version":[1,0],"smartctl":{"exit_status":4}}',
            "installationEligibility": {"eligible": d == 0, "notEligibleReasons": []},
        }
        for d in range(2)
    ]
    interfaces = [
        {
            "name": f"ens{192 + n * 32}",
            "biosDevName": "",
            "macAddress": _mac(i, n),
            "mtu": 1500,
            "speedMbps": 10000,
            "hasCarrier": True,
            "product": "0x07b0",
            "vendor": "0x15ad",
            "clientID": "",
            "flags": ["up", "broadcast", "multicast", "running"],
            "ipV4Addresses": [f"10.{n}.{(i >> 8) & 0xFF}.{i & 0xFF}/16"],
            "ipV6Addresses": [f"fe80::250:56ff:fe{n:02x}:{i & 0xFFFF:04x}/64"],
        }
        for n in range(2)
    ]
    conditions = [
        {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": now}
        for t, s, r, m in (
            ("SpecSynced", "True", "SyncOK", "The Spec has been successfully applied"),
            ("Connected", "True", "AgentIsConnected", "The agent's connection is healthy"),
            ("RequirementsMet", "True", "HostIsReady", "The agent is ready to begin installation"),
            ("Validated", "True", "ValidationsPassing", "The agent's validations are passing"),
            ("Installed", "False", "InstallationNotStarted", "The installation has not started"),
            ("Bound", "False", "Unbound", "The agent is not bound to any cluster deployment"),
        )
    ]
    validations = {
        group: [{"id": v, "status": "success", "message": f"Host {v} check passed"} for v in ids]
        for group, ids in {
            "hardware": ["has-inventory", "has-min-cpu-cores", "has-min-memory", "has-cpu-cores"],
            "network": ["connected", "ntp-synced", "hostname-unique", "hostname-valid"],
            "operators": ["lso-requirements-satisfied", "odf-requirements-satisfied"],
        }.items()
    }
    obj = {
        "apiVersion": kinds.AGENT.api_version,
        "kind": kinds.AGENT.kind,
        "metadata": {
            "name": name,
            "namespace": AGENT_NAMESPACE,
            "labels": {"infraenvs.agent-install.openshift.io": "bench", "pool": "bench"},
        },
        "spec": {"approved": False, "role": "worker", "hostname": hostname},
    }
    status = {
        "conditions": conditions,
        "debugInfo": {"state": "known", "stateInfo": "Host is ready to be installed"},
        "role": "worker",
        "bootstrap": False,
        "ntpSources": [{"sourceName": "ntp.example.com", "sourceState": "synced"}],
        "validationsInfo": validations,
        "inventory": {
            "hostname": hostname,
            "bmcAddress": "0.0.0.0",
            "bmcV6Address": "::/0",
            "reportTime": now,
            "boot": {"currentBootMode": "uefi", "pxeInterface": ""},
            "cpu": {
                "architecture": "x86_64",
                "clockMegahertz": 2394,
                "count": 4,
                "flags": _CPU_FLAGS,
                "modelName": "Intel(R) Xeon(R) Gold 6240R CPU @ 2.40GHz",
            },
            "memory": {"physicalBytes": 17179869184, "usableBytes": 16765005824},
            "disks": disks,
            "interfaces": interfaces,
            "systemVendor": {
                "manufacturer": "VMware, Inc.",
                "productName": "VMware7,1",
                "serialNumber": _serial(uuid.uuid5(uuid.NAMESPACE_DNS, f"bench-vm-{i}")),
                "virtual": True,
            },
        },
    }
    return obj, status


def agent_machine(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = {
        "apiVersion": kinds.AGENT_MACHINE.api_version,
        "kind": kinds.AGENT_MACHINE.kind,
        "metadata": {
            "name": f"bench-np-{i:05d}",
            "namespace": CLUSTER_NAMESPACE,
            "annotations": {"hypershift.openshift.io/nodePool": NODEPOOL},
            "labels": {"cluster.x-k8s.io/cluster-name": "bench"},
        },
        "spec": {"agentLabelSelector": {"matchLabels": {"pool": "bench"}}},
    }
    status = {
        "ready": False,
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "NoSuitableAgents",
                "severity": "Info",
                "message": "No suitable Agents available",
                "lastTransitionTime": "2026-09-01T10:00:00Z",
            }
        ],
    }
    return obj, status


def machine(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = {
        "apiVersion": kinds.MACHINE.api_version,
        "kind": kinds.MACHINE.kind,
        "metadata": {
            "name": f"bench-np-{i:05d}",
            "namespace": CLUSTER_NAMESPACE,
            "annotations": {"hypershift.openshift.io/nodePool": NODEPOOL},
            "labels": {"cluster.x-k8s.io/cluster-name": "bench"},
        },
        "spec": {
            "clusterName": "bench",
            "bootstrap": {"dataSecretName": f"bench-np-{i:05d}-user-data"},
            "infrastructureRef": {
                "apiVersion": kinds.AGENT_MACHINE.api_version,
                "kind": kinds.AGENT_MACHINE.kind,
                "name": f"bench-np-{i:05d}",
            },
        },
    }
    return obj, {"phase": "Provisioning"}


async def _create_all(
    admin: client.KubeClient,
    kind: kinds.Kind,
    make: Callable[[int], tuple[dict[str, Any], dict[str, Any]]],
    *,
    scale: int,
    semaphore: asyncio.Semaphore,
) -> int:
    async def one(i: int) -> None:
        async with semaphore:
            obj, status = make(i)
            await admin.create(kind, obj)
            meta = obj["metadata"]
            await admin.patch_status(
                kind, namespace=meta["namespace"], name=meta["name"], patch={"status": status}
            )

    async with asyncio.TaskGroup() as group:
        for i in range(scale):
            group.create_task(one(i))
    return scale * 2


async def make_fleet(ctx: Context) -> Fleet:
    """Start a control plane, install the operator's CRDs and RBAC, create the fleet."""
    ctx.step("starting the control plane")
    cp = ControlPlane(quiet=True)
    await asyncio.to_thread(cp.start)
    ctx.on_close(lambda: asyncio.to_thread(cp.stop))
    kubeconfig = await asyncio.to_thread(install_operator, cp)
    for namespace in (AGENT_NAMESPACE, CLUSTER_NAMESPACE):
        await asyncio.to_thread(cp.create_namespace, namespace)
    cfg = await config.load_config(kubeconfig=cp.direct_admin_kubeconfig, environ={})
    admin = client.KubeClient(config=cfg, request_timeout=60)
    ctx.on_close(admin.close)
    ctx.step(f"creating {SCALE:,} Agents, AgentMachines and Machines ({CONCURRENCY} in flight)")
    semaphore = asyncio.Semaphore(CONCURRENCY)
    started = time.monotonic()
    requests = 0
    for kind, make in (
        (kinds.AGENT, agent),
        (kinds.AGENT_MACHINE, agent_machine),
        (kinds.MACHINE, machine),
    ):
        requests += await _create_all(admin, kind, make, scale=SCALE, semaphore=semaphore)
        ctx.step(f"  {kind.plural}: {SCALE:,} created")
    seconds = time.monotonic() - started
    sample, status = agent(0)
    sample["status"] = status
    return Fleet(
        controlplane=cp,
        operator_kubeconfig=kubeconfig,
        admin=admin,
        scale=SCALE,
        create_seconds=seconds,
        requests=requests,
        agent_bytes=len(json.dumps(sample)),
    )


async def fleet(ctx: Context) -> Fleet:
    """The run's one fleet (built by the first benchmark that asks)."""
    return await ctx.shared("fleet", make_fleet)
