"""What a stopped server must leave behind: nothing. Process groups, listening
ports and a deadline-bounded wait for a condition (never a bare sleep)."""

from __future__ import annotations

import socket
import time
from typing import Callable, TypeVar

from tritonstack.serve.process_tree import group_processes

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "condition"
) -> T:
    """Poll until `condition()` is truthy; return its value, or fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout_s:.0f} s (last value: {value!r})")
        time.sleep(interval_s)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on the port (SO_REUSEADDR: connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def assert_nothing_left(pgid: int, ports: tuple[int, ...], timeout_s: float = 15.0) -> None:
    wait_for(lambda: not group_processes(pgid), timeout_s, what=f"process group {pgid} gone")
    wait_for(lambda: all(port_is_free(port) for port in ports), timeout_s, what=f"ports {ports} free")
