"""Ports for the control plane's components: held from everyone else until they bind.

Two pytest workers (and any other test run on the machine) start control planes at the
same moment; a port chosen by one must not be handed to another process before the
component it is meant for binds it.
"""

from __future__ import annotations

import contextlib
import errno
import socket

import pytest

from sim.controlplane.processes import free_ports


def test_the_ports_are_distinct_and_no_bind_to_port_0_gets_one() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    with contextlib.ExitStack() as stack:
        picked = set()
        for _ in range(200):  # what other workers, operators and clients bind meanwhile
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            picked.add(sock.getsockname()[1])
    assert picked.isdisjoint(ports)


def test_a_plain_bind_is_refused_and_a_server_with_so_reuseaddr_binds() -> None:
    (port,) = free_ports(1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:
        with pytest.raises(OSError) as refused:
            plain.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
    # as Go's net.Listen (etcd, kube-apiserver) and asyncio's servers (the proxy) do
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()
