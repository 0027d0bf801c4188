"""The operator's cluster configuration for a test kubeconfig, loaded once per file version.

`agentforge.kube.config.load_config` reads a kubeconfig in a child Python process that
imports kubernetes_asyncio's loaders (what the operator does once at start, to keep
them out of its memory): one to two seconds of a CPU each time. Tests and simulated
worlds read the same few kubeconfigs (the control plane's identities) hundreds of times
in a run, so they load each file version once here. The loader itself is unchanged and
still runs once per file; its own tests call it directly. The files these tests use hold
static bearer tokens (`sim.controlplane.kubeconfig`), so the loaded configuration is
plain data, safe to share between tests and event loops.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from agentforge.kube.config import ClusterConfig, load_config

__all__ = ["cluster_config"]

_loaded: dict[tuple[str, int, int], ClusterConfig] = {}


async def cluster_config(kubeconfig: Path | str) -> ClusterConfig:
    """`load_config(kubeconfig=..., environ={})`, remembered per path, mtime and size."""
    key = await asyncio.to_thread(_version, kubeconfig)
    loaded = _loaded.get(key)
    if loaded is None:
        loaded = await load_config(kubeconfig=key[0], environ={})
        _loaded[key] = loaded
    return loaded


def _version(kubeconfig: Path | str) -> tuple[str, int, int]:
    path = os.path.realpath(kubeconfig)
    stat = os.stat(path)
    return path, stat.st_mtime_ns, stat.st_size
