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
from tritonstack.loadtests.headless import LoadtestOptions, fit_run_time, preflight, protocols, run_locust
from tritonstack.loadtests.report import PlotLabels, RunSummary, write_report
from tritonstack.serve.target import given_endpoints, target_server


def parser() -> argparse.ArgumentParser:
    made = cli.parser(loadtest_run.__doc__)
    cli.add_options(made, LoadtestOptions)
    return made


def checked(options: LoadtestOptions) -> LoadtestOptions:
    """The options that go together, the regions model for --boxes (the audio model for
    --audio), the run time fitted."""
    load = options.load
    if load.boxes and load.audio:
        raise cli.OptionError("--boxes and --audio do not go together: boxes are cut from images")
    if load.model == DEFAULT_MODEL and (load.boxes or load.audio):
        model = DEFAULT_AUDIO_MODEL if load.audio else DEFAULT_REGIONS_MODEL
        options = dataclasses.replace(options, load=dataclasses.replace(load, model=model))
    if options.url and not options.grpc_url and options.user != "http":
        raise cli.OptionError("--url names a running server: give its --grpc-url too (gRPC users)")
    if options.grpc_url and not options.url:
        raise cli.OptionError("--grpc-url names a running server: give its HTTP --url too (readiness, HTTP users)")
    try:
        return fit_run_time(options)
    except ValueError as error:
        raise cli.OptionError(str(error)) from error


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


def run(args: argparse.Namespace) -> int:
    options = checked(cli.from_args(LoadtestOptions, args))
    http_url, grpc_url, metrics_url = given_endpoints(options.url, options.grpc_url, options.metrics_url)
    with target_server(options.model_repository, http_url, grpc_url, metrics_url) as target:
        preflight(options, target.http_url, target.grpc_url)
        out = options.out or Path("reports") / time.strftime("loadtest-%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        prefix = out / "locust"
        metrics_url = target.metrics_url
        before = metrics.scrape(metrics_url) if metrics_url else None
        started = time.time()
        exit_code, generator_cpu = run_locust(options, target.http_url, target.grpc_url, prefix)
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
