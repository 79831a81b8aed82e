"""Run tritonserver on a model repository in the foreground until Ctrl-C
(`make serve`):

    python -m tritonstack.serve --model-repository model_repository --http-port 8000
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time

from tritonstack.contract import ADMIN_HEADER, ADMIN_KEY_ENV, DEFAULT_MAX_INPUT_BYTES
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.limits import MemoryLimits
from tritonstack.serve.network import LOOPBACK
from tritonstack.serve.security import RESTRICTED_APIS

LOGGER = logging.getLogger("tritonstack.serve")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _restarting(server: TritonServer) -> bool:
    return server.restarter is not None and server.restarter.is_alive()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run tritonserver on a model repository until Ctrl-C.")
    parser.add_argument("--model-repository", default="model_repository")
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: loopback only)")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--open-apis", action="store_true",
                        help="do not restrict model control, shared memory, statistics, trace, logging "
                             f"(default: they need the header {ADMIN_HEADER}: ${ADMIN_KEY_ENV})")
    parser.add_argument("--max-input-bytes", type=int, default=DEFAULT_MAX_INPUT_BYTES,
                        help="largest request accepted, in bytes")
    defaults = MemoryLimits.default()
    parser.add_argument("--server-memory-bytes", type=int, default=defaults.server_bytes,
                        help="tritonserver's address-space ceiling (default: half the machine's memory, >= 8 GiB)")
    parser.add_argument("--stub-memory-bytes", type=int, default=defaults.stub_bytes,
                        help="each backend stub's ceiling, and its decode budgets' share "
                             "(default: a quarter of the machine's memory, >= 4 GiB)")
    parser.add_argument("--no-memory-limits", action="store_true", help="no memory ceilings")
    parser.add_argument("extra", nargs="*", help="more tritonserver flags, after --")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    server = TritonServer(
        args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=tuple(args.extra),
        restricted_apis=() if args.open_apis else RESTRICTED_APIS,
        max_input_bytes=args.max_input_bytes,
        memory_limits=MemoryLimits(args.server_memory_bytes, args.stub_memory_bytes),
        limit_memory=not args.no_memory_limits,
    )
    if not args.open_apis and ADMIN_KEY_ENV not in os.environ:
        LOGGER.info("admin APIs need header %s; set $%s to choose its value", ADMIN_HEADER, ADMIN_KEY_ENV)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.start()
        with open(server.log_path, errors="replace") as log:
            print(log.read(), end="", flush=True)
            LOGGER.info("ready: HTTP %s, gRPC %s, metrics %s (Ctrl-C to stop)",
                        server.http_url, server.grpc_url, server.metrics_url)
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
    raise SystemExit(main())
