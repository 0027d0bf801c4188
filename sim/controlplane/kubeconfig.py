"""Kubeconfig files for the control plane's identities.

Every kubeconfig authenticates with a bearer token (so the HTTPS fault proxy can
forward it unchanged) and verifies TLS against the control plane's CA file. Files
are written with mode 0600 because they hold credentials.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CLUSTER_NAME = "agentforge-test"


def render(*, server: str, ca_file: Path, user: str, token: str, namespace: str = "default") -> str:
    """The YAML text of a single-context kubeconfig."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": CLUSTER_NAME, "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write(
    path: Path, *, server: str, ca_file: Path, user: str, token: str, namespace: str = "default"
) -> Path:
    """Write a kubeconfig to `path` (mode 0600) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    text = render(server=server, ca_file=ca_file, user=user, token=token, namespace=namespace)
    path.write_text(text)
    return path
