"""One benchmark of the serving stack, as ratios measured side by side in one run.

    tritonstack benchmark --quick --out reports/benchmark.json

It starts its own tritonserver on loopback (or measures a given one) and writes one JSON
object; every key is declared in tritonstack/measure/figures.py (unit, target, meaning;
the table in docs/performance.md). Against the DALI ensemble over gRPC: the in-process
reference (tritonstack.benchmark.inprocess), HTTP, the Pillow ensemble, each
preprocessing model alone and the INT8 ensemble; single requests and where their time
goes (tritonstack.benchmark.single, tritonstack.measure.trace); an open loop at 70 % of
saturation; the capacity under an SLO against an ideal queue
(tritonstack.measure.ideal_queue); INT8's agreement with FP32; each library's CPU per
image and the ceilings it sets (.cost); with the peer extra, a FastAPI + Pillow + ONNX
Runtime service on the same classifier files (.vs_peer), and MLPerf's LoadGen against
both sides: Offline, and the highest Poisson rate it judges VALID at a p99 bound
(tritonstack.measure.loadgen; its logs beside the report).

Every throughput ratio is the median of `repeats` interleaved rounds (A, B, A, B, ...
in one run, so that drift on a shared machine hits both sides alike), written with
`<key>_interval` (a 95 % bootstrap interval of the median), `<key>_n` (the rounds) and
`<key>_spread` ([min, max] over them); the rates are the medians of the same rounds.
A target whose interval straddles it is listed as inconclusive, not met.

The load comes from asyncio clients (tritonstack.client.aio) in this process: one
event loop keeps many single-image requests in flight at a small CPU cost, which
matters when client and server share two cores (`client_cpu_share`). Every request
is one image drawn from the load tests' weighted corpus of real photos.

Its keys:
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonstack.benchmark import peer
from tritonstack.benchmark.capacity import capacity_figures
from tritonstack.benchmark.cost import cost_figures, serving_cost
from tritonstack.benchmark.inprocess import inprocess_best_setting, inprocess_phase
from tritonstack.benchmark.scenario import Asked
from tritonstack.benchmark.single import grpc_round_trip_ms, single_requests, trace_medians, traced_single_requests
from tritonstack.benchmark.vs_peer import (
    PeerOpenLoop,
    peer_figures,
    peer_measures,
    peer_open_loop,
    peer_saturation,
    slower_rate,
)
from tritonstack.build.parity import compare_classifiers, crop_images
from tritonstack.measure.figures import BENCHMARK, Median, report
from tritonstack.measure.figures_page import docstring_listing
from tritonstack.measure.load_loops import (
    Phase,
    current_saturation,
    measured_phase,
    open_loop,
    saturate,
    typical_image,
    weighted_images,
)
from tritonstack.measure.load_settings import OPEN_LOOP_LOAD, QUICK, Settings
from tritonstack.measure.loadgen import LoadGenFigures, PeerHttpTarget, TritonHttpTarget, comparison, loadgen_figures
from tritonstack.measure.measured_models import (
    CLASSIFIER,
    DALI_ENSEMBLE,
    DALI_PREPROCESS,
    DALI_PRESET,
    INT8_ENSEMBLE,
    INT8_PRESET,
    PIL_ENSEMBLE,
    PIL_PREPROCESS,
)
from tritonstack.measure.results import cpu_flags, cpu_model, versions, write_results
from tritonstack.measure.rounds import interleaved, ratios
from tritonstack.measure.server_usage import server_rss_mb, server_rss_mb_by_process
from tritonstack.measure.trace import trace_args
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.target import GivenServer, target_server

__doc__ += docstring_listing(BENCHMARK)


@dataclass(frozen=True)
class Machine:
    settings: dict
    cpu_model: str
    cpu_flags: list[str]
    cpu_count: int | None
    inprocess_best_setting: dict


@dataclass(frozen=True)
class Trace:
    ensemble_trace_ms_p50: dict | None  # None on a given server: its trace file, if any, is not ours


def run(
    settings: Settings,
    repository: Path,
    log=print,
    server: TritonServer | GivenServer | None = None,
    loadgen_dir: Path | None = None,
) -> dict:
    """All measurements; on `server` if given (it must serve `repository`), else on
    a server started and stopped here. LoadGen's logs go to `loadgen_dir` (else they
    are dropped with a temporary folder)."""
    images = weighted_images(400)
    log("in-process reference (DALI + ONNX Runtime, no server): the best thread/batch setting...")
    setting = inprocess_best_setting(repository, images, settings)
    machine = Machine(
        dataclasses.asdict(settings) | {"quick": settings is QUICK}, cpu_model(), cpu_flags(), os.cpu_count(), setting
    )
    with tempfile.TemporaryDirectory(prefix="benchmark-") as folder:
        trace_file = Path(folder) / "trace.json"
        logs = loadgen_dir or Path(folder) / "loadgen"
        served, served_rounds, client_times = _run_on_server(
            settings, repository, images, setting, log, server, trace_file, logs
        )
        # The server has stopped: its trace file is complete.
        trace = Trace(trace_medians(trace_file, client_times) if client_times else None)
    log("INT8 vs FP32 classifier on the parity corpus (in process)...")
    agreement = int8_agreement(repository)
    costs = cost_figures(repository, images, settings.repeats, log)
    served_cost = serving_cost(served_rounds, costs.cpu_ms_per_image_rounds)
    return report(BENCHMARK, machine, *served, trace, agreement, costs, served_cost)


@dataclass(frozen=True)
class ServerFigures:
    versions: dict
    server_best_concurrency: int
    server_rss_mb: float | None  # right after the rounds: steady state
    server_rss_mb_by_process: dict[str, float] | None


def _run_on_server(
    settings: Settings,
    repository: Path,
    images: list[bytes],
    setting: dict,
    log,
    server,
    trace_file: Path,
    loadgen_dir: Path,
) -> tuple[list, list[dict[str, float]], list[tuple[int, int]]]:
    """Every measurement through a server: the figure groups, each process role's CPU
    per image in each HTTP round (serving_cost's input), and the client's times of the
    traced requests (none on a given server)."""
    own = server is None
    with (
        contextlib.nullcontext(server)
        if server
        else target_server(repository, extra_args=trace_args(trace_file)) as server,
        peer_beside(repository, log) as peer,
    ):
        server_versions = versions(server)
        log("DALI ensemble over gRPC: the concurrency that saturates it...")
        _, concurrency, errors = saturate(server.grpc_url, "grpc", DALI_ENSEMBLE, images, settings)
        log(f"interleaved rounds at concurrency {concurrency} (preprocessing alone at {max(settings.concurrency)})...")
        measures = _round_measures(server, repository, images, setting, concurrency, settings)
        peer_saturated = peer_saturation(peer, images, settings) if peer else None
        in_flight = {"ours": concurrency, "peer": peer_saturated[0] if peer_saturated else None}
        if peer:
            log(f"the peer saturates at concurrency {in_flight['peer']}")
            measures |= peer_measures(server, peer, images, in_flight, settings, "int8_ensemble" in measures)
        rounds = interleaved(measures, settings.repeats, log)
        rounded = round_figures(rounds, settings, errors)
        state = ServerFigures(server_versions, concurrency, server_rss_mb(server), server_rss_mb_by_process(server))
        log("single requests (concurrency 1): latency and where it goes...")
        single = single_request_figures(server, settings)
        looped = open_loop_figures(server, images, concurrency, settings, log)
        # No capacity without a saturation or a single request's latency to set the SLO by.
        single_p50 = single.latency_ms_p50_concurrency_1.value if rounded.server_images_per_s.value else None
        capacity = capacity_figures(server, images, concurrency, single_p50, settings, log)
        against: PeerOpenLoop | None = None
        if peer:
            against = peer_open_loop(server, peer, images, settings, slower_rate(rounds), log)
        compared = peer_figures(rounds, against, peer_saturated)
        rates = {"ours": rounded.http_images_per_s.value, "peer": compared.peer_images_per_s.value}
        measured_by_loadgen = loadgen_comparison(server, peer, images, in_flight, rates, settings, loadgen_dir, log)
        served = [rounded, state, single, looped, capacity, compared, measured_by_loadgen]
        served_rounds = [phase.cpu_ms_per_image_by_model for phase in rounds.get("http", [])]
        return served, served_rounds, traced_single_requests(server, settings.traced_requests) if own else []


def loadgen_comparison(
    server,
    running_peer,
    images: list[bytes],
    in_flight: dict[str, int],
    rates: dict[str, float],
    settings: Settings,
    log_dir: Path,
    log,
) -> LoadGenFigures:
    """MLPerf's LoadGen, Offline and Server, against ours over HTTP and the peer, the same
    images, Offline at the concurrency that saturated each side and expecting the rate
    its rounds measured (`rates`: side -> images/s) (tritonstack.measure.loadgen)."""
    if running_peer is None or settings.loadgen is None:
        return comparison(None)
    sides = {
        "ours": (TritonHttpTarget(server.http_url, DALI_ENSEMBLE), in_flight["ours"], rates["ours"]),
        "peer": (PeerHttpTarget(running_peer.url, CLASSIFIER), in_flight["peer"], rates["peer"]),
    }
    log(f"MLPerf LoadGen: Offline, then the highest VALID Server rate, logs in {log_dir}...")
    return comparison(loadgen_figures(sides, images, settings.loadgen, log_dir, log))


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


# key -> (numerator, denominator) of the rounds, as images per second.
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


# key -> round, as images per second of the server's CPU (the in-process reference's own).
ROUND_CPU_RATES = {
    "dali_preprocess_images_per_cpu_s": "dali_preprocess",
    "pil_preprocess_images_per_cpu_s": "pil_preprocess",
    "inprocess_images_per_cpu_s": "inprocess",
    "server_images_per_cpu_s": "grpc",
}


# key -> (numerator, denominator) of the rounds, as images per CPU second.
ROUND_CPU_RATIOS = {
    "dali_vs_pil_per_cpu_second": ("dali_preprocess", "pil_preprocess"),
    # 1.0: the server spends nothing beyond DALI and ONNX Runtime.
    "cpu_efficiency": ("grpc", "inprocess"),
}


@dataclass(frozen=True)
class RoundFigures:
    """The interleaved rounds' rates and ratios (ROUND_* above)."""

    inprocess_images_per_s: Median
    server_images_per_s: Median
    http_images_per_s: Median
    pil_ensemble_images_per_s: Median
    dali_preprocess_images_per_s: Median
    pil_preprocess_images_per_s: Median
    int8_ensemble_images_per_s: Median
    serving_efficiency: Median
    http_vs_grpc: Median
    dali_vs_pil_ensemble: Median
    dali_vs_pil_preprocess: Median
    int8_vs_fp32_ensemble: Median
    dali_preprocess_images_per_cpu_s: Median
    pil_preprocess_images_per_cpu_s: Median
    inprocess_images_per_cpu_s: Median
    server_images_per_cpu_s: Median
    dali_vs_pil_per_cpu_second: Median
    cpu_efficiency: Median
    client_cpu_share: float
    errors: int


def round_figures(rounds: dict[str, list[Phase]], settings: Settings, saturation_errors: int) -> RoundFigures:
    def rates(name: str) -> list[float | None]:
        return [phase.images_per_s for phase in rounds.get(name, [])]

    def per_cpu(name: str) -> list[float | None]:
        return [phase.images_per_cpu_s for phase in rounds.get(name, [])]

    return RoundFigures(
        **{key: Median.of([rate for rate in rates(name) if rate]) for key, name in ROUND_RATES.items()},
        **{key: Median.of(ratios(rates(a), rates(b))) for key, (a, b) in ROUND_RATIOS.items()},
        **{key: Median.of([rate for rate in per_cpu(name) if rate]) for key, name in ROUND_CPU_RATES.items()},
        **{key: Median.of(ratios(per_cpu(a), per_cpu(b))) for key, (a, b) in ROUND_CPU_RATIOS.items()},
        client_cpu_share=float(
            np.median([phase.client_cpu_s / (settings.seconds + settings.warmup_s) for phase in rounds["grpc"]])
        ),
        errors=saturation_errors + sum(phase.errors for phases in rounds.values() for phase in phases),
    )


@dataclass(frozen=True)
class SingleRequestFigures:
    ensemble_overhead_ms_p50: Median
    ensemble_overhead_share: Median
    latency_ms_p50_concurrency_1: Median
    grpc_round_trip_ms_p50: float
    ensemble_hops_ms_p50: dict[str, float]
    errors: int


def single_request_figures(server, settings: Settings) -> SingleRequestFigures:
    """`repeats` phases at concurrency 1."""
    measured = [
        single_requests(
            server, DALI_ENSEMBLE, (DALI_PREPROCESS, CLASSIFIER), typical_image(), settings.seconds, settings.warmup_s
        )
        for _ in range(settings.repeats)
    ]
    hops = {hop: [value for m in measured for value in m.hops_ms.get(hop, [])] for hop in measured[0].hops_ms}
    return SingleRequestFigures(
        ensemble_overhead_ms_p50=Median.of([m.overhead_ms_p50 for m in measured if m.overhead_ms_p50 is not None]),
        ensemble_overhead_share=Median.of([m.overhead_share for m in measured if m.overhead_share is not None]),
        latency_ms_p50_concurrency_1=Median.of([m.phase.percentile_ms(50) for m in measured if m.phase.latencies_s]),
        grpc_round_trip_ms_p50=grpc_round_trip_ms(server),
        ensemble_hops_ms_p50={hop: float(np.median(values)) for hop, values in hops.items() if values},
        errors=sum(m.phase.errors for m in measured),
    )


@dataclass(frozen=True)
class OpenLoopFigures:
    open_loop_requests: int
    open_loop_rate: Median
    open_loop_ms_p50: Median
    open_loop_ms_p99: Median
    p99_over_p50: Median
    errors: int


def open_loop_figures(server, images: list[bytes], concurrency: int, settings: Settings, log) -> OpenLoopFigures:
    """p99/p50 at OPEN_LOOP_LOAD of the saturation measured right before, equal
    gaps, `repeats` times."""
    log(f"open loop at {OPEN_LOOP_LOAD:.0%} of saturation (measured before each), {settings.repeats} times...")
    phases, errors = [], 0
    for _ in range(settings.repeats):
        saturation = current_saturation(server, images, concurrency, settings)
        rate = OPEN_LOOP_LOAD * saturation.images_per_s or 1.0
        # One gap more than the minimum: sends at equal gaps within [0, seconds) are
        # floor(seconds x rate), which float rounding can take one below the minimum.
        seconds = max(settings.open_loop_s, (settings.open_loop_min_requests + 1) / rate)
        phases.append(asyncio.run(open_loop(server.grpc_url, DALI_ENSEMBLE, images, rate, seconds, settings.warmup_s)))
        errors += saturation.errors
    measured = [phase for phase in phases if phase.latencies_s]
    return OpenLoopFigures(
        open_loop_requests=min(len(phase.latencies_s) + phase.errors for phase in phases),
        open_loop_rate=Median.of([phase.offered_rate for phase in phases]),
        open_loop_ms_p50=Median.of([phase.percentile_ms(50) for phase in measured]),
        open_loop_ms_p99=Median.of([phase.percentile_ms(99) for phase in measured]),
        p99_over_p50=Median.of([phase.percentile_ms(99) / phase.percentile_ms(50) for phase in measured]),
        errors=errors + sum(phase.errors for phase in phases),
    )


@dataclass(frozen=True)
class Int8Agreement:
    int8_top1_agreement: float | None
    int8_top5_overlap: float | None
    int8_top1_agreement_clear: float | None
    int8_top1_agreement_crops: float | None
    int8_top5_overlap_crops: float | None
    int8_top1_agreement_clear_crops: float | None


def int8_agreement(repository: Path) -> Int8Agreement:
    """Top-1 agreement and mean top-5 overlap of the INT8 classifier with FP32, both
    fed by the same DALI tensors: on the parity corpus, and on the stricter crop
    corpus (`_crops`); `_clear` on the images where FP32's top-1 leads by CLEAR_MARGIN
    or more. ImageNet accuracy is not measured here. None without the INT8 preset."""
    served = (repository / INT8_ENSEMBLE).is_dir()
    figures = {}
    for suffix, images in (("", None), ("_crops", crop_images() if served else None)):
        compared = compare_classifiers(repository, DALI_PRESET, INT8_PRESET, images) if served else None
        figures[f"int8_top1_agreement{suffix}"] = compared.top1_agreement if compared else None
        figures[f"int8_top5_overlap{suffix}"] = compared.mean_top5_overlap if compared else None
        figures[f"int8_top1_agreement_clear{suffix}"] = compared.clear_top1_agreement() if compared else None
    return Int8Agreement(**figures)


@dataclass(frozen=True)
class ServingRatios:
    """The serving stack as ratios side by side, written with the targets each run
    missed (tritonstack.measure.results)."""

    name: str = "serving"

    def wanted(self, asked: Asked) -> bool:
        return True  # what the benchmark measures when no other scenario is asked for

    def run(self, asked: Asked, server, log) -> dict:
        return run(asked.settings, asked.repository, log, server, asked.loadgen_dir)

    def write(self, results: dict, asked: Asked) -> str:
        return write_results(results, asked.out)


SCENARIO = ServingRatios()
