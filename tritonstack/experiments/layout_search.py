"""Layouts measured on this machine, and the best one written as a new repository.

    tritonstack tune --model-repository model_repository --objective throughput --budget-s 600 --out tuned
    tritonstack tune --objective p99 --p99-ms 120 --rate 60 --budget-s 600 --out tuned

A layout is what `tritonstack build` fixes per ensemble step: the DALI step's instances
and threads, the classifier's instances and ONNX Runtime threads, and the batch the
classifier's dynamic batcher forms (the DALI step's follows the build's rule). Each
candidate is loaded into one running server through Triton's model-control API (no
restart; the repository's files untouched), warmed, then measured with the benchmark's
own phases: a closed loop at `--concurrency` in flight (images/s, p99, server CPU per
image) and, with `--rate`, an open loop of Poisson arrivals at that rate (its p99).

The search is pruned in two passes: the thread layouts this machine's cores allow, at
the repository's classifier batch; then the classifier batches around the best of
them. What budget is left measures the leading candidates again (up to REPEATS times
each; a candidate's figures are the medians of its measurements), so that one lucky
or unlucky phase on a noisy machine does not choose. It stops when the budget would be
exceeded by one more measurement, and Ctrl-C stops it early: either way the best so
far is written.

Objectives: `throughput`, the most images/s; `p99`, the most images/s among layouts
whose p99 at `--rate` stays under `--p99-ms` (or, when none does, the lowest p99). A
layout's open loops are pooled, and it stays under the bound only when the upper 95 %
confidence bound of its p99 does (`p99_upper_bound_ms`): the p99 of a thousand
requests rests on its ten slowest, and the most images/s among layouts judged by their
luckiest loops is a layout that misses the bound once served.
Written: `--out`, a copy of the repository with the winner's configs (never over the
tuned one), and in `--report`, `tune.json` (every candidate's figures, the winner, its
`tritonstack build` flags), `tune.md` (the table) and `pareto.png` (images/s against p99).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable

import numpy as np
import psutil
from scipy.stats import binom

from tritonstack import cli
from tritonstack.build.presets import BuildOptions
from tritonstack.measure.figures import Median
from tritonstack.measure.load_loops import closed_loop, open_loop, url_for
from tritonstack.objective import MIN_QUEUED_STEP_INSTANCES
from tritonstack.serve.layout import StepLayout, with_layout
from tritonstack.serve.loaded import load_overrides, loaded_configs

OBJECTIVES = ("throughput", "p99")
PROTOCOLS = ("grpc", "http")
# The classifier batches the second pass tries around the first pass's winner.
BATCHES = (1, 4, 8, 16)
POISSON_SEED = 7
# The open loop at --rate lasts long enough for this many requests: a p99 from the ~10
# slowest, not from one or two (the benchmark's open_loop_min_requests).
RATE_REQUESTS = 1000
# The server's first warm-up, before the first candidate: at most this long, and this
# share of the budget.
FIRST_WARMUP_S = 15.0
FIRST_WARMUP_SHARE = 0.05
# Measurements of each leading candidate, budget allowing, and how many lead.
REPEATS = 3
LEADING = 3
# How sure a layout that meets the p99 bound must be to meet it (p99_upper_bound_ms).
P99_CONFIDENCE = 0.95


# The BuildOptions a layout sets; the rest keep the build's defaults.
LAYOUT_BUILD_FIELDS = ("instances", "classifier_instances", "num_threads", "intra_op_threads", "classifier_batch")


@dataclasses.dataclass(frozen=True, order=True)
class Layout:
    dali_instances: int
    dali_threads: int
    classifier_instances: int
    classifier_threads: int
    classifier_batch: int  # 0: the dynamic batcher forms no preferred batch

    def build_options(self) -> BuildOptions:
        return BuildOptions(
            instances=self.dali_instances,
            num_threads=self.dali_threads,
            classifier_instances=self.classifier_instances,
            intra_op_threads=self.classifier_threads,
            classifier_batch=self.classifier_batch,
        )

    def build_flags(self) -> list[str]:
        """The `tritonstack build` flags that build this layout, as BuildOptions declares them."""
        return cli.to_argv(self.build_options(), fields=LAYOUT_BUILD_FIELDS)

    def describe(self) -> str:
        return (
            f"DALI {self.dali_instances}x{self.dali_threads}, classifier {self.classifier_instances}x"
            f"{self.classifier_threads} batch {self.classifier_batch or 'none'}"
        )


@dataclasses.dataclass(frozen=True)
class Measured:
    layout: Layout
    images_per_s: float
    p99_ms: float  # the closed loop's
    cpu_ms_per_image: float | None
    rate_p99_ms: float | None  # the open loop's at --rate (its loops' latencies pooled)
    errors: int
    measurements: int = 1  # the figures are the medians of this many
    rate_p99_bound_ms: float | None = None  # the upper P99_CONFIDENCE bound of rate_p99_ms
    # The open loops' latencies, pooled across measurements; not written in reports.
    rate_latencies_ms: tuple[float, ...] = dataclasses.field(default=(), repr=False)

    @property
    def latency_ms(self) -> float:
        """The p99 the objective and the Pareto front weigh: at --rate when measured."""
        return self.rate_p99_ms if self.rate_p99_ms is not None else self.p99_ms

    def meets(self, bound_ms: float | None) -> bool:
        """Its p99 at --rate is under `bound_ms` with P99_CONFIDENCE."""
        return bound_ms is not None and self.rate_p99_bound_ms is not None and self.rate_p99_bound_ms <= bound_ms

    def figures(self) -> dict:
        """What a report writes of it: every field but the latencies."""
        return {key: value for key, value in dataclasses.asdict(self).items() if key != "rate_latencies_ms"}


def p99_upper_bound_ms(latencies_ms: list[float] | tuple[float, ...]) -> float:
    """The upper P99_CONFIDENCE bound of the p99 behind `latencies_ms`, whatever their
    distribution: the smallest order statistic that lies at or above the true p99 with
    that probability (the count of latencies below the p99 is binomial). From 1000
    latencies it is the 996th, from 3000 the 2980th; inf when too few to bound."""
    index = int(binom.ppf(P99_CONFIDENCE, len(latencies_ms), 0.99))
    return float(np.sort(latencies_ms)[index]) if index < len(latencies_ms) else float("inf")


def rate_figures(latencies_ms: list[float] | tuple[float, ...]) -> dict:
    """An open loop's figures at --rate from its latencies: the p99 and its upper bound."""
    return {
        "rate_p99_ms": float(np.percentile(latencies_ms, 99)),
        "rate_p99_bound_ms": p99_upper_bound_ms(latencies_ms),
        "rate_latencies_ms": tuple(latencies_ms),
    }


# A loop with failed requests at --rate meets no bound.
FAILED_AT_RATE = {"rate_p99_ms": float("inf"), "rate_p99_bound_ms": float("inf")}


@dataclasses.dataclass(frozen=True)
class TuneSettings:
    objective: str = cli.option(
        "throughput",
        "--objective",
        choices=OBJECTIVES,
        help="throughput: most images/s; p99: most images/s whose p99 at --rate stays under --p99-ms",
    )
    p99_ms: float | None = cli.option(None, "--p99-ms", type=cli.positive_float, metavar="MS", help="the p99 bound")
    rate: float | None = cli.option(
        None, "--rate", type=cli.positive_float, metavar="RPS", help="the open loop's requests/s (Poisson arrivals)"
    )
    budget_s: float = cli.option(600.0, "--budget-s", type=cli.positive_float, metavar="S", help="the search's time")
    max_measurements: int | None = cli.option(
        None,
        "--max-measurements",
        type=cli.positive_int,
        metavar="N",
        help="stop after N measurements whatever budget is left (a quick look on a slow machine; "
        "--budget-s still bounds it)",
    )
    concurrency: int = cli.option(
        8, "--concurrency", type=cli.positive_int, help="the closed loop's requests in flight"
    )
    seconds: float = cli.option(8.0, "--seconds", type=cli.positive_float, help="each measured phase")
    warmup_s: float = cli.option(2.0, "--warmup-s", type=cli.positive_float, help="before each phase")
    protocol: str = cli.option(
        "grpc",
        "--protocol",
        choices=PROTOCOLS,
        help="what the phases' client speaks (http: as the benchmark measures the peer, for a bound taken from it)",
    )

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, not {self.objective!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {self.protocol!r}")
        if self.objective == "p99" and (self.p99_ms is None or self.rate is None):
            raise ValueError("the p99 objective needs --p99-ms and --rate (requests/s)")

    @property
    def rate_seconds(self) -> float:
        """The open loop's measured seconds: --seconds, or RATE_REQUESTS' worth at --rate."""
        return max(self.seconds, RATE_REQUESTS / self.rate) if self.rate else 0.0

    @property
    def seconds_per_candidate(self) -> float:
        """Load and warm-up included (about 5 s to load the steps again)."""
        open_loop_s = self.rate_seconds + self.warmup_s if self.rate else 0.0
        return 5.0 + self.seconds + self.warmup_s + open_loop_s


# --- the candidates ---


def thread_layouts(cores: int, batch: int) -> list[Layout]:
    """Every split of the cores the first pass tries, each step at least
    MIN_QUEUED_STEP_INSTANCES instances (every step has a queue policy: objective.py
    says why one instance is not enough): the DALI step as two instances of 1, half or
    all the cores' threads, or an instance of one thread a core; the classifier as 2,
    half or all the cores' instances of the cores' share of threads each, or of one."""
    least = MIN_QUEUED_STEP_INSTANCES
    half = max(cores // 2, 1)
    dali = {(least, 1), (least, half), (least, cores)} | ({(cores, 1)} if cores > least else set())
    instances = {count for count in (least, half, cores) if count >= least}
    classifier = {(count, max(cores // count, 1)) for count in instances} | {(count, 1) for count in instances}
    layouts = [Layout(di, dt, ci, ct, batch) for di, dt in dali for ci, ct in classifier]
    return sorted(layouts, key=lambda layout: (idle_cores(layout, cores), layout))


def idle_cores(layout: Layout, cores: int) -> int:
    """The pruning's order: layouts that keep every core busy in both steps come first,
    so that a budget cut short keeps the likely winners."""
    dali = layout.dali_instances * layout.dali_threads
    classifier = layout.classifier_instances * layout.classifier_threads
    return abs(cores - dali) + abs(cores - classifier)


def batch_layouts(best: Layout, max_batch_size: int) -> list[Layout]:
    return [
        dataclasses.replace(best, classifier_batch=b)
        for b in BATCHES
        if b < max_batch_size and b != best.classifier_batch
    ]


# --- applying one to the running server ---


def step_configs(configs: list[dict], ensemble: str) -> tuple[dict, dict]:
    """The ensemble's DALI step and classifier step, as the server has them."""
    by_name = {config["name"]: config for config in configs}
    if ensemble not in by_name:
        raise ValueError(f"no loaded model {ensemble!r}; loaded: {', '.join(sorted(by_name))}")
    steps = [by_name[step["model_name"]] for step in by_name[ensemble]["ensemble_scheduling"]["step"]]
    dali = [step for step in steps if step.get("backend") == "dali"]
    classifier = [step for step in steps if step.get("backend") == "onnxruntime"]
    if len(dali) != 1 or len(classifier) != 1:
        raise ValueError(f"{ensemble}: tune sizes ensembles of one DALI step and one ONNX Runtime step")
    return dali[0], classifier[0]


def with_candidate(dali: dict, classifier: dict, layout: Layout) -> list[dict]:
    """The two steps' configs under `layout`, the DALI step's batch by the build's rule."""
    options = BuildOptions(max_batch_size=int(classifier["max_batch_size"]), classifier_batch=layout.classifier_batch)
    sized_dali = with_layout(dali, StepLayout(layout.dali_instances, layout.dali_threads))
    sized_classifier = with_layout(classifier, StepLayout(layout.classifier_instances, layout.classifier_threads))
    return [
        _with_preferred(sized_dali, options.first_step_preferred_batches),
        _with_preferred(sized_classifier, options.classifier_preferred_batches),
    ]


def _with_preferred(config: dict, batches: tuple[int, ...]) -> dict:
    batching = dict(config.get("dynamic_batching", {}))
    batching["preferred_batch_size"] = list(batches)
    return config | {"dynamic_batching": batching}


def layout_of(dali: dict, classifier: dict) -> Layout:
    """The layout the server has now (the repository's, or the launcher's for these cores)."""
    preferred = classifier.get("dynamic_batching", {}).get("preferred_batch_size", [])
    return Layout(
        int(dali["instance_group"][0]["count"]),
        int(dali.get("parameters", {}).get("num_threads", {}).get("string_value", 1)),
        int(classifier["instance_group"][0]["count"]),
        int(classifier.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value", 1)),
        int(preferred[0]) if preferred else 0,
    )


# --- measuring ---


def cpu_by_process(server) -> dict[int, float]:
    """CPU seconds of tritonserver and each of its processes, by PID."""
    processes = [psutil.Process(server.pid)]
    processes += processes[0].children(recursive=True)
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def cpu_seconds_since(server, before: dict[int, float]) -> float:
    """Per process, so that a stub of the layout before, ending meanwhile, takes none of
    its time away; one started meanwhile counts whole."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in cpu_by_process(server).items())


def measure(server, model: str, images: list[bytes], layout: Layout, settings: TuneSettings) -> Measured:
    cpu, url = cpu_by_process(server), url_for(server, settings.protocol)
    closed = asyncio.run(
        closed_loop(url, settings.protocol, model, images, settings.concurrency, settings.seconds, settings.warmup_s)
    )
    closed.server_cpu_s, closed.warmup_s = cpu_seconds_since(server, cpu), settings.warmup_s
    at_rate = {"rate_p99_ms": None}
    if settings.rate:
        opened = asyncio.run(
            open_loop(
                url,
                model,
                images,
                settings.rate,
                settings.rate_seconds,
                settings.warmup_s,
                POISSON_SEED,
                settings.protocol,
            )
        )
        at_rate = FAILED_AT_RATE if opened.errors else rate_figures([s * 1000 for s in opened.latencies_s])
    return Measured(
        layout=layout,
        images_per_s=closed.images_per_s,
        p99_ms=closed.percentile_ms(99),
        cpu_ms_per_image=1000 / closed.images_per_cpu_s if closed.images_per_cpu_s else None,
        errors=closed.errors,
        **at_rate,
    )


def summarized(results: Iterable[Measured]) -> list[Measured]:
    """One entry a layout, its figures the medians of its measurements (errors summed)
    but at --rate, where its open loops' latencies are pooled; in the order the layouts
    were first measured."""
    by_layout: dict[Layout, list[Measured]] = {}
    for result in results:
        by_layout.setdefault(result.layout, []).append(result)
    return [_median(layout, measured) for layout, measured in by_layout.items()]


def _median(layout: Layout, measured: list[Measured]) -> Measured:
    def median(name: str) -> float | None:
        return Median.of([getattr(result, name) for result in measured if getattr(result, name) is not None]).value

    return Measured(
        layout=layout,
        images_per_s=median("images_per_s"),
        p99_ms=median("p99_ms"),
        cpu_ms_per_image=median("cpu_ms_per_image"),
        errors=sum(result.errors for result in measured),
        measurements=len(measured),
        **_pooled_at_rate(measured),
    )


def _pooled_at_rate(measured: list[Measured]) -> dict:
    if all(result.rate_p99_ms is None for result in measured):
        return {"rate_p99_ms": None}
    if any(result.rate_p99_ms == float("inf") for result in measured):
        return FAILED_AT_RATE
    return rate_figures([latency for result in measured for latency in result.rate_latencies_ms])


def ranked(results: Iterable[Measured], settings: TuneSettings) -> list[Measured]:
    """The candidates without errors, best first under the objective: the most images/s
    (with `p99`, among those under the bound, then the others by their p99 at --rate)."""
    results = [result for result in summarized(results) if not result.errors]
    if settings.objective != "p99":
        return sorted(results, key=lambda result: -result.images_per_s)
    meeting = sorted((r for r in results if r.meets(settings.p99_ms)), key=lambda result: -result.images_per_s)
    return meeting + sorted((r for r in results if not r.meets(settings.p99_ms)), key=lambda r: r.rate_p99_ms)


def best(results: Iterable[Measured], settings: TuneSettings) -> Measured:
    leading = ranked(results, settings)
    if not leading:
        raise RuntimeError("every candidate failed requests: see the server's log")
    return leading[0]


def unmet_bound(results: Iterable[Measured], settings: TuneSettings) -> str | None:
    """Why no layout can be written for a p99 objective: none of the candidates met
    the bound at the rate (each side's reading, so the user can choose a lower rate or a
    looser bound); None when one did, or for the throughput objective."""
    if settings.objective != "p99":
        return None
    candidates = [result for result in summarized(results) if not result.errors]
    if any(result.meets(settings.p99_ms) for result in candidates):
        return None
    measured = [result for result in candidates if result.rate_p99_ms is not None]
    closest = min(measured, key=lambda result: result.rate_p99_ms, default=None)
    fastest = max(candidates, key=lambda result: result.images_per_s, default=None)
    reached = (
        f"the lowest p99 at {settings.rate:g}/s was {closest.rate_p99_ms:.0f} ms ({closest.layout.describe()})"
        if closest
        else "no candidate was measured at that rate"
    )
    capacity = (
        f"; the fastest candidate's capacity was {fastest.images_per_s:.1f} images/s, so the rate is "
        f"{settings.rate / fastest.images_per_s:.0%} of it"
        if fastest and fastest.images_per_s
        else ""
    )
    return (
        f"no layout keeps the p99 under {settings.p99_ms:g} ms at {settings.rate:g} requests/s on this "
        f"machine: {reached}{capacity}. Nothing was written: lower --rate, raise --p99-ms, or add cores"
    )


def pareto_front(results: list[Measured]) -> list[Measured]:
    """The candidates no other beats on both images/s and p99."""
    return [
        result
        for result in results
        if not any(
            other.images_per_s >= result.images_per_s
            and other.latency_ms <= result.latency_ms
            and (other.images_per_s, other.latency_ms) != (result.images_per_s, result.latency_ms)
            for other in results
        )
    ]


def search(
    server, model: str, images: list[bytes], cores: int, settings: TuneSettings, progress: Callable[[str], None]
) -> tuple[Layout, list[Measured]]:
    """The starting layout and every candidate measured, within the budget."""
    headers = server.admin_headers("http")
    dali, classifier = step_configs(loaded_configs(server.http_url, headers), model)
    start = layout_of(dali, classifier)
    deadline = time.monotonic() + settings.budget_s
    results: list[Measured] = []
    # A fresh server's first phase measured about 10 % below the same layout's repeats
    # (2-core AMD EPYC): warm it once for a share of the budget, before anything counts.
    asyncio.run(
        closed_loop(
            url_for(server, settings.protocol),
            settings.protocol,
            model,
            images,
            settings.concurrency,
            min(FIRST_WARMUP_S, settings.budget_s * FIRST_WARMUP_SHARE),
            0.0,
        )
    )

    serving = [dali, classifier]  # the steps' configs the server has loaded now

    def run(layouts: list[Layout], times: int = 1) -> bool:
        """Measure each layout until it has `times` measurements; False once the budget is spent."""
        nonlocal serving
        for layout in layouts:
            if sum(result.layout == layout for result in results) >= times:
                continue
            if time.monotonic() + settings.seconds_per_candidate > deadline:
                progress(f"budget spent: {len(results)} measurement(s)")
                return False
            if settings.max_measurements is not None and len(results) >= settings.max_measurements:
                progress(f"--max-measurements reached: {len(results)} measurement(s)")
                return False
            candidate = with_candidate(dali, classifier, layout)
            if candidate != serving:  # a reload restarts the steps' stubs: only for another config
                load_overrides(server.http_url, headers, candidate)
                serving = candidate
            results.append(measure(server, model, images, layout, settings))
            progress(_line(results[-1]))
        return True

    try:
        if run([start, *thread_layouts(cores, start.classifier_batch)]) and results:
            if run(batch_layouts(best(results, settings).layout, int(classifier["max_batch_size"]))):
                for times in range(2, REPEATS + 1):
                    leading = [result.layout for result in ranked(results, settings)[:LEADING]]
                    if not run(leading, times):
                        break
    except KeyboardInterrupt:
        progress(f"interrupted: the best of {len(results)} measurement(s) so far")
    return start, results


def _line(result: Measured) -> str:
    rate = (
        f", p99 at rate {result.rate_p99_ms:.0f} ms (upper bound {result.rate_p99_bound_ms:.0f})"
        if result.rate_p99_ms is not None
        else ""
    )
    cpu = f", {result.cpu_ms_per_image:.1f} CPU ms/image" if result.cpu_ms_per_image else ""
    return f"{result.layout.describe()}: {result.images_per_s:.1f} images/s, p99 {result.p99_ms:.0f} ms{cpu}{rate}"
