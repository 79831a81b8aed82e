"""`tritonstack benchmark`: the command line of tritonstack.benchmark.run (see its docstring);
with --regions N, of tritonstack.benchmark.region_speedup alone; with --audio, of
tritonstack.benchmark.audio_cost alone."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tritonstack import cli
from tritonstack.benchmark import run as benchmark_run
from tritonstack.benchmark.phase_settings import (
    DALI_ENSEMBLE,
    FULL,
    QUICK,
    SMOKE,
)
from tritonstack.benchmark.results import write_results
from tritonstack.client.preflight import check_model
from tritonstack.client.retry import RetryPolicy
from tritonstack.contract import admin_headers
from tritonstack.rules.unbuilt import unservable_reason
from tritonstack.serve.target import GivenServer, given_endpoints


def parser() -> argparse.ArgumentParser:
    parser = cli.parser(benchmark_run.__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases: at most 4 minutes on 2 cores")
    parser.add_argument("--smoke", action="store_true", help="shortest phases (tests): every key, rough figures")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument(
        "--regions",
        type=cli.positive_int,
        metavar="N",
        help="only the regions benchmark: an image and N boxes per request against each crop sent alone "
        "(crops/s of each and the speed-up, tritonstack.benchmark.region_speedup)",
    )
    parser.add_argument(
        "--audio",
        action="store_true",
        help="only the audio benchmark: the speech-segments preset served against silero-vad in-process on the "
        "same clip (audio seconds per second and per CPU second, tritonstack.benchmark.audio_cost)",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=Path("model_repository"),
        help="what the server serves; model.dali and model.onnx for the in-process reference",
    )
    running = parser.add_argument_group("a running server instead of starting one (e.g. the NGC container)")
    running.add_argument("--url", help="HTTP host:port (or http://host:port)")
    running.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port; default: --url's host:port)")
    running.add_argument("--metrics-url", help="host:port or http://host:port/metrics")
    running.add_argument("--server-pid", type=int, help="tritonserver's process id on this host, for CPU and memory")
    return parser


def run(args: argparse.Namespace) -> int:
    settings = SMOKE if args.smoke else QUICK if args.quick else FULL
    reason = unservable_reason(args.model_repository)
    if reason:
        raise cli.UsageError(reason)
    # A given server is used as it is (once it answers); else run() starts one after the in-process reference.
    http_url, grpc_url, metrics_url = given_endpoints(args.url, args.grpc_url, args.metrics_url)
    server = GivenServer(http_url, grpc_url or http_url, metrics_url, args.server_pid) if http_url else None
    if server:
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            check_model(url, protocol, DALI_ENSEMBLE, admin_headers(protocol), RetryPolicy(retries=1))
    started = time.monotonic()
    log = lambda text: print(text, flush=True)  # noqa: E731
    if args.audio:
        results = _on_server(_audio_run, settings, args.model_repository.resolve(), server, log)
        results["benchmark_seconds"] = time.monotonic() - started
        _write(results, args.out)
        print(
            f"{args.out}: served {results['served_audio_s_per_s']:.1f} audio s/s, in-process "
            f"{results['inprocess_audio_s_per_s']:.1f}; CPU per audio second served / in-process "
            f"x{results['cost_ratio']:.2f} (rounds {results['cost_ratio_spread']})"
        )
        return 0 if results["errors"] == 0 else 1
    if args.regions:
        results = _regions(args.regions, settings, args.model_repository.resolve(), server, log)
        results["benchmark_seconds"] = time.monotonic() - started
        _write(results, args.out)
        print(
            f"{args.out}: {results['regions_crops_per_s']:.1f} crops/s in regions requests of {args.regions} boxes, "
            f"{results['per_crop_crops_per_s']:.1f} crops/s one per request: x{results['regions_speedup']:.2f} "
            f"(rounds {results['regions_speedup_spread']})"
        )
        return 0 if results["errors"] == 0 else 1
    results = benchmark_run.run(settings, args.model_repository.resolve(), log=log, server=server)
    results["benchmark_seconds"] = time.monotonic() - started
    print(write_results(results, args.out))
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
