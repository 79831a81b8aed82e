"""Run tritonserver on a model repository in the foreground until Ctrl-C
(`make serve`):

    tritonstack serve --model-repository model_repository --http-port 8000
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import time

from tritonstack import cli
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV
from tritonstack.serve.launcher import ServerStartError, TritonServer, UnservableRepository
from tritonstack.serve.loaded import loaded_configs
from tritonstack.serve.network import port_in_use
from tritonstack.serve.response_cache import cached
from tritonstack.serve.server_config import ServerConfig
from tritonstack.serve.stub_environment import STUB_ENVIRONMENT
from tritonstack.serve.supervision import Supervision

LOGGER = logging.getLogger("tritonstack.serve")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _restarting(server: TritonServer) -> bool:
    return server.restarter is not None and server.restarter.is_alive()


def check_free_ports(host: str, ports: dict[str, int]) -> None:
    """Refuse at once a port something else listens on (another `make serve`?),
    instead of after tritonserver loaded every model."""
    for option, port in ports.items():
        if port_in_use(host, port):
            raise cli.UsageError(
                f"port {port} on {host} is in use (another server?): stop it, or choose "
                f"another with {option} (make serve HTTP_PORT=9000 GRPC_PORT=9001 METRICS_PORT=9002 HEALTH_PORT=9003)"
            )


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """The server's flags, the launcher's policies, and the stubs' allocator."""

    config: ServerConfig = cli.nested(ServerConfig)
    supervision: Supervision = cli.nested(Supervision, default_factory=Supervision)
    compact_memory: bool = cli.option(
        False,
        "--compact-memory",
        help="glibc settings that keep the DALI stub's heap flatter, for about 20%% of throughput (docs/memory.md)",
    )


def serve_options(args: argparse.Namespace) -> ServeOptions:
    try:
        return cli.from_args(ServeOptions, args)
    except ValueError as error:  # a setting the config refuses (e.g. --trace-otlp without http://)
        raise cli.UsageError(str(error)) from error


def _warn_unless_cached(server: TritonServer) -> None:
    """The launcher turns the ensembles' cache on where it controls the models; where
    the caller chose the model control mode, only configs that enable it use it."""
    configs = loaded_configs(server.http_url, server.admin_headers("http"))
    if not any(cached(config) for config in configs):
        LOGGER.warning(
            "--response-cache-mb: no loaded model enables response_cache (build with `tritonstack build "
            "--response-cache`): the cache stays empty"
        )


def parser() -> argparse.ArgumentParser:
    made = cli.parser(
        "Run tritonserver on a model repository until Ctrl-C. Exit codes: 0 stopped by Ctrl-C "
        "or SIGTERM, 1 tritonserver exited by itself, 2 it could not start."
    )
    cli.add_options(made, ServeOptions)
    return made


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options = serve_options(args)
    config, policies = options.config, options.supervision
    ports = {"--http-port": config.http_port, "--grpc-port": config.grpc_port, "--metrics-port": config.metrics_port}
    check_free_ports(
        config.host, {**ports, **({"--health-port": policies.health_port} if policies.health_port else {})}
    )
    server = TritonServer(config, policies, environment=STUB_ENVIRONMENT if options.compact_memory else None)
    try:
        server.check_repository()  # before anything else is said: one line, exit 2
    except UnservableRepository as error:
        raise cli.UsageError(str(error)) from error
    if config.restricted_apis and ADMIN_KEY_ENV not in os.environ:
        LOGGER.info("admin APIs need header %s; set $%s to choose its value", ADMIN_HEADER, ADMIN_KEY_ENV)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            server.start()
        except ServerStartError as error:
            raise cli.UsageError(str(error)) from error
        if config.response_cache_bytes:
            _warn_unless_cached(server)
        with open(server.log_path, errors="replace") as log:
            print(log.read(), end="", flush=True)
            LOGGER.info(
                "ready: HTTP %s, gRPC %s, metrics %s%s (Ctrl-C to stop)",
                server.http_url,
                server.grpc_url,
                server.metrics_url,
                f", readiness {server.health.url}/ready" if server.health else "",
            )
            while server.process.poll() is None or _restarting(server):
                print(log.read(), end="", flush=True)  # follow the server's log, restarts included
                time.sleep(0.5)
        LOGGER.error("tritonserver exited with code %s:\n%s", server.process.returncode, server.log_tail())
        return 1
    except KeyboardInterrupt:
        LOGGER.info("stopping")
        return 0
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
