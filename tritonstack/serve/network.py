"""Addresses the launcher binds: loopback unless told otherwise, ports chosen free."""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume it may be reachable from elsewhere
        return False


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on (host, port): tritonserver would fail
    to bind it, after loading every model. The probe binds as tritonserver does, with
    SO_REUSEADDR: the TIME_WAIT connections a stopped server leaves for about a
    minute do not count, a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
