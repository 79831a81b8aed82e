"""`tritonstack overload`: the command line of tritonstack.benchmark.overload, and with
--soak of tritonstack.benchmark.overload_soak (see their docstrings)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import overload, overload_soak
from tritonstack.benchmark.phases import weighted_images
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import DEFAULT_MODEL, admin_headers
from tritonstack.serve.target import given_endpoints, target_server


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(lambda argv: run(parser().parse_args(argv)), argv)


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(overload.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"), help="served if no --url")
    parser.add_argument("--seconds", type=cli.positive_float, default=30.0, help="per open loop")
    parser.add_argument("--deadline-ms", type=cli.positive_float, default=overload.DEADLINE_S * 1000)
    parser.add_argument("--multiples", type=cli.positive_float, nargs="+", default=list(overload.MULTIPLES))
    parser.add_argument("--protocols", nargs="+", choices=overload.PROTOCOLS, default=list(overload.PROTOCOLS))
    parser.add_argument("--capacity-seconds", type=cli.positive_float, default=10.0)
    parser.add_argument(
        "--clients",
        choices=overload.CLIENTS,
        default="ours",
        help="ours: the deadline is also sent as Triton's `timeout`; stock: Triton's own asyncio clients with only a "
        "client-side timeout (gRPC client_timeout, HTTP session timeout), as most callers are (default: %(default)s)",
    )
    parser.add_argument(
        "--within-capacity",
        action="store_true",
        help=f"one open loop at {overload.WITHIN_CAPACITY:g}x the capacity instead of --multiples: "
        "what a busy hour refuses or answers late",
    )
    soak = parser.add_argument_group("--soak: load swinging below and beyond capacity, every answer checked")
    soak.add_argument("--soak", action="store_true", help="run the overload soak instead (exit 1 unless it passes)")
    soak.add_argument("--soak-seconds", type=cli.positive_float, default=overload_soak.SoakSettings.seconds)
    soak.add_argument("--period-seconds", type=cli.positive_float, default=overload_soak.SoakSettings.period_s)
    running = parser.add_argument_group("a running server instead of starting one")
    running.add_argument("--url", help="HTTP host:port (or http://host:port)")
    running.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port)")
    return parser


def run(args: argparse.Namespace) -> int:
    http_url, grpc_url, _ = given_endpoints(args.url, args.grpc_url, None)
    with target_server(args.model_repository, http_url, grpc_url, None) as server:
        target = overload.Target(server.http_url, server.grpc_url, server.admin_headers("http"), server.pid)
        for protocol in overload.PROTOCOLS if args.soak else args.protocols:
            check_model(target.url(protocol), protocol, args.model, admin_headers(protocol), RetryPolicy(retries=1))
        if args.soak:
            results = soak(args, target, server.pid)
        else:
            results = overload.run_overload(target, args.model, weighted_images(400), settings(args), log=cli_log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"report: {args.out}")
    if args.soak:
        return 0 if results["passed"] else 1
    return 0 if all(phase["failed"] == 0 for phase in results["phases"]) else 1


def settings(args) -> overload.OverloadSettings:
    return overload.OverloadSettings(
        seconds=args.seconds,
        deadline_s=args.deadline_ms / 1000,
        multiples=(overload.WITHIN_CAPACITY,) if args.within_capacity else tuple(args.multiples),
        protocols=tuple(args.protocols),
        capacity_s=args.capacity_seconds,
        clients=args.clients,
    )


def soak(args, target: overload.Target, server_pid: int | None) -> dict:
    settings = overload_soak.SoakSettings(
        seconds=args.soak_seconds,
        period_s=args.period_seconds,
        deadline_s=args.deadline_ms / 1000,
        capacity_s=args.capacity_seconds,
    )
    report = overload_soak.run_overload_soak(
        target, server_pid, args.model, weighted_images(400), settings, log=cli_log
    )
    print(overload_soak.summary(report))
    return report


def cli_log(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
