"""Run tritonserver on a model repository in the foreground until Ctrl-C
(`make serve`):

    tritonstack serve --model-repository model_repository --http-port 8000
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from tritonstack import cli
from tritonstack.backends.settings import DEFAULT_MAX_INPUT_BYTES
from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV
from tritonstack.serve.launcher import ServerStartError, TritonServer, UnservableRepository
from tritonstack.serve.limits import MemoryLimits
from tritonstack.serve.loaded import loaded_configs
from tritonstack.serve.network import LOOPBACK, port_in_use
from tritonstack.serve.response_cache import cached
from tritonstack.serve.security import RESTRICTED_APIS
from tritonstack.serve.server_config import DEFAULT_TRACE_RATE, ServerConfig
from tritonstack.serve.stub_environment import STUB_ENVIRONMENT
from tritonstack.serve.supervision import RecyclePolicy, Supervision

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
                f"another with {option} (make serve HTTP_PORT=9000 GRPC_PORT=9001 METRICS_PORT=9002)"
            )


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=tuple(args.extra),
        restricted_apis=() if args.open_apis else RESTRICTED_APIS,
        max_input_bytes=args.max_input_bytes,
        summary_latencies=not args.no_summary_latencies,
        response_cache_bytes=args.response_cache_mb * 2**20,
        latency_objective_ms=args.latency_objective_ms,
        trace_otlp_url=args.trace_otlp,
        trace_rate=args.trace_rate,
        stop_grace_s=args.stop_grace_s,
    )


def supervision(args: argparse.Namespace) -> Supervision:
    return Supervision(
        memory_limits=None if args.no_memory_limits else MemoryLimits(args.server_memory_bytes, args.stub_memory_bytes),
        recycle=RecyclePolicy(above_mib=args.recycle_above_mib) if args.recycle_above_mib > 0 else None,
        front_nice=args.front_nice,
        warmup_s=args.warmup_s,
    )


def _warn_unless_cached(server: TritonServer) -> None:
    """The launcher turns the ensembles' cache on where it controls the models; where
    the caller chose the model control mode, only configs that enable it use it."""
    configs = loaded_configs(server.http_url, server.admin_headers("http"))
    if not any(cached(config) for config in configs):
        LOGGER.warning(
            "--response-cache-mb: no loaded model enables response_cache (build with `tritonstack build "
            "--response-cache`): the cache stays empty"
        )


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(serve, argv)


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(
        "Run tritonserver on a model repository until Ctrl-C. Exit codes: 0 stopped by Ctrl-C "
        "or SIGTERM, 1 tritonserver exited by itself, 2 it could not start."
    )
    # A string, not a Path: Path would fold the "//" of s3://host:port/bucket/path.
    parser.add_argument(
        "--model-repository",
        default="model_repository",
        help="a local folder, or s3://[host:port/]bucket/path fetched by Triton",
    )
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: loopback only)")
    parser.add_argument("--http-port", type=cli.positive_int, default=8000)
    parser.add_argument("--grpc-port", type=cli.positive_int, default=8001)
    parser.add_argument("--metrics-port", type=cli.positive_int, default=8002)
    parser.add_argument(
        "--open-apis",
        action="store_true",
        help="do not restrict model control, shared memory, statistics, trace, logging "
        f"(default: they need the header {ADMIN_HEADER}: ${ADMIN_KEY_ENV})",
    )
    parser.add_argument(
        "--max-input-bytes",
        type=cli.positive_int,
        default=DEFAULT_MAX_INPUT_BYTES,
        help="largest request accepted, in bytes",
    )
    defaults = MemoryLimits.default()
    parser.add_argument(
        "--server-memory-bytes",
        type=int,
        default=defaults.server_bytes,
        help="tritonserver's address-space ceiling (default: half the machine's memory, >= 8 GiB)",
    )
    parser.add_argument(
        "--stub-memory-bytes",
        type=int,
        default=defaults.stub_bytes,
        help="each backend stub's ceiling, and its decode budgets' share "
        "(default: a quarter of the machine's memory, >= 4 GiB)",
    )
    parser.add_argument("--no-memory-limits", action="store_true", help="no memory ceilings")
    parser.add_argument(
        "--compact-memory",
        action="store_true",
        help="glibc settings that keep the DALI stub's heap flatter, for about 20%% of throughput (docs/memory.md)",
    )
    parser.add_argument(
        "--recycle-above-mib",
        type=float,
        default=RecyclePolicy.above_mib,
        help="reload a model whose stub idles this many MiB above its settled size, after a "
        "burst of huge images (default: %(default)s; 0: never; docs/memory.md)",
    )
    parser.add_argument(
        "--front-nice",
        type=int,
        choices=range(0, 20),
        default=Supervision.front_nice,
        metavar="0-19",
        help="CPU priority (nice value) of the stubs of ensembles' first steps: under overload the backlog "
        "then waits before them, where it is refused (0: as any other stub; docs/reliability.md#overload)",
    )
    parser.add_argument(
        "--response-cache-mb",
        type=cli.non_negative_int,
        default=0,
        metavar="N",
        help="Triton's local response cache of N MiB, for the models built with `tritonstack build "
        "--response-cache` (default: 0, none; docs/operations.md#response-cache)",
    )
    parser.add_argument(
        "--latency-objective-ms",
        type=cli.non_negative_int,
        metavar="MS",
        help="answer within MS or refuse: every ensemble step's queue ceiling from this objective, applied at load "
        "without writing the repository (default: the repository's own, `tritonstack build --latency-objective-ms`; "
        "0: no ceiling; docs/reliability.md#latency-objective)",
    )
    parser.add_argument(
        "--trace-otlp",
        metavar="URL",
        help="export Triton's OpenTelemetry traces (the request, its ensemble, each step) over OTLP/HTTP to a "
        "collector, e.g. http://127.0.0.1:4318/v1/traces (docs/operations.md#traces)",
    )
    parser.add_argument(
        "--trace-rate",
        type=cli.positive_int,
        default=DEFAULT_TRACE_RATE,
        metavar="N",
        help="trace one request in N (default: %(default)s, Triton's)",
    )
    parser.add_argument(
        "--no-summary-latencies",
        action="store_true",
        help="leave out Triton's latency quantiles (p50, p90, p99 per model) from /metrics",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=Supervision.warmup_s,
        help="before it is called ready, each loaded ensemble answers a real sample within this many "
        "seconds (default: %(default)s; 0: no warmup; docs/operations.md)",
    )
    parser.add_argument(
        "--stop-grace-s",
        type=cli.non_negative_int,
        default=int(ServerConfig.stop_grace_s),
        metavar="S",
        help="after Ctrl-C or SIGTERM, how long requests in flight and open HTTP connections get before "
        "tritonserver exits (--exit-timeout-secs; Triton waits for a client's idle keep-alive connection "
        "too; default: %(default)s)",
    )
    parser.add_argument("extra", nargs="*", help="more tritonserver flags, after --")
    return parser


def serve(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = server_config(args)
    except ValueError as error:  # a setting the config refuses (e.g. --trace-otlp without http://)
        raise cli.UsageError(str(error)) from error
    check_free_ports(
        args.host, {"--http-port": args.http_port, "--grpc-port": args.grpc_port, "--metrics-port": args.metrics_port}
    )
    server = TritonServer(config, supervision(args), environment=STUB_ENVIRONMENT if args.compact_memory else None)
    try:
        server.check_repository()  # before anything else is said: one line, exit 2
    except UnservableRepository as error:
        raise cli.UsageError(str(error)) from error
    if not args.open_apis and ADMIN_KEY_ENV not in os.environ:
        LOGGER.info("admin APIs need header %s; set $%s to choose its value", ADMIN_HEADER, ADMIN_KEY_ENV)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            server.start()
        except ServerStartError as error:
            raise cli.UsageError(str(error)) from error
        if args.response_cache_mb:
            _warn_unless_cached(server)
        with open(server.log_path, errors="replace") as log:
            print(log.read(), end="", flush=True)
            LOGGER.info(
                "ready: HTTP %s, gRPC %s, metrics %s (Ctrl-C to stop)",
                server.http_url,
                server.grpc_url,
                server.metrics_url,
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


if __name__ == "__main__":
    sys.exit(main())
