"""`free_ports`: ports for servers whose addresses are fixed before they start."""

from __future__ import annotations

import socket

from service.testing.demo_cluster import _ephemeral_range, free_ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, high = _ephemeral_range()
    assert 0 < low <= high
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(10_000 <= p < low for p in ports), (ports, low)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen() -> None:
    low, _ = _ephemeral_range()
    held = []
    try:
        # Hold most of a small window's ports; the rest of the range stays open to free_ports.
        for port in range(10_000, min(10_200, low)):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
            except OSError:
                s.close()
                continue
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(20):
            assert not taken & set(free_ports(10))
    finally:
        for s in held:
            s.close()
