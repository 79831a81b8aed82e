"""One benchmark of the serving stack, as ratios measured side by side in one run.

    tritonstack benchmark --quick --out reports/benchmark.json

It starts its own tritonserver on loopback and writes (see README, "Performance"):
inprocess_images_per_s, server_images_per_s, serving_efficiency,
dali_preprocess_images_per_s, pil_preprocess_images_per_s, dali_vs_pil_preprocess,
dali_vs_pil_per_cpu_second, dali_vs_pil_ensemble, ensemble_overhead_ms_p50,
p99_over_p50, http_vs_grpc, server_rss_mb, errors, versions, CPU model and cores;
ensemble_overhead_share, capacity_at_slo, int8_vs_fp32_ensemble, int8_top1_agreement,
int8_top5_overlap (and both `_crops`, on a wider corpus), cpu_ms_per_image of each
library alone and the ceilings it sets on int8_vs_fp32_ensemble and
dali_vs_pil_ensemble (tritonstack.benchmark.cost); on a server it started
itself, ensemble_trace_ms_p50 (where a single request's time goes, from Triton's
trace: tritonstack.benchmark.trace); with the peer extra installed, the same figures
for a FastAPI + Pillow + ONNX Runtime service serving the same classifier files
(peer_images_per_s, vs_peer_throughput, vs_peer_cpu, vs_peer_latency, ...:
tritonstack.benchmark.vs_peer).

Every throughput ratio is the median of `repeats` interleaved rounds (A, B, A, B, ...
in one run, so that drift on a shared machine hits both sides alike), written with
`<key>_spread`: [min, max] over the rounds; the rates are the medians of the same
rounds. One run still cannot tell a 5% regression from noise on a loaded machine:
compare the spreads.

The load comes from asyncio clients (tritonstack.client.aio) in this process: one
event loop keeps many single-image requests in flight at a small CPU cost, which
matters when client and server share two cores. The share of a core the client
used is written too (`client_cpu_share`). Every request is one image drawn from
the load tests' weighted corpus of real photos.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tritonstack import cli
from tritonstack.benchmark import peer
from tritonstack.benchmark.cost import write_cost_ceilings
from tritonstack.benchmark.ideal_queue import ideal_capacity
from tritonstack.benchmark.inprocess import inprocess_best_setting, inprocess_phase
from tritonstack.benchmark.phases import (
    Phase,
    capacity_at_slo,
    current_saturation,
    interleaved,
    measured_phase,
    open_loop,
    ratios,
    saturate,
    server_rss_mb,
    server_rss_mb_by_process,
    typical_image,
    weighted_images,
    write_median,
)
from tritonstack.benchmark.results import cpu_flags, cpu_model, versions
from tritonstack.benchmark.settings import (
    CAPACITY_MAX_FRACTION,
    CLASSIFIER,
    DALI_ENSEMBLE,
    DALI_PREPROCESS,
    DALI_PRESET,
    INT8_ENSEMBLE,
    INT8_PRESET,
    OPEN_LOOP_LOAD,
    PIL_ENSEMBLE,
    PIL_PREPROCESS,
    QUICK,
    SLO_P50_MULTIPLE,
    Settings,
)
from tritonstack.benchmark.single import grpc_round_trip_ms, single_requests, trace_medians, traced_single_requests
from tritonstack.benchmark.trace import trace_args
from tritonstack.benchmark.vs_peer import peer_measures, write_peer_open_loop, write_vs_peer
from tritonstack.build.parity import compare_classifiers, crop_images
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.target import GivenServer, target_server


def run(settings: Settings, repository: Path, log=print, server: TritonServer | GivenServer | None = None) -> dict:
    """All measurements; on `server` if given (it must serve `repository`), else on
    a server started and stopped here."""
    images = weighted_images(400)
    results: dict = {
        "settings": settings.__dict__ | {"quick": settings is QUICK},
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
    }
    log("in-process reference (DALI + ONNX Runtime, no server): the best thread/batch setting...")
    setting = results["inprocess_best_setting"] = inprocess_best_setting(repository, images, settings)
    with tempfile.TemporaryDirectory(prefix="benchmark-") as folder:
        trace_file = Path(folder) / "trace.json"
        client_times = _run_on_server(results, settings, repository, images, setting, log, server, trace_file)
        # The server has stopped: its trace file is complete.
        results["ensemble_trace_ms_p50"] = trace_medians(trace_file, client_times) if client_times else None
    log("INT8 vs FP32 classifier on the parity corpus (in process)...")
    _write_int8_agreement(results, repository)
    write_cost_ceilings(results, repository, images, settings.repeats, log)
    return results


def _run_on_server(
    results: dict,
    settings: Settings,
    repository: Path,
    images: list[bytes],
    setting: dict,
    log,
    server,
    trace_file: Path,
) -> list[tuple[int, int]]:
    """Every measurement through a server; the client's times of the traced
    requests (none on a given server: its trace file, if any, is not ours)."""
    own = server is None
    with (
        contextlib.nullcontext(server)
        if server
        else target_server(repository, extra_args=trace_args(trace_file)) as server,
        peer_beside(repository, log) as peer,
    ):
        results["versions"] = versions(server)
        log("DALI ensemble over gRPC: the concurrency that saturates it...")
        _, concurrency, errors = saturate(server.grpc_url, "grpc", DALI_ENSEMBLE, images, settings)
        results["server_best_concurrency"] = concurrency
        log(f"interleaved rounds at concurrency {concurrency} (preprocessing alone at {max(settings.concurrency)})...")
        measures = _round_measures(server, repository, images, setting, concurrency, settings)
        if peer:
            measures |= peer_measures(server, peer, images, concurrency, settings, "int8_ensemble" in measures)
        rounds = interleaved(measures, settings.repeats, log)
        errors += sum(phase.errors for phases in rounds.values() for phase in phases)
        _write_rounds(results, rounds, settings)
        write_vs_peer(results, rounds)
        results["server_rss_mb"] = server_rss_mb(server)  # right after the rounds: steady state
        results["server_rss_mb_by_process"] = server_rss_mb_by_process(server)
        log("single requests (concurrency 1): latency and where it goes...")
        errors += _write_single_requests(results, server, settings)
        errors += _write_open_loop(results, server, images, settings, log)
        errors += _write_capacity(results, server, images, settings, log)
        if peer:
            errors += write_peer_open_loop(results, server, peer, images, settings, log)
        results["errors"] = errors
        return traced_single_requests(server, settings.traced_requests) if own else []


@contextlib.contextmanager
def peer_beside(repository: Path, log=print):
    """The peer service (tritonstack.benchmark.peer) serving the repository's own
    classifier files, or None where the peer extra is not installed."""
    if not peer.available():
        log("the peer is not measured: install the peer extra (pip install tritonstack[peer])")
        yield None
        return
    presets = [DALI_PRESET] + ([INT8_PRESET] if (repository / INT8_ENSEMBLE).is_dir() else [])
    with peer.peer_server(repository, presets) as running:
        yield running


def _round_measures(
    server, repository: Path, images: list[bytes], setting: dict, concurrency: int, settings: Settings
) -> dict[str, Callable[[], Phase]]:
    """What each interleaved round measures, in order."""
    alone = max(settings.concurrency)  # a preprocessing model alone: many in flight feed its batches
    measures = {
        "inprocess": lambda: inprocess_phase(repository, images, setting, settings),
        "grpc": lambda: measured_phase(server, "grpc", DALI_ENSEMBLE, images, concurrency, settings),
        "http": lambda: measured_phase(server, "http", DALI_ENSEMBLE, images, concurrency, settings),
        "pil_ensemble": lambda: measured_phase(server, "grpc", PIL_ENSEMBLE, images, concurrency, settings),
        "dali_preprocess": lambda: measured_phase(server, "grpc", DALI_PREPROCESS, images, alone, settings),
        "pil_preprocess": lambda: measured_phase(server, "grpc", PIL_PREPROCESS, images, alone, settings),
    }
    if (repository / INT8_ENSEMBLE).is_dir():  # a repository built without the INT8 preset: no INT8 figures
        measures["int8_ensemble"] = lambda: measured_phase(server, "grpc", INT8_ENSEMBLE, images, concurrency, settings)
    return measures


# key -> (numerator, denominator) of the rounds, as images per second or per CPU second.
ROUND_RATIOS = {
    "serving_efficiency": ("grpc", "inprocess"),
    "http_vs_grpc": ("http", "grpc"),
    "dali_vs_pil_ensemble": ("grpc", "pil_ensemble"),
    "dali_vs_pil_preprocess": ("dali_preprocess", "pil_preprocess"),
    "int8_vs_fp32_ensemble": ("int8_ensemble", "grpc"),
}


ROUND_RATES = {
    "inprocess_images_per_s": "inprocess",
    "server_images_per_s": "grpc",
    "http_images_per_s": "http",
    "pil_ensemble_images_per_s": "pil_ensemble",
    "dali_preprocess_images_per_s": "dali_preprocess",
    "pil_preprocess_images_per_s": "pil_preprocess",
    "int8_ensemble_images_per_s": "int8_ensemble",
}


def _write_rounds(results: dict, rounds: dict[str, list[Phase]], settings: Settings) -> None:
    def rates(name: str) -> list[float | None]:
        return [phase.images_per_s for phase in rounds.get(name, [])]

    def per_cpu(name: str) -> list[float | None]:
        return [phase.images_per_cpu_s for phase in rounds.get(name, [])]

    for key, name in ROUND_RATES.items():
        write_median(results, key, [rate for rate in rates(name) if rate])
    for key, (numerator, denominator) in ROUND_RATIOS.items():
        write_median(results, key, ratios(rates(numerator), rates(denominator)))
    write_median(results, "dali_preprocess_images_per_cpu_s", [r for r in per_cpu("dali_preprocess") if r])
    write_median(results, "pil_preprocess_images_per_cpu_s", [r for r in per_cpu("pil_preprocess") if r])
    write_median(results, "dali_vs_pil_per_cpu_second", ratios(per_cpu("dali_preprocess"), per_cpu("pil_preprocess")))
    # The server's images per CPU-second (tritonserver and its stubs; the client
    # excluded) over the two libraries' own in this process: 1.0 = nothing spent
    # beyond DALI and ONNX Runtime.
    write_median(results, "inprocess_images_per_cpu_s", [r for r in per_cpu("inprocess") if r])
    write_median(results, "server_images_per_cpu_s", [r for r in per_cpu("grpc") if r])
    write_median(results, "cpu_efficiency", ratios(per_cpu("grpc"), per_cpu("inprocess")))
    results["client_cpu_share"] = float(
        np.median([phase.client_cpu_s / (settings.seconds + settings.warmup_s) for phase in rounds["grpc"]])
    )


def _write_single_requests(results: dict, server, settings: Settings) -> int:
    """`repeats` phases at concurrency 1; returns their failures."""
    measured = [
        single_requests(
            server, DALI_ENSEMBLE, (DALI_PREPROCESS, CLASSIFIER), typical_image(), settings.seconds, settings.warmup_s
        )
        for _ in range(settings.repeats)
    ]
    write_median(
        results, "ensemble_overhead_ms_p50", [m.overhead_ms_p50 for m in measured if m.overhead_ms_p50 is not None]
    )
    write_median(
        results, "ensemble_overhead_share", [m.overhead_share for m in measured if m.overhead_share is not None]
    )
    write_median(
        results, "latency_ms_p50_concurrency_1", [m.phase.percentile_ms(50) for m in measured if m.phase.latencies_s]
    )
    results["grpc_round_trip_ms_p50"] = grpc_round_trip_ms(server)
    hops = {hop: [value for m in measured for value in m.hops_ms.get(hop, [])] for hop in measured[0].hops_ms}
    results["ensemble_hops_ms_p50"] = {hop: float(np.median(values)) for hop, values in hops.items() if values}
    return sum(m.phase.errors for m in measured)


def _write_open_loop(results: dict, server, images: list[bytes], settings: Settings, log) -> int:
    """p99/p50 at OPEN_LOOP_LOAD of the saturation measured right before, equal
    gaps, `repeats` times; returns failures."""
    log(f"open loop at {OPEN_LOOP_LOAD:.0%} of saturation (measured before each), {settings.repeats} times...")
    phases, errors = [], 0
    for _ in range(settings.repeats):
        saturation = current_saturation(server, images, results["server_best_concurrency"], settings)
        rate = OPEN_LOOP_LOAD * saturation.images_per_s or 1.0
        # One gap more than the minimum: sends at equal gaps within [0, seconds) are
        # floor(seconds x rate), which float rounding took to 999 of 1000.
        seconds = max(settings.open_loop_s, (settings.open_loop_min_requests + 1) / rate)
        phases.append(asyncio.run(open_loop(server.grpc_url, DALI_ENSEMBLE, images, rate, seconds, settings.warmup_s)))
        errors += saturation.errors
    measured = [phase for phase in phases if phase.latencies_s]
    results["open_loop_requests"] = min(len(phase.latencies_s) + phase.errors for phase in phases)
    write_median(results, "open_loop_rate", [phase.offered_rate for phase in phases])
    write_median(results, "open_loop_ms_p50", [phase.percentile_ms(50) for phase in measured])
    write_median(results, "open_loop_ms_p99", [phase.percentile_ms(99) for phase in measured])
    write_median(results, "p99_over_p50", [phase.percentile_ms(99) / phase.percentile_ms(50) for phase in measured])
    return errors + sum(phase.errors for phase in phases)


def _write_capacity(results: dict, server, images: list[bytes], settings: Settings, log) -> int:
    single_p50 = results["latency_ms_p50_concurrency_1"]
    if not results["server_images_per_s"] or not single_p50:
        results["capacity_at_slo"], results["capacity_probes"] = None, []
        results["ideal_queue_capacity"] = results["capacity_vs_ideal_queue"] = None
        return 0
    slo_ms = results["capacity_slo_ms"] = SLO_P50_MULTIPLE * single_p50
    log(f"capacity: the highest Poisson rate whose p99 stays under {slo_ms:.1f} ms...")
    fraction, probes = capacity_at_slo(server, images, results["server_best_concurrency"], slo_ms, settings)
    results["capacity_at_slo"], results["capacity_probes"] = fraction, probes
    # The same SLO, arrivals and probe length on an ideal queue with the measured
    # service rate and single-request latency (tritonstack.benchmark.ideal_queue).
    saturation = float(np.median([probe["saturation"] for probe in probes]))
    ideal = results["ideal_queue_capacity"] = ideal_capacity(
        saturation, single_p50, slo_ms, settings.capacity_s, CAPACITY_MAX_FRACTION
    )
    results["capacity_vs_ideal_queue"] = fraction / ideal if ideal else None
    return sum(probe["errors"] for probe in probes)


def _write_int8_agreement(results: dict, repository: Path) -> None:
    """Top-1 agreement and mean top-5 overlap of the INT8 classifier with FP32, both
    fed by the same DALI tensors: on the parity corpus (13 images), and on the
    stricter crop corpus (216 images, `_crops`); `_clear` on the images where FP32's
    top-1 leads by CLEAR_MARGIN or more. ImageNet accuracy is not measured here."""
    served = (repository / INT8_ENSEMBLE).is_dir()
    for suffix, images in (("", None), ("_crops", crop_images() if served else None)):
        report = compare_classifiers(repository, DALI_PRESET, INT8_PRESET, images) if served else None
        results[f"int8_top1_agreement{suffix}"] = report.top1_agreement if report else None
        results[f"int8_top5_overlap{suffix}"] = report.mean_top5_overlap if report else None
        results[f"int8_top1_agreement_clear{suffix}"] = report.clear_top1_agreement() if report else None


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack benchmark"))
