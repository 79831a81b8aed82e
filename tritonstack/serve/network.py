"""Addresses the launcher binds: loopback unless told otherwise, ports chosen free."""

from __future__ import annotations

import ipaddress
import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
# Where the kernel takes the local port of an outgoing connection (Linux).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The lowest port chosen below that range: above the well-known and common service ports.
LOWEST_CHOSEN_PORT = 20000
PROBES = 1000
_RANDOM = random.SystemRandom()  # not the random module's state, which tests and callers may seed

_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now, never the same twice in this process.

    Chosen below the kernel's ephemeral range where it has room: tritonserver binds its
    ports only after loading every model, seconds after they were chosen, and in that
    time any client connection may take a port of that range as its own local port
    (seen: a server of a side-by-side comparison failing on its metrics port, taken
    while the other side was warmed up)."""
    lowest_ephemeral = _lowest_ephemeral_port()
    with _handing_out:
        for _ in range(PROBES):
            port = _probe(host, _candidate(lowest_ephemeral))
            if port and port not in _handed_out:
                _handed_out.add(port)
                return port
    raise OSError(f"no free port on {host} after {PROBES} probes")


def _lowest_ephemeral_port() -> int:
    """The start of the kernel's range for outgoing connections, 0 where unknown."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _candidate(lowest_ephemeral: int) -> int:
    """A random port below the ephemeral range, 0 (the OS picks) where there is no room."""
    if lowest_ephemeral - LOWEST_CHOSEN_PORT < 1000:
        return 0
    return _RANDOM.randrange(LOWEST_CHOSEN_PORT, lowest_ephemeral)


def _probe(host: str, port: int) -> int | None:
    """The port bound (the OS's pick for 0), or None when it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            if port == 0:
                raise
            return None
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
