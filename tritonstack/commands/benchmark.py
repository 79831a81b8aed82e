"""`tritonstack benchmark`: the command line of the benchmark's scenarios
(tritonstack.benchmark.run lists them; a bare run measures tritonstack.benchmark.serving_ratios,
see its docstring); --regions N and --audio each ask for a scenario of their own."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import run as benchmark_run
from tritonstack.benchmark import serving_ratios
from tritonstack.benchmark.scenario import Asked
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import admin_headers
from tritonstack.measure.load_settings import FULL, QUICK, SMOKE
from tritonstack.measure.measured_models import DALI_ENSEMBLE
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.target import GivenServer, given_endpoints


@dataclasses.dataclass(frozen=True)
class BenchmarkOptions(cli.ServerEndpoints, cli.RepositoryOption):
    """The repository is what the server serves; its model.dali and model.onnx the
    in-process reference."""

    quick: bool = cli.option(False, "--quick", help="short phases: about 10 minutes on 2 cores, LoadGen included")
    smoke: bool = cli.option(False, "--smoke", help="shortest phases (tests): every key, rough figures")
    out: Path = cli.out_option(cli.REQUIRED, help="JSON file to write")
    regions: int | None = cli.option(
        None,
        "--regions",
        type=cli.positive_int,
        metavar="N",
        help="only the regions benchmark: an image and N boxes per request against each crop sent alone "
        "(crops/s of each and the speed-up, tritonstack.benchmark.region_speedup)",
    )
    audio: bool = cli.option(
        False,
        "--audio",
        help="only the audio benchmark: the speech-segments preset served against silero-vad in-process on the "
        "same clip (audio seconds per second and per CPU second, tritonstack.benchmark.audio_cost)",
    )
    server_pid: int | None = cli.option(
        None,
        "--server-pid",
        type=int,
        group=cli.RUNNING_SERVER,
        help="tritonserver's process id on this host, for CPU and memory",
    )


def parser() -> argparse.ArgumentParser:
    made = cli.parser(serving_ratios.__doc__)  # the bare run's docstring: it lists every key
    cli.add_options(made, BenchmarkOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(BenchmarkOptions, args)
    settings = SMOKE if options.smoke else QUICK if options.quick else FULL
    reason = unservable_reason(options.model_repository)
    if reason:
        raise cli.UsageError(reason)
    # A given server is used as it is (once it answers); else the scenario starts one.
    http_url, grpc_url, metrics_url = given_endpoints(options.url, options.grpc_url, options.metrics_url)
    server = GivenServer(http_url, grpc_url or http_url, metrics_url, options.server_pid) if http_url else None
    if server:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            check_model(url, protocol, DALI_ENSEMBLE, admin_headers(protocol), RetryPolicy(retries=1))
    asked = Asked(settings, options.model_repository.resolve(), options.out, options.regions, options.audio)
    scenario = benchmark_run.chosen(asked)
    started = time.monotonic()
    results = scenario.run(asked, server, lambda text: print(text, flush=True))
    results["benchmark_seconds"] = time.monotonic() - started
    print(scenario.write(results, asked))
    return 0 if results["errors"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
