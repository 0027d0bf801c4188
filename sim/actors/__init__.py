"""Stand-ins for the software around the operator: HyperShift, CAPI, Assisted Installer.

Each actor behaves as section 1 of `shared/DOMAIN.md` says its real counterpart does,
talking to the control plane (as admin) and to vcsim (over its SDK) exactly as that
software would, never through the operator's own code:

| module | plays |
|---|---|
| `isoserver` | the image service: a generated discovery ISO per InfraEnv, ETag/304 |
| `infraenv` | assisted-service's InfraEnv controller: `isoDownloadURL`, `ImageCreated` |
| `nodepool` | HyperShift NodePool + CAPI MachineSet/Machine controllers: scale, drain |
| `capi` | cluster-api-provider-agent: bind waiting AgentMachines, unbind on deletion |
| `assisted` | the Assisted Installer: register Agents for booted VMs, install, reclaim |

`sim.world.World` composes them; `waiting` holds `eventually`/`consistently`.
"""

from sim.actors.assisted import AssistedInstaller
from sim.actors.base import DEMO_TIMINGS, Actor, Journal, Timings
from sim.actors.capi import CapiAgentProvider
from sim.actors.infraenv import InfraEnvStandIn
from sim.actors.isoserver import IsoImage, IsoServer, IsoStats, discovery_iso
from sim.actors.nodepool import MachineController, NodePoolDriver
from sim.actors.vcenter import VcenterReader, VmFact
from sim.actors.waiting import consistently, eventually

__all__ = [
    "DEMO_TIMINGS",
    "Actor",
    "AssistedInstaller",
    "CapiAgentProvider",
    "InfraEnvStandIn",
    "IsoImage",
    "IsoServer",
    "IsoStats",
    "Journal",
    "MachineController",
    "NodePoolDriver",
    "Timings",
    "VcenterReader",
    "VmFact",
    "consistently",
    "discovery_iso",
    "eventually",
]
