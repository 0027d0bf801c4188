"""The fault proxy: an HTTPS front for the apiserver that counts and breaks things.

Run as its own process (`python -m sim.controlplane.proxy`, started by
`ControlPlane`). Clients talk to it exactly as to the apiserver; a separate
loopback control port (see `control_api`) injects faults and reads counters.
"""
