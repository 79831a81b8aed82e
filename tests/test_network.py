"""The ports the launcher chooses: free, never twice, out of the kernel's way."""

from __future__ import annotations

import socket

from tritonstack.serve.network import EPHEMERAL_RANGE_FILE, LOOPBACK, LOWEST_CHOSEN_PORT, free_port


def test_free_ports_are_distinct_bindable_and_below_the_range_of_outgoing_connections():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind((LOOPBACK, port))
    lowest_ephemeral = int(EPHEMERAL_RANGE_FILE.read_text().split()[0]) if EPHEMERAL_RANGE_FILE.exists() else 0
    if lowest_ephemeral - LOWEST_CHOSEN_PORT >= 1000:
        # A client's connection never takes one as its local port before tritonserver binds it.
        assert all(LOWEST_CHOSEN_PORT <= port < lowest_ephemeral for port in ports)
    else:  # no room below the range: the OS picks, still never the same twice
        assert all(port > 0 for port in ports)


def test_a_port_taken_since_it_was_handed_out_is_not_handed_out_again():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOOPBACK, port))
        listener.listen()
        assert port not in {free_port() for _ in range(100)}
