"""`tritonstack loadtest`: the command line of tritonstack.loadtests.headless (see its docstring)."""

from __future__ import annotations

import argparse
import dataclasses
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
    preflight,
    protocols,
    run_locust,
)
from tritonstack.loadtests.load_options import LoadOptions
from tritonstack.loadtests.report import PlotLabels, RunSummary, write_report
from tritonstack.serve.target import given_endpoints, target_server


@dataclasses.dataclass(frozen=True)
class LoadtestOptions(cli.ServerEndpoints, cli.RepositoryOption):
    """The repository is served when no --url is given; the metrics endpoint gives the
    server-side breakdown. `load` is what every Locust process parses too."""

    load: LoadOptions = cli.nested(LoadOptions, default_factory=LoadOptions)
    user: str = cli.option("grpc", "--user", choices=sorted(USER_CLASSES), help="protocol of the users")
    shape: str = cli.option(
        "step",
        "--shape",
        choices=sorted(SHAPE_FILES),
        help="closed: --users at once; step: a ramp of --steps; open: --target-rps fixed",
    )
    users: int = cli.option(4, "--users", type=cli.positive_int, help="closed shape: users")
    # None: DEFAULT_RUN_TIME_S, or the step shape's steps (headless.fit_run_time).
    run_time: float | None = cli.option(
        None,
        "--run-time",
        type=float,
        metavar="S",
        help=f"seconds, every shape (default: {DEFAULT_RUN_TIME_S:.0f}; step shape: --steps x --step-seconds)",
    )
    workers: int = cli.option(0, "--workers", type=int, help="distributed: Locust worker processes (0: one process)")
    skip_preflight: bool = cli.option(
        False,
        "--skip-preflight",
        help="start the users even when the model does not classify encoded images (to load-test the error path)",
    )
    out: Path | None = cli.out_option(help="report folder (default: reports/loadtest-<time>)")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(loadtest_run.__doc__)
    cli.add_options(made, LoadtestOptions)
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
    args = checked(args)  # the Locust side (tritonstack.loadtests.headless) reads the fitted arguments
    options = cli.from_args(LoadtestOptions, args)
    http_url, grpc_url, metrics_url = given_endpoints(options.url, options.grpc_url, options.metrics_url)
    with target_server(options.model_repository, http_url, grpc_url, metrics_url) as target:
        preflight(args, target.http_url, target.grpc_url)
        out = options.out or Path("reports") / time.strftime("loadtest-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        prefix = out / "locust"
        metrics_url = target.metrics_url
        before = metrics.scrape(metrics_url) if metrics_url else None
        started = time.time()
        exit_code, generator_cpu = run_locust(args, target.http_url, target.grpc_url, prefix)
        server = metrics.breakdown(before, metrics.scrape(metrics_url)) if metrics_url else []
        used = {
            protocol: target.grpc_url if protocol == "grpc" else target.http_url for protocol in protocols(options.user)
        }
    model = options.load.model
    labels = PlotLabels(
        title=f"{model} over {' + '.join(PROTOCOL_NAMES[p] for p in used)}, {options.shape} shape, "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}",
        target_rps=options.load.target_rps if options.shape == "open" else None,
    )
    settings = report_settings(options, used, started, exit_code)
    summary = write_report(prefix, RunSummary(f"Load test of {model}", settings, generator_cpu, server), labels)
    print(summary.read_text())
    print(f"report: {out}")
    return exit_code


def report_settings(options: LoadtestOptions, used: dict[str, str], started: float, exit_code: int) -> dict[str, str]:
    """The run's settings as the report lists them."""
    load = options.load
    return {
        "model": load.model,
        "protocol": ", ".join(f"{PROTOCOL_NAMES[p]} at {url}" for p, url in used.items()),
        "shape": options.shape,
        "workers": str(options.workers or "none (one process)"),
        "bounds": f"{options.run_time:g} s, at most {load.max_requests} requests",
        "load": (
            f"{load.target_rps:g} requests/s open loop over {load.open_loop_users} users"
            if options.shape == "open"
            else f"{load.step_users} users per {load.step_seconds:g} s step, {load.steps} steps"
            if options.shape == "step"
            else f"{options.users} users closed loop"
        ),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "Locust exit code": str(exit_code),
    }


if __name__ == "__main__":
    sys.exit(main())
