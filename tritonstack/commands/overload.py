"""`tritonstack overload`: the command line of tritonstack.benchmark.goodput, and with
--soak of tritonstack.benchmark.overload_soak (see their docstrings)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import goodput, overload_soak
from tritonstack.benchmark.phases import weighted_images
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import DEFAULT_MODEL, admin_headers
from tritonstack.serve.target import given_endpoints, target_server


def parser() -> argparse.ArgumentParser:
    made = cli.parser(goodput.__doc__)
    made.add_argument("--out", type=Path, required=True, help="JSON file to write")
    made.add_argument("--model", default=DEFAULT_MODEL)
    made.add_argument("--model-repository", type=Path, default=Path("model_repository"), help="served if no --url")
    cli.add_options(made, goodput.OverloadSettings)
    made.add_argument(
        "--within-capacity",
        action="store_true",
        help=f"one open loop at {goodput.WITHIN_CAPACITY:g}x the capacity instead of --multiples: "
        "what a busy hour refuses or answers late",
    )
    soak = made.add_argument_group("--soak: load swinging below and beyond capacity, every answer checked")
    soak.add_argument("--soak", action="store_true", help="run the overload soak instead (exit 1 unless it passes)")
    soak.add_argument("--soak-seconds", type=cli.positive_float, default=overload_soak.SoakSettings.seconds)
    soak.add_argument("--period-seconds", type=cli.positive_float, default=overload_soak.SoakSettings.period_s)
    running = made.add_argument_group("a running server instead of starting one")
    running.add_argument("--url", help="HTTP host:port (or http://host:port)")
    running.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port)")
    return made


def run(args: argparse.Namespace) -> int:
    settings = cli.from_args(goodput.OverloadSettings, args)
    if args.within_capacity:
        settings = dataclasses.replace(settings, multiples=(goodput.WITHIN_CAPACITY,))
    http_url, grpc_url, _ = given_endpoints(args.url, args.grpc_url, None)
    with target_server(args.model_repository, http_url, grpc_url, None) as server:
        target = goodput.Target(server.http_url, server.grpc_url, server.admin_headers("http"), server.pid)
        for protocol in goodput.PROTOCOLS if args.soak else settings.protocols:
            check_model(target.url(protocol), protocol, args.model, admin_headers(protocol), RetryPolicy(retries=1))
        if args.soak:
            results = soak(args, settings, target, server.pid)
        else:
            results = goodput.run_overload(target, args.model, weighted_images(400), settings, log=cli_log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"report: {args.out}")
    if args.soak:
        return 0 if results["passed"] else 1
    return 0 if all(phase["failed"] == 0 for phase in results["phases"]) else 1


def soak(args, settings: goodput.OverloadSettings, target: goodput.Target, server_pid: int | None) -> dict:
    soak_settings = overload_soak.SoakSettings(
        seconds=args.soak_seconds,
        period_s=args.period_seconds,
        deadline_s=settings.deadline_s,
        capacity_s=settings.capacity_s,
    )
    report = overload_soak.run_overload_soak(
        target, server_pid, args.model, weighted_images(400), soak_settings, log=cli_log
    )
    print(overload_soak.summary(report))
    return report


def cli_log(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
