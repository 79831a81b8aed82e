"""The server a load test, the benchmark or the soak drives: one given by its
endpoints (another host, the NGC container), or one started here and stopped at
the end. The one way to say "use this server, or start one".

    with target_server(repository, http_url=None) as server:
        print(server.http_url, server.grpc_url, server.metrics_url, server.pid)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from tritonstack.contract import admin_headers
from tritonstack.serve.launcher import TritonServer


@dataclass(frozen=True)
class GivenServer:
    """A server this process did not start: its endpoints, and its process id when
    it runs on this host (for CPU and memory figures)."""

    http_url: str
    grpc_url: str
    metrics_url: str | None = None
    pid: int | None = None

    def admin_headers(self, protocol: str) -> dict[str, str]:
        return admin_headers(protocol)  # the key from $TRITONSTACK_ADMIN_KEY, if any


@contextlib.contextmanager
def target_server(repository: Path | str, http_url: str | None = None, grpc_url: str | None = None,
                  metrics_url: str | None = None, pid: int | None = None) -> Iterator[GivenServer | TritonServer]:
    """The given server when `http_url` is set, else a TritonServer on `repository`
    (free loopback ports), stopped when the block ends whatever happens."""
    if http_url:
        yield GivenServer(http_url, grpc_url or http_url, metrics_url, pid)
        return
    with TritonServer(repository) as server:
        yield server


def server_processes(server: GivenServer | TritonServer) -> list[psutil.Process]:
    """tritonserver and its backend stubs; none when the process is unknown."""
    if server.pid is None:
        return []
    root = psutil.Process(server.pid)
    return [root, *root.children(recursive=True)]
