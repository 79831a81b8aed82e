"""`tritonstack benchmark`: the command line of tritonstack.benchmark.serving_ratios (see its docstring);
with --regions N, of tritonstack.benchmark.region_speedup alone; with --audio, of
tritonstack.benchmark.audio_cost alone."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import serving_ratios as benchmark_run
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import admin_headers
from tritonstack.measure.load_settings import FULL, QUICK, SMOKE
from tritonstack.measure.measured_models import DALI_ENSEMBLE
from tritonstack.measure.results import write_results
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
    made = cli.parser(benchmark_run.__doc__)
    cli.add_options(made, BenchmarkOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(BenchmarkOptions, args)
    settings = SMOKE if options.smoke else QUICK if options.quick else FULL
    reason = unservable_reason(options.model_repository)
    if reason:
        raise cli.UsageError(reason)
    # A given server is used as it is (once it answers); else run() starts one after the in-process reference.
    http_url, grpc_url, metrics_url = given_endpoints(options.url, options.grpc_url, options.metrics_url)
    server = GivenServer(http_url, grpc_url or http_url, metrics_url, options.server_pid) if http_url else None
    if server:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            check_model(url, protocol, DALI_ENSEMBLE, admin_headers(protocol), RetryPolicy(retries=1))
    started = time.monotonic()
    log = lambda text: print(text, flush=True)  # noqa: E731
    if options.audio:
        results = _on_server(_audio_run, settings, options.model_repository.resolve(), server, log)
        results["benchmark_seconds"] = time.monotonic() - started
        _write(results, options.out)
        print(
            f"{options.out}: served {results['served_audio_s_per_s']:.1f} audio s/s, in-process "
            f"{results['inprocess_audio_s_per_s']:.1f}; CPU per audio second served / in-process "
            f"x{results['cost_ratio']:.2f} (rounds {results['cost_ratio_spread']})"
        )
        return 0 if results["errors"] == 0 else 1
    if options.regions:
        results = _regions(options.regions, settings, options.model_repository.resolve(), server, log)
        results["benchmark_seconds"] = time.monotonic() - started
        _write(results, options.out)
        print(
            f"{options.out}: {results['regions_crops_per_s']:.1f} crops/s in regions requests of "
            f"{options.regions} boxes, "
            f"{results['per_crop_crops_per_s']:.1f} crops/s one per request: x{results['regions_speedup']:.2f} "
            f"(rounds {results['regions_speedup_spread']})"
        )
        return 0 if results["errors"] == 0 else 1
    loadgen_dir = options.out.parent / f"{options.out.stem}_loadgen"  # LoadGen's own logs, kept beside the report
    results = benchmark_run.run(settings, options.model_repository.resolve(), log, server, loadgen_dir)
    results["benchmark_seconds"] = time.monotonic() - started
    print(write_results(results, options.out))
    return 0 if results["errors"] == 0 else 1


def _regions(boxes: int, settings, repository: Path, server, log) -> dict:
    from tritonstack.benchmark.region_speedup import run_regions

    return _on_server(
        lambda on, settings, log: run_regions(on, boxes, settings, log), settings, repository, server, log
    )


def _audio_run(server, settings, log) -> dict:
    from tritonstack.benchmark.audio_cost import run_audio

    return run_audio(server, settings, log)


def _on_server(measure, settings, repository: Path, server, log) -> dict:
    """measure(server, settings, log) on the given server, or on one started for it."""
    from tritonstack.serve.launcher import TritonServer

    if server is not None:
        return measure(server, settings, log)
    with TritonServer(repository) as started:
        return measure(started, settings, log)


def _write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
