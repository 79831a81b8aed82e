"""Every figure the benchmark tools write, declared once: its JSON key, unit, target and
ceiling where it has them, and one line of meaning.

A phase returns a frozen dataclass whose field names are the keys it measures (a
`Median` field is written as `<key>`, `<key>_spread`, `<key>_interval` and `<key>_n`);
`report` merges the phases' results once, and refuses a key that is not declared here or that two phases write.
results.py's required keys, targets and ceilings, serving_ratios.py's docstring and the
tables of docs/performance.md ("Every figure", rendered by .figures_page) are read from
these declarations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import scipy.stats

SIDES = ("a", "b")  # `tritonstack compare`'s two servers


# The interval of a median over rounds: a seeded percentile bootstrap, so that the same
# rounds give the same interval. Percentile rather than BCa: BCa's jackknife is
# undefined for the few, often tied, values of 5 rounds.
CONFIDENCE = 0.95
RESAMPLES = 9999
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Median:
    """The median of per-round values, their [min, max] (`spread`), a 95 % bootstrap
    interval of the median (`interval`, None under 2 values) and how many there were
    (`n`); None for each when nothing was measured (a round whose side measured nothing
    gives no value)."""

    value: float | None
    spread: list | None
    interval: list | None = None
    n: int = 0

    @classmethod
    def of(cls, values: list[float]) -> Median:
        if not values:
            return cls(None, None)
        spread = [float(min(values)), float(max(values))]
        return cls(float(np.median(values)), spread, median_interval(values), len(values))

    def written(self, key: str) -> dict:
        """Its keys in a report."""
        return {key: self.value, f"{key}_spread": self.spread, f"{key}_interval": self.interval, f"{key}_n": self.n}

    @classmethod
    def read(cls, report: dict, key: str) -> Median:
        """The Median `written` put in a report under `key` (a single measure: no interval, n 0)."""
        return cls(report[key], report.get(f"{key}_spread"), report.get(f"{key}_interval"), report.get(f"{key}_n") or 0)

    def text(self, form: str = ".3f") -> str:
        """How every report and log prints a median: `1.031 [0.982, 1.064] n=5`; the
        value alone for a single measure; "-" when nothing was measured."""
        if self.value is None:
            return "-"
        within = f" [{self.interval[0]:{form}}, {self.interval[1]:{form}}]" if self.interval else ""
        return f"{self.value:{form}}{within}" + (f" n={self.n}" if self.n else "")


def median_interval(values: list[float]) -> list[float] | None:
    """The 95 % percentile-bootstrap interval of the median of `values`; None under
    2 values, where resampling has nothing to vary."""
    if len(values) < 2:
        return None
    result = scipy.stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.median,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


@dataclass(frozen=True)
class Figure:
    """One key of a report. `promised`: every run writes it, and a smoke run on a
    repository with every preset gives it a value (tests/test_benchmark.py)."""

    key: str
    unit: str
    meaning: str
    target: tuple[str, float] | None = None  # (">=" or "<=", value)
    ceiling: str | None = None  # the key of the most this CPU allows it (tritonstack/benchmark/cost.py)
    spread: bool = False  # a Median: written with `<key>_spread` ([min, max]), `<key>_interval` and `<key>_n`
    promised: bool = False


def _median(key: str, unit: str, meaning: str, **declared) -> Figure:
    return Figure(key, unit, meaning, spread=True, **declared)


def _promised(key: str, unit: str, meaning: str, **declared) -> Figure:
    return Figure(key, unit, meaning, promised=True, **declared)


def _promised_median(key: str, unit: str, meaning: str, **declared) -> Figure:
    return Figure(key, unit, meaning, spread=True, promised=True, **declared)


_MACHINE = (
    Figure("settings", "", "the phases' durations and rounds (tritonstack/measure/load_settings.py)"),
    _promised("cpu_model", "", "the CPU, as /proc/cpuinfo names it"),
    _promised("cpu_flags", "", "the CPU's instruction-set extensions that change which kernels run"),
    _promised("cpu_count", "cores", "the cores this process sees"),
    _promised("versions", "", "tritonserver, Python and the measured libraries' versions"),
    Figure("inprocess_best_setting", "", "the in-process reference's best (batch, DALI threads, ORT threads)"),
    Figure("server_best_concurrency", "requests", "the gRPC concurrency that saturates the DALI ensemble"),
    _promised("errors", "requests", "failed requests over every phase", target=("<=", 0)),
)

_ROUNDS = (
    _promised_median("inprocess_images_per_s", "images/s", "DALI + ONNX Runtime in this process, no server"),
    _promised_median("server_images_per_s", "images/s", "the DALI ensemble over gRPC at its best concurrency"),
    _median("http_images_per_s", "images/s", "the same over HTTP"),
    _median("pil_ensemble_images_per_s", "images/s", "the Pillow ensemble over gRPC"),
    _promised_median("dali_preprocess_images_per_s", "images/s", "the DALI preprocessing model alone"),
    _promised_median("pil_preprocess_images_per_s", "images/s", "the Pillow preprocessing model alone"),
    _median("int8_ensemble_images_per_s", "images/s", "the INT8 ensemble over gRPC"),
    _promised_median("serving_efficiency", "ratio", "server / in process, images per second", target=(">=", 0.90)),
    _promised_median("http_vs_grpc", "ratio", "HTTP / gRPC, images per second"),
    _promised_median(
        "dali_vs_pil_ensemble",
        "ratio",
        "DALI / Pillow ensemble, images per second",
        target=(">=", 1.5),
        ceiling="dali_vs_pil_ensemble_ceiling",
    ),
    _promised_median(
        "dali_vs_pil_preprocess", "ratio", "DALI / Pillow preprocessing alone, images per second", target=(">=", 1.5)
    ),
    _promised_median(
        "int8_vs_fp32_ensemble",
        "ratio",
        "INT8 / FP32 ensemble, images per second",
        target=(">=", 1.5),
        ceiling="int8_vs_fp32_ensemble_ceiling",
    ),
    _median("dali_preprocess_images_per_cpu_s", "images/CPU-s", "the DALI preprocessing model per server CPU second"),
    _median("pil_preprocess_images_per_cpu_s", "images/CPU-s", "the Pillow preprocessing model per server CPU second"),
    _promised_median("dali_vs_pil_per_cpu_second", "ratio", "DALI / Pillow preprocessing, per server CPU second"),
    _promised_median("inprocess_images_per_cpu_s", "images/CPU-s", "the in-process reference per CPU second"),
    _promised_median("server_images_per_cpu_s", "images/CPU-s", "tritonserver and its stubs, client excluded"),
    _promised_median(
        "cpu_efficiency",
        "ratio",
        "server / in-process images per CPU second (1: nothing spent beyond the libraries)",
        target=(">=", 0.95),
    ),
    Figure("client_cpu_share", "cores", "the share of a core the asyncio client used in the gRPC rounds"),
)

_SERVER = (
    _promised("server_rss_mb", "MiB", "tritonserver and its stubs right after the rounds", target=("<=", 2048)),
    Figure("server_rss_mb_by_process", "MiB", "the same by process: `tritonserver`, `stub:<model>`"),
    Figure("ensemble_trace_ms_p50", "ms", "where a request's time goes, from Triton's trace (a server started here)"),
)

_SINGLE = (
    _promised_median(
        "ensemble_overhead_ms_p50", "ms", "client latency minus the steps' compute, concurrency 1", target=("<=", 1.0)
    ),
    _promised_median(
        "ensemble_overhead_share", "ratio", "the overhead / the single-request latency", target=("<=", 0.04)
    ),
    _promised_median("latency_ms_p50_concurrency_1", "ms", "one request at a time"),
    Figure("grpc_round_trip_ms_p50", "ms", "the floor of any gRPC call (is_server_live)"),
    Figure("ensemble_hops_ms_p50", "ms", "per hop and step part, from Triton's statistics"),
)

_OPEN_LOOP = (
    _promised("open_loop_requests", "requests", "the fewest requests of the open-loop runs"),
    _promised_median("open_loop_rate", "requests/s", "70 % of the saturation measured right before"),
    _promised_median("open_loop_ms_p50", "ms", "p50 in that open loop"),
    _promised_median("open_loop_ms_p99", "ms", "p99 in that open loop"),
    _promised_median("p99_over_p50", "ratio", "the tail at 70 % load", target=("<=", 2.5)),
)

_CAPACITY = (
    Figure("capacity_slo_ms", "ms", "the capacity's p99 budget: 8 single-request medians"),
    _promised_median(
        "capacity_at_slo", "fraction", "the highest share of saturation whose Poisson p99 meets the SLO, per search"
    ),
    Figure("capacity_probes", "", "every probe of those searches: search, fraction, saturation, rate, p99, errors"),
    _promised_median(
        "ideal_queue_capacity",
        "fraction",
        "the same on an ideal queue, searched alike (tritonstack/measure/ideal_queue.py)",
    ),
    _promised_median(
        "capacity_vs_ideal_queue", "ratio", "capacity_at_slo / ideal_queue_capacity, per search", target=(">=", 0.90)
    ),
)

_INT8_AGREEMENT = (
    _promised("int8_top1_agreement", "fraction", "INT8 top-1 = FP32 top-1, the 13 parity photos"),
    _promised("int8_top5_overlap", "labels", "mean top-5 overlap with FP32, the 13 parity photos"),
    Figure("int8_top1_agreement_clear", "fraction", "top-1 agreement where FP32 leads clearly, parity photos"),
    _promised("int8_top1_agreement_crops", "fraction", "INT8 top-1 = FP32 top-1, 216 crops", target=(">=", 0.85)),
    _promised("int8_top5_overlap_crops", "labels", "mean top-5 overlap with FP32, 216 crops"),
    _promised(
        "int8_top1_agreement_clear_crops",
        "fraction",
        "top-1 agreement where FP32 leads clearly, crops",
        target=(">=", 0.95),
    ),
)

_COST = (
    _promised(
        "cpu_ms_per_image",
        "CPU ms",
        "each library alone, one thread: dali, pil, pil_8bit, fp32, int8; and fp32_two_threads",
    ),
    _promised("cpu_ms_per_image_spread", "CPU ms", "[min, max] of each over the rounds"),
    _promised_median("int8_vs_fp32_ensemble_ceiling", "ratio", "(dali + fp32) / (dali + int8)"),
    _promised_median("dali_vs_pil_ensemble_ceiling", "ratio", "(pil + fp32) / (dali + fp32)"),
    _promised_median(
        "classifier_two_threads_vs_one_cpu",
        "ratio",
        "fp32_two_threads / fp32: CPU per image of one ONNX Runtime session on two threads over one on one",
    ),
    Figure("cpu_ms_per_image_rounds", "CPU ms", "each library alone, round by round (the floors of the served ratios)"),
    Figure(
        "served_cpu_ms_per_image", "CPU ms", "tritonserver and each model's stubs per image, the HTTP rounds (medians)"
    ),
    Figure(
        "served_overhead_ms_per_image",
        "CPU ms",
        "each step served minus its library alone (tritonserver: all of its own)",
    ),
    _median(
        "served_vs_floor", "ratio", "the whole served CPU per image / (dali + fp32) in process", target=("<=", 1.15)
    ),
    _median(
        "served_dali_vs_peer_preprocess",
        "ratio",
        "the DALI step served / the peer's Pillow preprocessing (pil_8bit) in process",
        target=("<=", 1.0),
    ),
)

_PEER = (
    _promised(
        "peer_best_concurrency", "requests", "the peer's in flight that saturated it (ours: server_best_concurrency)"
    ),
    _promised_median("peer_images_per_s", "images/s", "the FastAPI peer serving the FP32 classifier"),
    _promised_median("peer_cpu_ms_per_image", "CPU ms", "the peer's CPU per image (uvicorn and its workers)"),
    _promised_median("vs_peer_throughput", "ratio", "ours / the peer's images per second", target=(">=", 1.0)),
    _promised_median("vs_peer_cpu", "ratio", "our CPU per image / the peer's", target=("<=", 1.0)),
    _promised_median("int8_peer_images_per_s", "images/s", "the peer serving the INT8 classifier"),
    _promised_median("int8_peer_cpu_ms_per_image", "CPU ms", "its CPU per image"),
    _promised_median(
        "int8_vs_peer_throughput", "ratio", "INT8: ours / the peer's images per second", target=(">=", 1.0)
    ),
    _promised_median("int8_vs_peer_cpu", "ratio", "INT8: our CPU per image / the peer's", target=("<=", 1.0)),
    _promised("vs_peer_latency", "ms", "both sides' p50 and p99 at saturation and in the open loop"),
    _promised_median(
        "vs_peer_saturation_p99", "ratio", "our p99 / the peer's in the closed-loop rounds, each at its best in flight"
    ),
    _promised_median(
        "vs_peer_open_loop_p99", "ratio", "our p99 / the peer's, same Poisson arrivals at 70 %", target=("<=", 1.0)
    ),
)

_LOADGEN = (
    Figure(
        "loadgen",
        "",
        "MLPerf LoadGen per side: Offline images/s (median) and each round's, the highest Server rate it judges "
        "VALID at its p99 bound, each Server run [rate, valid, p99 ms]; logs beside the report (<out>_loadgen/)",
    ),
    _median(
        "loadgen_vs_peer_offline",
        "ratio",
        "LoadGen Offline: ours / the peer's images/s, round by round (interleaved)",
        target=(">=", 1.0),
    ),
    Figure(
        "loadgen_vs_peer_server", "ratio", "LoadGen Server: ours / the peer's highest VALID rate", target=(">=", 1.0)
    ),
)

_WRITTEN_AFTER = (
    Figure("benchmark_seconds", "s", "the whole run (the command line adds it)"),
    Figure(
        "missed_targets", "", "each target not met (its interval wholly on the wrong side), with this CPU's ceiling"
    ),
    Figure("inconclusive_targets", "", "each target whose 95 % interval straddles it: neither met nor missed"),
)

# `tritonstack benchmark`: one JSON object.
BENCHMARK = (
    *_MACHINE,
    *_ROUNDS,
    *_SERVER,
    *_SINGLE,
    *_OPEN_LOOP,
    *_CAPACITY,
    *_INT8_AGREEMENT,
    *_COST,
    *_PEER,
    *_LOADGEN,
    *_WRITTEN_AFTER,
)

# `tritonstack benchmark --regions N` (tritonstack/benchmark/region_speedup.py).
REGIONS = (
    Figure("boxes", "boxes", "per photo"),
    Figure("concurrency", "requests", "photos in flight"),
    Figure("photo", "", "the corpus photo the boxes are cut from"),
    Figure("cpu_model", "", "the CPU, as /proc/cpuinfo names it"),
    Figure("cpu_count", "cores", "the cores this process sees"),
    Figure("settings", "", "seconds, warmup_s and repeats"),
    Figure("errors", "requests", "failed requests"),
    _median("regions_crops_per_s", "crops/s", "the photo and its boxes in one request"),
    _median("per_crop_crops_per_s", "crops/s", "each box cut and sent alone"),
    _median("regions_speedup", "ratio", "regions / per crop, crops per second"),
    _median("regions_crops_per_cpu_s", "crops/CPU-s", "regions, per second of the server's CPU"),
    _median("per_crop_crops_per_cpu_s", "crops/CPU-s", "per crop, per second of the server's CPU"),
    _median("regions_speedup_per_cpu_s", "ratio", "the same ratio per server CPU second (the steadier)"),
    Figure("benchmark_seconds", "s", "the whole run (the command line adds it)"),
)

# `tritonstack benchmark --audio` (tritonstack/benchmark/audio_cost.py).
AUDIO = (
    Figure("clip_seconds", "s", "the sample clip's length (tritonstack.samples.speech)"),
    Figure("concurrency", "requests", "clips in flight, on each side"),
    Figure("cpu_model", "", "the CPU, as /proc/cpuinfo names it"),
    Figure("cpu_count", "cores", "the cores this process sees"),
    Figure("settings", "", "seconds, warmup_s and repeats"),
    Figure("errors", "requests", "failed requests"),
    _median("served_audio_s_per_s", "audio s/s", "ensemble_audio_silero_vad over gRPC"),
    _median("inprocess_audio_s_per_s", "audio s/s", "DALI decoding and silero-vad in this process"),
    _median("served_audio_s_per_cpu_s", "audio s/CPU-s", "served, per second of the server's CPU"),
    _median("inprocess_audio_s_per_cpu_s", "audio s/CPU-s", "in-process, per second of this process's CPU"),
    _median("speed_ratio", "ratio", "served / in-process, audio seconds per second"),
    _median("cost_ratio", "ratio", "served / in-process, CPU per audio second", target=("<=", 1.5)),
    Figure("benchmark_seconds", "s", "the whole run (the command line adds it)"),
)

# `tritonstack compare`: per model, under "models".
COMPARE = (
    *(
        figure
        for side in SIDES
        for figure in (
            _median(f"{side}_images_per_s", "images/s", f"{side.upper()}'s rate: closed loop, or the open loop's"),
            _median(f"{side}_ms_p50", "ms", f"{side.upper()}'s p50"),
            _median(f"{side}_ms_p99", "ms", f"{side.upper()}'s p99"),
            Figure(f"{side}_errors", "requests", f"{side.upper()}'s failed requests, every round"),
        )
    ),
    _median("b_over_a", "ratio", "B / A images per second, per round"),
    Figure("b_over_a_verdict", "", "B faster or slower where b_over_a's 95 % interval excludes 1, else inconclusive"),
    _median("b_over_a_ms_p99", "ratio", "B / A p99, per round"),
    Figure("b_over_a_ms_p99_verdict", "", "B faster (interval below 1) or slower (above), else inconclusive"),
)

# `tritonstack overload`: per round, protocol and load multiple, under "phases".
OVERLOAD = (
    Figure("round", "", "which of the --rounds the loop belongs to (from 1)"),
    Figure("protocol", "", "grpc or http"),
    Figure("clients", "", "ours (the deadline also sent as Triton's timeout) or stock (Triton's clients, no timeout)"),
    Figure("multiple", "x capacity", "the offered load"),
    Figure("offered_rps", "requests/s", "Poisson arrivals at multiple x capacity"),
    Figure("seconds", "s", "the open loop's length"),
    Figure("deadline_s", "s", "every request's deadline (ours send it as Triton's timeout too)"),
    Figure("sent", "requests", "all requests sent"),
    Figure("in_time", "requests", "answered before the deadline"),
    Figure("refused", "requests", "the server said no before the deadline"),
    Figure("refused_by_client", "requests", "refused at once by our client's throttle, never sent"),
    Figure("late", "requests", "no answer before the deadline, or one after it"),
    Figure("failed", "requests", "anything else"),
    Figure("failures", "", "the failed requests' errors, counted"),
    Figure("refused_share", "fraction", "refused / sent"),
    Figure("refused_by_client_share", "fraction", "refused_by_client / sent"),
    Figure("late_share", "fraction", "late / sent"),
    Figure("goodput_rps", "requests/s", "answered in time per second"),
    Figure("goodput_share", "fraction", "answered in time / (capacity x seconds)"),
    Figure("wasted_share", "fraction", "the worst step's computed images that reached nobody in time"),
    Figure("computed_by_step", "images", "each step's inference_count over the phase"),
    Figure("answered_ms_p99", "ms", "p99 of every answer, late ones included"),
    Figure("refused_ms_p99", "ms", "p99 of the server's refusals"),
    Figure("idle_ms", "ms", "a lone request's latency before the load"),
    Figure("recovery_s", "s", "wall time from the last send until a lone request is answered within twice idle_ms"),
    Figure("server_rss_growth_mb", "MiB", "tritonserver's process tree right after the load, less before it"),
)

# `tritonstack overload`: per protocol and load multiple over the --rounds, under "loads":
# these of OVERLOAD's per-loop figures, each as the median of its rounds.
_OVER_ROUNDS = (
    "refused_share",
    "refused_by_client_share",
    "late_share",
    "goodput_rps",
    "goodput_share",
    "wasted_share",
    "answered_ms_p99",
    "refused_ms_p99",
    "recovery_s",
    "server_rss_growth_mb",
)
OVERLOAD_LOADS = (
    *(figure for figure in OVERLOAD if figure.key in ("protocol", "multiple")),
    Figure("failed", "requests", "every round's failed requests, summed"),
    *(dataclasses.replace(figure, spread=True) for figure in OVERLOAD if figure.key in _OVER_ROUNDS),
)

# `tritonstack overload --soak`: per period of the swinging load, under "periods".
OVERLOAD_SOAK = (
    Figure("multiple", "x capacity", "the period's load"),
    Figure("in_time", "requests", "answered before the deadline"),
    Figure("answered_late", "requests", "answered within the grace after the deadline"),
    Figure("refused", "requests", "the server said no"),
    Figure("unresolved", "requests", "neither answered nor refused within deadline + grace"),
    Figure("wrong", "requests", "answers that differ from the same image's at idle"),
    Figure("failed", "requests", "anything else"),
    Figure("failures", "", "the failed requests' errors, counted"),
    Figure("goodput_share", "fraction", "answered in time / (capacity x period)"),
    Figure("answered_ms_p99", "ms", "p99 of every answer, late ones included"),
    Figure("refused_ms_p99", "ms", "p99 of refusals"),
)

GROUPS = {
    "benchmark": BENCHMARK,
    "regions": REGIONS,
    "audio": AUDIO,
    "compare": COMPARE,
    "overload": OVERLOAD,
    "overload_loads": OVERLOAD_LOADS,
    "overload_soak": OVERLOAD_SOAK,
}

SUMMED = "errors"  # every phase counts its own failures; the report holds their sum


MEDIAN_SUFFIXES = ("_spread", "_interval", "_n")


def written_keys(figures: tuple[Figure, ...]) -> tuple[str, ...]:
    """Every key a report of these figures holds: each figure's, and a Median's others."""
    return tuple(
        key
        for figure in figures
        for key in (figure.key, *(figure.key + suffix for suffix in MEDIAN_SUFFIXES if figure.spread))
    )


def report(figures: tuple[Figure, ...], *parts) -> dict:
    """The phases' results (frozen dataclasses) merged once, in the registry's order."""
    declared = {figure.key: figure for figure in figures}
    written: dict = {}
    for part in parts:
        for field in dataclasses.fields(part):
            key, value = field.name, getattr(part, field.name)
            if key not in declared:
                raise KeyError(f"{key} is not declared in tritonstack/measure/figures.py")
            if key == SUMMED:
                written[key] = written.get(key, 0) + value
                continue
            if key in written:
                raise KeyError(f"{key} is written by two phases")
            if isinstance(value, Median) != declared[key].spread:
                raise TypeError(f"{key}: a Median exactly where the registry declares a spread")
            written |= value.written(key) if isinstance(value, Median) else {key: value}
    order = written_keys(figures)
    return dict(sorted(written.items(), key=lambda item: order.index(item[0])))
