"""Shared pytest wiring: each simulator contributes its fixtures as a plugin."""

pytest_plugins = [
    "sim.testing",
    "sim.controlplane.pytest_plugin",
    "sim.vcsim.pytest_plugin",
]
