"""The test servers' ports (tests.transports.servers.free_port): outside
the kernel's ephemeral range, in this worker's stripe, never twice."""

from __future__ import annotations

import socket

from .servers import PORT_STRIPE, PORTS_BELOW, free_port


def _ephemeral() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        low, high = map(int, ranges.read().split())
    return low, high


def test_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    low, _high = _ephemeral()
    assert all(port < min(low, PORTS_BELOW) for port in ports)
    assert max(ports) - min(ports) < PORT_STRIPE  # one stripe: this worker's
    for port in ports[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_passed_over() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        following = [free_port() for _ in range(3)]
    assert port + 1 not in following
