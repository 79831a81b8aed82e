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

from tritonstack import cli
from tritonstack.address import parse_address, parse_metrics_url
from tritonstack.contract import admin_headers
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import as_served


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


def given_endpoints(
    url: str | None, grpc_url: str | None, metrics_url: str | None
) -> tuple[str | None, str | None, str | None]:
    """--url, --grpc-url and --metrics-url as typed (host:port, or with http:// /
    grpc://) -> (HTTP host:port, gRPC host:port, metrics URL); UsageError for an
    address of the other protocol."""
    found = []
    for option, text, expected in (("--url", url, "http"), ("--grpc-url", grpc_url, "grpc")):
        address = parse_address(text) if text else None
        if address and address.scheme not in (None, expected):
            raise cli.UsageError(
                f"{option} {text} names a {address.scheme} endpoint: {option} takes {expected}://host:port or host:port"
            )
        found.append(address.hostport if address else None)
    return found[0], found[1], parse_metrics_url(metrics_url) if metrics_url else None


@contextlib.contextmanager
def target_server(
    repository: Path | str,
    http_url: str | None = None,
    grpc_url: str | None = None,
    metrics_url: str | None = None,
    pid: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[GivenServer | TritonServer]:
    """The given server when `http_url` is set, else a TritonServer on `repository` as
    `tritonstack serve` starts it (server_config.as_served: free loopback ports,
    `extra_args` added), stopped when the block ends whatever happens."""
    if http_url:
        yield GivenServer(http_url, grpc_url or http_url, metrics_url, pid)
        return
    with TritonServer(as_served(repository, extra_args=extra_args)) as server:
        yield server
