"""govmomi's vSphere simulator (vcsim) with agent-forge's fault injection.

`Vcsim` starts the Go binary `vcsim-af` (built by `make vcsim` from `sim/vcsim/gobuild`)
with the default inventory (datacenter `dc1`, cluster `cluster`, datastores `ds1`/`ds2`
in datastore cluster `dsc1`, ISO datastore `iso-ds`, port groups `VM Network`/`dvpg1`)
and verifiable TLS; `VcsimControl` drives its fault injection: guest-locked CD-ROM
doors and VM questions, scripted task failures, ended sessions, delays, counters and a
request log. See `sim/vcsim/README.md`.
"""

from sim.vcsim.control import YES_NO, VcsimControl, VcsimControlError
from sim.vcsim.launcher import Vcsim, VcsimStartError

__all__ = ["YES_NO", "Vcsim", "VcsimControl", "VcsimControlError", "VcsimStartError"]
