"""`tritonstack loadtest`: the command line of loadtests.headless (see its docstring)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from loadtests import headless as loadtest_run
from loadtests import metrics
from loadtests.headless import (
    DEFAULT_RUN_TIME_S,
    DEFAULT_STEP_S,
    PROJECT_ROOT,
    SHAPE_FILES,
    USER_CLASSES,
    fit_run_time,
    planned_seconds,
    preflight,
    protocols,
    run_locust,
)
from loadtests.report import PlotLabels, RunSummary, write_report
from tritonstack import cli
from tritonstack.client.retry import PROTOCOL_NAMES
from tritonstack.contract import DEFAULT_MODEL, DEFAULT_REGIONS_MODEL
from tritonstack.serve.target import given_endpoints, target_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = cli.parser(loadtest_run.__doc__)
    parser.add_argument(
        "--url",
        help="HTTP host:port (or http://host:port) of a running Triton (default: start one on free loopback ports)",
    )
    parser.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port) of that Triton")
    parser.add_argument(
        "--metrics-url",
        help="its Prometheus endpoint (host:port or http://host:port/metrics), for the server-side breakdown",
    )
    parser.add_argument(
        "--model-repository", default=str(PROJECT_ROOT / "model_repository"), help="served when no --url is given"
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the image classifier to load")
    parser.add_argument(
        "--boxes",
        type=cli.non_negative_int,
        default=0,
        metavar="N",
        help=f"N random boxes with each image, to a regions model (default then: {DEFAULT_REGIONS_MODEL}); "
        "each answer must have a row per box (0: plain images)",
    )
    parser.add_argument("--user", choices=sorted(USER_CLASSES), default="grpc", help="protocol of the users")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPE_FILES),
        default="step",
        help="closed: --users at once; step: a ramp of --steps; open: --target-rps fixed",
    )
    parser.add_argument(
        "--deadline-ms",
        type=float,
        default=0.0,
        help="each request's deadline, sent to the server; the report then counts answered in time, refused, "
        "no answer in time and answered late apart, with the goodput (0: none)",
    )
    parser.add_argument("--users", type=cli.positive_int, default=4, help="closed shape: users")
    parser.add_argument(
        "--run-time",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds, every shape (default: {DEFAULT_RUN_TIME_S:.0f}; step shape: --steps x --step-seconds)",
    )
    parser.add_argument("--max-requests", type=cli.positive_int, default=20000, help="stop after this many requests")
    parser.add_argument("--step-users", type=cli.positive_int, default=2, help="step shape: users added per step")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=None,
        metavar="S",
        help=f"step shape: duration of a step (default: --run-time / --steps, else {DEFAULT_STEP_S:.0f})",
    )
    parser.add_argument("--steps", type=cli.positive_int, default=4, help="step shape: number of steps")
    parser.add_argument("--target-rps", type=float, default=20.0, help="open shape: requests per second")
    parser.add_argument(
        "--open-loop-users", type=cli.positive_int, default=4, help="open shape: users sharing --target-rps"
    )
    parser.add_argument("--workers", type=int, default=0, help="distributed: Locust worker processes (0: one process)")
    parser.add_argument(
        "--live-seconds", type=float, default=5.0, help="seconds between two lines of live figures on stderr (0: none)"
    )
    parser.add_argument(
        "--skip-preflight",
        action="store_true",
        help="start the users even when the model does not classify encoded images (to load-test the error path)",
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: reports/loadtest-<time>)")
    args = parser.parse_args(argv)
    if args.boxes and args.model == DEFAULT_MODEL:
        args.model = DEFAULT_REGIONS_MODEL
    if args.url and not args.grpc_url and args.user != "http":
        parser.error("--url names a running server: give its --grpc-url too (gRPC users)")
    if args.grpc_url and not args.url:
        parser.error("--grpc-url names a running server: give its HTTP --url too (readiness, HTTP users)")
    try:
        fit_run_time(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(load_test, argv)


def load_test(argv: list[str] | None) -> int:
    args = parse_args(argv)
    http_url, grpc_url, metrics_url = given_endpoints(args.url, args.grpc_url, args.metrics_url)
    with target_server(args.model_repository, http_url, grpc_url, metrics_url) as target:
        preflight(args, target.http_url, target.grpc_url)
        out = args.out or PROJECT_ROOT / "reports" / time.strftime("loadtest-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        prefix = out / "locust"
        metrics_url = target.metrics_url
        before = metrics.scrape(metrics_url) if metrics_url else None
        started = time.time()
        exit_code, generator_cpu = run_locust(args, target.http_url, target.grpc_url, prefix)
        server = metrics.breakdown(before, metrics.scrape(metrics_url)) if metrics_url else []
        used = {
            protocol: target.grpc_url if protocol == "grpc" else target.http_url for protocol in protocols(args.user)
        }
    settings = {
        "model": args.model,
        "protocol": ", ".join(f"{PROTOCOL_NAMES[p]} at {url}" for p, url in used.items()),
        "shape": args.shape,
        "workers": str(args.workers or "none (one process)"),
        "bounds": f"{planned_seconds(args):g} s, at most {args.max_requests} requests",
        "load": (
            f"{args.target_rps:g} requests/s open loop over {args.open_loop_users} users"
            if args.shape == "open"
            else f"{args.step_users} users per {args.step_seconds:g} s step, {args.steps} steps"
            if args.shape == "step"
            else f"{args.users} users closed loop"
        ),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "Locust exit code": str(exit_code),
    }
    labels = PlotLabels(
        title=f"{args.model} over {' + '.join(PROTOCOL_NAMES[p] for p in used)}, {args.shape} shape, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}",
        target_rps=args.target_rps if args.shape == "open" else None,
    )
    summary = write_report(prefix, RunSummary(f"Load test of {args.model}", settings, generator_cpu, server), labels)
    print(summary.read_text())
    print(f"report: {out}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
