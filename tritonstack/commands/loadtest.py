"""`tritonstack loadtest`: the command line of tritonstack.loadtests.headless (see its docstring)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tritonstack import cli
from tritonstack.client.retry import PROTOCOL_NAMES
from tritonstack.contract import DEFAULT_AUDIO_MODEL, DEFAULT_MODEL, DEFAULT_REGIONS_MODEL
from tritonstack.loadtests import headless as loadtest_run
from tritonstack.loadtests import metrics
from tritonstack.loadtests.headless import (
    DEFAULT_RUN_TIME_S,
    SHAPE_FILES,
    USER_CLASSES,
    fit_run_time,
    planned_seconds,
    preflight,
    protocols,
    run_locust,
)
from tritonstack.loadtests.load_options import LoadOptions
from tritonstack.loadtests.report import PlotLabels, RunSummary, write_report
from tritonstack.serve.target import given_endpoints, target_server


def parser() -> argparse.ArgumentParser:
    made = cli.parser(loadtest_run.__doc__)
    made.add_argument(
        "--url",
        help="HTTP host:port (or http://host:port) of a running Triton (default: start one on free loopback ports)",
    )
    made.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port) of that Triton")
    made.add_argument(
        "--metrics-url",
        help="its Prometheus endpoint (host:port or http://host:port/metrics), for the server-side breakdown",
    )
    made.add_argument(
        "--model-repository", type=Path, default=Path("model_repository"), help="served when no --url is given"
    )
    cli.add_options(made, LoadOptions)
    made.add_argument("--user", choices=sorted(USER_CLASSES), default="grpc", help="protocol of the users")
    made.add_argument(
        "--shape",
        choices=sorted(SHAPE_FILES),
        default="step",
        help="closed: --users at once; step: a ramp of --steps; open: --target-rps fixed",
    )
    made.add_argument("--users", type=cli.positive_int, default=4, help="closed shape: users")
    made.add_argument(
        "--run-time",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds, every shape (default: {DEFAULT_RUN_TIME_S:.0f}; step shape: --steps x --step-seconds)",
    )
    made.add_argument("--workers", type=int, default=0, help="distributed: Locust worker processes (0: one process)")
    made.add_argument(
        "--skip-preflight",
        action="store_true",
        help="start the users even when the model does not classify encoded images (to load-test the error path)",
    )
    made.add_argument("--out", type=Path, default=None, help="report folder (default: reports/loadtest-<time>)")
    return made


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """The options that go together, the regions model for --boxes (the audio model for
    --audio), the run time fitted."""
    if args.boxes and args.audio:
        raise cli.OptionError("--boxes and --audio do not go together: boxes are cut from images")
    if args.model == DEFAULT_MODEL and (args.boxes or args.audio):
        args.model = DEFAULT_AUDIO_MODEL if args.audio else DEFAULT_REGIONS_MODEL
    if args.url and not args.grpc_url and args.user != "http":
        raise cli.OptionError("--url names a running server: give its --grpc-url too (gRPC users)")
    if args.grpc_url and not args.url:
        raise cli.OptionError("--grpc-url names a running server: give its HTTP --url too (readiness, HTTP users)")
    try:
        fit_run_time(args)
    except ValueError as error:
        raise cli.OptionError(str(error)) from error
    return args


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


def run(args: argparse.Namespace) -> int:
    args = checked(args)
    http_url, grpc_url, metrics_url = given_endpoints(args.url, args.grpc_url, args.metrics_url)
    with target_server(args.model_repository, http_url, grpc_url, metrics_url) as target:
        preflight(args, target.http_url, target.grpc_url)
        out = args.out or Path("reports") / time.strftime("loadtest-%Y%m%d-%H%M%S")
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
