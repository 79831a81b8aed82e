#!/usr/bin/env python3
"""One benchmark of the serving stack, as ratios measured side by side in one run.

    python loadtests/benchmark.py --quick --out reports/benchmark.json

It starts its own tritonserver on loopback and writes (see README, "Performance"):
inprocess_images_per_s, server_images_per_s, serving_efficiency,
dali_preprocess_images_per_s, pil_preprocess_images_per_s, dali_vs_pil_preprocess,
dali_vs_pil_per_cpu_second, dali_vs_pil_ensemble, ensemble_overhead_ms_p50,
p99_over_p50, http_vs_grpc, server_rss_mb, errors, versions, CPU model and cores;
ensemble_overhead_share, capacity_at_slo, int8_vs_fp32_ensemble, int8_top1_agreement,
int8_top5_overlap (and both `_crops`, on a wider corpus); on a server it started
itself, ensemble_trace_ms_p50 (where a single request's time goes, from Triton's
trace: loadtests/trace.py).

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
import json
import os
import platform
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the project importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import psutil  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from nvidia.dali import Pipeline  # noqa: E402

from loadtests import soak  # noqa: E402
from loadtests.corpus import WeightedSampler, build_corpus  # noqa: E402
from tritonstack.client.aio import AsyncClassifierClient  # noqa: E402
from tritonstack.client.classifier import ClassifierClient  # noqa: E402
from loadtests.target import GivenServer, given_endpoints, server_processes, target_server  # noqa: E402
from loadtests.trace import read_traces, request_hops, trace_args, traced  # noqa: E402
from tritonstack import cli  # noqa: E402
from tritonstack.build.parity import compare_classifiers, crop_images  # noqa: E402
from tritonstack.client.preflight import check_model  # noqa: E402
from tritonstack.client.retry import NO_RETRY, RetryPolicy  # noqa: E402
from tritonstack.contract import admin_headers, pad_batch  # noqa: E402
from tritonstack.serve.launcher import TritonServer  # noqa: E402
from tritonstack.rules.repository import unservable_reason  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = "efficientnet_lite0"
DALI_PREPROCESS = f"preprocess_dali_{CLASSIFIER}"
PIL_PREPROCESS = f"preprocess_python_{CLASSIFIER}"
DALI_ENSEMBLE = f"ensemble_dali_{CLASSIFIER}"
PIL_ENSEMBLE = f"ensemble_python_{CLASSIFIER}"
DALI_PRESET = f"dali_{CLASSIFIER}"
INT8_PRESET = f"dali_{CLASSIFIER}_int8"
INT8_ENSEMBLE = f"ensemble_{INT8_PRESET}"
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    """How long each phase measures; warm-up runs before every measurement."""

    seconds: float  # per measured closed-loop phase
    warmup_s: float
    concurrency: tuple[int, ...]  # in-flight requests tried for saturation
    inprocess_grid: tuple[tuple[int, int, int], ...]  # (batch, DALI threads, ORT threads)
    open_loop_s: float
    repeats: int = 3  # interleaved rounds per ratio (at least 3: a median and a spread)
    capacity_probes: int = 4  # bisection steps after the first probe at the upper bound
    capacity_s: float = 8.0  # per capacity probe
    traced_requests: int = 100  # at concurrency 1 with Triton's tracing on


FULL = Settings(20.0, 3.0, (8, 16, 32, 48), ((1, 1, 1), (8, 1, 1), (32, 1, 1), (8, 2, 1), (8, 1, 2), (32, 2, 2)),
                30.0, repeats=5, capacity_probes=6, capacity_s=20.0, traced_requests=300)
QUICK = Settings(5.0, 1.0, (8, 24), ((8, 1, 1), (32, 1, 1), (8, 2, 2)), 10.0, repeats=3, capacity_probes=4,
                 capacity_s=6.0)
# For the test suite: every key, in the least time that still measures something.
SMOKE = Settings(1.0, 0.3, (4,), ((8, 2, 2),), 1.5, repeats=3, capacity_probes=1, capacity_s=1.0)
# capacity_at_slo: the p99 budget, in single-request medians, and the search's upper bound.
SLO_P50_MULTIPLE = 8.0
# p99_over_p50 is measured at this fraction of saturation.
OPEN_LOOP_LOAD = 0.7
CAPACITY_MAX_FRACTION = 1.1


@dataclass
class Phase:
    """One measured load: latencies of successful requests, failures, duration."""

    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None  # warm-up included
    warmup_s: float | None = None  # set with server_cpu_s
    images: int | None = None  # when not one per latency (the in-process reference)
    offered_rate: float | None = None  # an open loop's requests/s

    @property
    def images_per_s(self) -> float:
        done = len(self.latencies_s) if self.images is None else self.images
        return done / self.seconds if self.seconds else 0.0

    @property
    def images_per_cpu_s(self) -> float | None:
        """Images per second of server CPU; the CPU covers warm-up, so the images
        of the same window count (at the measured rate)."""
        if not self.server_cpu_s or self.warmup_s is None:
            return None
        return self.images_per_s * (self.seconds + self.warmup_s) / self.server_cpu_s

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1000 if self.latencies_s else float("nan")


# ---------------------------------------------------------------- in process


def inprocess_best_setting(repository: Path, images: list[bytes], settings: Settings) -> dict:
    """The thread/batch setting of the grid with the best in-process rate."""
    rates = {setting: _inprocess_run(repository, images, *setting, settings).images_per_s
             for setting in settings.inprocess_grid}
    batch, dali_threads, ort_threads = max(rates, key=rates.get)
    return {"batch": batch, "dali_threads": dali_threads, "ort_threads": ort_threads}


def inprocess_phase(repository: Path, images: list[bytes], setting: dict, settings: Settings) -> Phase:
    """The same model.dali and model.onnx in this process, DALI and ONNX Runtime in
    two threads (both release the GIL), as the server overlaps its two models."""
    return _inprocess_run(repository, images, setting["batch"], setting["dali_threads"], setting["ort_threads"],
                          settings)


def _inprocess_run(repository, images, batch, dali_threads, ort_threads, settings) -> Phase:
    pipeline = Pipeline.deserialize(
        serialized_pipeline=(repository / DALI_PREPROCESS / "1" / "model.dali").read_bytes(),
        batch_size=batch, num_threads=dali_threads, device_id=None, prefetch_queue_depth=1,
    )
    pipeline.build()
    options = ort.SessionOptions()
    options.intra_op_num_threads = ort_threads
    session = ort.InferenceSession(str(repository / CLASSIFIER / "1" / "model.onnx"), options,
                                   providers=ort.get_available_providers())  # CUDA first where installed
    batches = [pad_batch([images[(start + i) % len(images)] for i in range(batch)])
               for start in range(0, len(images), batch)]
    handoff: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def preprocess():
        index = 0
        while not stop.is_set():
            pipeline.feed_input("DALI_INPUT_0", list(batches[index % len(batches)]))
            (output,) = pipeline.run()
            handoff.put(np.asarray(output.as_tensor()))
            index += 1
        handoff.put(None)

    producer = threading.Thread(target=preprocess, daemon=True)
    producer.start()
    done, started = 0, None
    deadline = time.perf_counter() + settings.warmup_s + settings.seconds
    # Past the deadline still until two batches were timed: a loaded machine must
    # not leave the phase empty (a rate of 0 and a ratio that divides by it).
    while time.perf_counter() < deadline or done < 2 * batch:
        session.run(None, {"input": handoff.get()})
        if started is None and time.perf_counter() > deadline - settings.seconds:
            started = time.perf_counter()  # warm-up over: count from here
        elif started is not None:
            done += batch
    stop.set()
    while handoff.get() is not None:
        pass
    producer.join()
    return Phase(images=done, seconds=time.perf_counter() - started)


# ---------------------------------------------------------------- through the server


async def closed_loop(url: str, protocol: str, model: str, images: list[bytes], concurrency: int,
                      seconds: float, warmup_s: float) -> Phase:
    """`concurrency` requests always in flight, one image each, for `seconds` after warm-up."""
    phase = Phase()
    async with AsyncClassifierClient(url, protocol, model, retry=NO_RETRY, timeout_s=REQUEST_TIMEOUT_S) as client:
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        end = measure_from + seconds

        async def worker(offset: int):
            index = offset
            while loop.time() < end:
                image = images[index % len(images)]
                index += concurrency
                sent = loop.time()
                try:
                    await client.probabilities([image])
                    ok = True
                except Exception:
                    ok = False
                if sent >= measure_from and loop.time() <= end:
                    if ok:
                        phase.latencies_s.append(loop.time() - sent)
                    else:
                        phase.errors += 1

        cpu = time.process_time()
        await asyncio.gather(*(worker(offset) for offset in range(concurrency)))
        phase.seconds = seconds
        phase.client_cpu_s = time.process_time() - cpu
    return phase


async def open_loop(url: str, model: str, images: list[bytes], rate: float, seconds: float, warmup_s: float,
                    poisson_seed: int | None = None) -> Phase:
    """Requests sent at a fixed rate whatever the answers do; latency counts from the
    scheduled send time (no coordinated omission). With `poisson_seed`, the gaps
    between sends are exponential (Poisson arrivals at that mean rate) instead of equal."""
    phase = Phase(offered_rate=rate)
    total = max(int((warmup_s + seconds) * rate), 1)
    if poisson_seed is None:
        offsets = np.arange(total) / rate
    else:
        gaps = np.random.default_rng(poisson_seed).exponential(1 / rate, total)
        offsets = np.cumsum(gaps) - gaps[0]  # the first request at once, as with equal gaps
    async with AsyncClassifierClient(url, "grpc", model, retry=NO_RETRY, timeout_s=REQUEST_TIMEOUT_S) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        measure_from = start + warmup_s

        async def one(scheduled: float, image: bytes):
            try:
                await client.probabilities([image])
            except Exception:
                if scheduled >= measure_from:
                    phase.errors += 1
                return
            if scheduled >= measure_from:
                phase.latencies_s.append(loop.time() - scheduled)

        tasks = []
        for index in range(total):
            scheduled = start + float(offsets[index])
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            tasks.append(asyncio.create_task(one(scheduled, images[index % len(images)])))
        await asyncio.gather(*tasks)
        phase.seconds = seconds
    return phase


def saturate(url: str, protocol: str, model: str, images: list[bytes], settings: Settings) -> tuple[Phase, int, int]:
    """The best throughput over the concurrency levels tried, that level, and the
    failures of all levels."""
    phases = {
        concurrency: asyncio.run(closed_loop(url, protocol, model, images, concurrency,
                                             settings.seconds, settings.warmup_s))
        for concurrency in settings.concurrency
    }
    best = max(phases, key=lambda concurrency: phases[concurrency].images_per_s)
    return phases[best], best, sum(phase.errors for phase in phases.values())


def server_cpu_seconds(server) -> float:
    """CPU time of tritonserver and its backend stubs so far."""
    total = 0.0
    for process in server_processes(server):
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def server_rss_mb_by_process(server) -> dict[str, float] | None:
    """RSS of tritonserver and of each model's stub, by role (what a model costs)."""
    if server.pid is None:
        return None
    named = {}
    for name, process in soak.server_processes(server.pid).items():
        try:
            named[name] = process.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return named


def server_rss_mb(server) -> float | None:
    processes = server_processes(server)
    if not processes:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def measured_phase(server, protocol: str, model: str, images: list[bytes], concurrency: int,
                   settings: Settings) -> Phase:
    """One closed-loop phase on `model`, with the server's CPU time over it."""
    cpu = server_cpu_seconds(server)
    url = server.http_url if protocol == "http" else server.grpc_url
    phase = asyncio.run(closed_loop(url, protocol, model, images, concurrency, settings.seconds, settings.warmup_s))
    phase.server_cpu_s, phase.warmup_s = server_cpu_seconds(server) - cpu, settings.warmup_s
    return phase


def interleaved(measures: dict[str, Callable[[], Phase]], repeats: int, log=print) -> dict[str, list[Phase]]:
    """Each measure once per round, in the same order, `repeats` rounds: A, B, A, B...
    so that a machine that slows down or speeds up during the run moves both sides
    of a ratio alike."""
    rounds: dict[str, list[Phase]] = {name: [] for name in measures}
    for round_index in range(repeats):
        log(f"  round {round_index + 1}/{repeats}: {', '.join(measures)}")
        for name, measure in measures.items():
            rounds[name].append(measure())
    return rounds


def ratios(numerators: list[float | None], denominators: list[float | None]) -> list[float]:
    """Per round; a round with an empty or unmeasurable side gives no ratio."""
    return [a / b for a, b in zip(numerators, denominators) if a is not None and b]


def write_median(results: dict, key: str, values: list[float]) -> None:
    """`key` = the median of `values`, `<key>_spread` = [min, max]; None for both
    when nothing was measured."""
    results[key] = float(np.median(values)) if values else None
    results[f"{key}_spread"] = [float(min(values)), float(max(values))] if values else None


@dataclass
class SingleRequests:
    """Concurrency 1, one image over and over: per request, the client's latency
    and where Triton says the time went (its statistics API, read before and after
    each request)."""

    phase: Phase
    hops_ms: dict[str, list[float]]

    @property
    def overhead_ms_p50(self) -> float | None:
        """Client latency minus the compute (input + infer + output) of the steps."""
        return float(np.median(self.hops_ms["overhead"])) if self.hops_ms.get("overhead") else None

    @property
    def overhead_share(self) -> float | None:
        """The overhead over the single-request latency, medians of both."""
        latency = self.phase.percentile_ms(50)
        return self.overhead_ms_p50 / latency if self.overhead_ms_p50 is not None and latency > 0 else None


# Per request (ms): "overhead" = client latency - the steps' compute (input + infer
# + output), as issue 5 defined it; "outside_server" = latency - the ensemble's
# request time in Triton (gRPC, protobuf, network stack, our client);
# "in_server_outside_compute" = the ensemble's request time - the steps' compute
# (queues, the ensemble scheduler, the handoff between steps). Then each step's own
# queue and compute parts, as "<step>.<part>".
HOPS = ("overhead", "outside_server", "in_server_outside_compute")
STEP_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")
COMPUTE_PARTS = ("compute_input", "compute_infer", "compute_output")


def single_requests(server, model: str, steps: tuple[str, ...], image: bytes, seconds: float,
                    warmup_s: float) -> SingleRequests:
    measured = SingleRequests(Phase(), {})
    headers = server.admin_headers("grpc")  # the statistics API is restricted
    with ClassifierClient(server.grpc_url, "grpc", model, retry=NO_RETRY,
                          timeout_s=REQUEST_TIMEOUT_S) as client, \
            grpcclient.InferenceServerClient(server.grpc_url) as statistics:
        measure_from = time.monotonic() + warmup_s
        end = measure_from + seconds
        while time.monotonic() < end or not measured.phase.latencies_s:
            before = request_statistics(statistics, headers, (model, *steps))
            sent = time.perf_counter()
            try:
                client.probabilities([image])
            except Exception:
                measured.phase.errors += time.monotonic() >= measure_from
                continue
            latency = time.perf_counter() - sent
            if time.monotonic() >= measure_from:
                measured.phase.latencies_s.append(latency)
                after = request_statistics(statistics, headers, (model, *steps))
                spent = {key: (after[key] - before[key]) / 1e6 for key in after}
                for hop, value in hop_costs(latency * 1000, spent, model, steps).items():
                    measured.hops_ms.setdefault(hop, []).append(value)
    measured.phase.seconds = seconds
    return measured


def hop_costs(latency_ms: float, spent_ms: dict[tuple[str, str], float], model: str,
              steps: tuple[str, ...]) -> dict[str, float]:
    compute = sum(spent_ms[(step, part)] for step in steps for part in COMPUTE_PARTS)
    return {
        "overhead": latency_ms - compute,
        "outside_server": latency_ms - spent_ms[(model, "success")],
        "in_server_outside_compute": spent_ms[(model, "success")] - compute,
        **{f"{step}.{part}": spent_ms[(step, part)] for step in steps for part in STEP_PARTS},
    }


def grpc_round_trip_ms(server, count: int = 200) -> float:
    """The floor of any gRPC call from this client: median of `count` is_server_live
    calls (no tensor, no model), to compare with "outside_server"."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.is_server_live()  # connect first
        durations = []
        for _ in range(count):
            sent = time.perf_counter()
            client.is_server_live()
            durations.append(time.perf_counter() - sent)
    return float(np.median(durations)) * 1000


def traced_single_requests(server, count: int) -> list[tuple[int, int]]:
    """`count` requests at concurrency 1 with Triton's tracing on: the client's
    (sent, received) CLOCK_MONOTONIC ns of each, to match with the trace file."""
    times = []
    with ClassifierClient(server.grpc_url, "grpc", DALI_ENSEMBLE, retry=NO_RETRY,
                          timeout_s=REQUEST_TIMEOUT_S) as client:
        image = typical_image()
        client.probabilities([image])  # the connection's first request, untraced
        with traced(server.grpc_url, server.admin_headers("grpc"), DALI_ENSEMBLE, count):
            for _ in range(count):
                sent = time.monotonic_ns()
                client.probabilities([image])
                times.append((sent, time.monotonic_ns()))
    return times


def trace_medians(trace_file: Path, client_times: list[tuple[int, int]]) -> dict[str, float] | None:
    """Median ms of each part of a request (loadtests/trace.py), and how many were matched."""
    hops = request_hops(read_traces(trace_file), client_times, DALI_ENSEMBLE, (DALI_PREPROCESS, CLASSIFIER))
    if not hops["steps_compute"]:
        return None
    return {part: float(np.median(values)) for part, values in hops.items()} | {
        "requests": len(hops["steps_compute"])}


def request_statistics(statistics, headers: dict[str, str], models: tuple[str, ...]) -> dict[tuple[str, str], int]:
    """Cumulative ns per (model, part) so far: success (whole request), queue, compute_*."""
    spent = {}
    for model in models:
        stats = statistics.get_inference_statistics(model, headers=headers, as_json=True)
        stats = stats["model_stats"][0]["inference_stats"]
        for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            spent[(model, part)] = int(stats.get(part, {}).get("ns", 0))
    return spent


# ---------------------------------------------------------------- the run


def versions(server: TritonServer) -> dict:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(server.http_url) as client:
        server_version = client.get_server_metadata()["version"]
    packages = ("nvidia-dali-cuda120", "onnxruntime", "tritonclient", "nvidia-pytriton", "locust", "numpy", "pillow")
    return {
        "tritonserver": server_version,
        "python": platform.python_version(),
        **{package: metadata.version(package) for package in packages},
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run(settings: Settings, repository: Path, log=print, server: TritonServer | GivenServer | None = None) -> dict:
    """All measurements; on `server` if given (it must serve `repository`), else on
    a server started and stopped here."""
    images = weighted_images(400)
    results: dict = {"settings": settings.__dict__ | {"quick": settings is QUICK}, "cpu_model": cpu_model(),
                     "cpu_count": os.cpu_count()}
    log("in-process reference (DALI + ONNX Runtime, no server): the best thread/batch setting...")
    setting = results["inprocess_best_setting"] = inprocess_best_setting(repository, images, settings)
    with tempfile.TemporaryDirectory(prefix="benchmark-") as folder:
        trace_file = Path(folder) / "trace.json"
        client_times = _run_on_server(results, settings, repository, images, setting, log, server, trace_file)
        # The server has stopped: its trace file is complete.
        results["ensemble_trace_ms_p50"] = trace_medians(trace_file, client_times) if client_times else None
    log("INT8 vs FP32 classifier on the parity corpus (in process)...")
    _write_int8_agreement(results, repository)
    return results


def _run_on_server(results: dict, settings: Settings, repository: Path, images: list[bytes], setting: dict, log,
                   server, trace_file: Path) -> list[tuple[int, int]]:
    """Every measurement through a server; the client's times of the traced
    requests (none on a given server: its trace file, if any, is not ours)."""
    own = server is None
    with contextlib.nullcontext(server) if server else target_server(repository, extra_args=trace_args(trace_file)) \
            as server:
        results["versions"] = versions(server)
        log("DALI ensemble over gRPC: the concurrency that saturates it...")
        _, concurrency, errors = saturate(server.grpc_url, "grpc", DALI_ENSEMBLE, images, settings)
        results["server_best_concurrency"] = concurrency
        log(f"interleaved rounds at concurrency {concurrency} (preprocessing alone at {max(settings.concurrency)})...")
        rounds = interleaved(_round_measures(server, repository, images, setting, concurrency, settings),
                             settings.repeats, log)
        errors += sum(phase.errors for phases in rounds.values() for phase in phases)
        _write_rounds(results, rounds, settings)
        results["server_rss_mb"] = server_rss_mb(server)  # right after the rounds: steady state
        results["server_rss_mb_by_process"] = server_rss_mb_by_process(server)
        log("single requests (concurrency 1): latency and where it goes...")
        errors += _write_single_requests(results, server, settings)
        errors += _write_open_loop(results, server, images, settings, log)
        errors += _write_capacity(results, server, images, settings, log)
        results["errors"] = errors
        return traced_single_requests(server, settings.traced_requests) if own else []


def _round_measures(server, repository: Path, images: list[bytes], setting: dict, concurrency: int,
                    settings: Settings) -> dict[str, Callable[[], Phase]]:
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
        measures["int8_ensemble"] = lambda: measured_phase(server, "grpc", INT8_ENSEMBLE, images, concurrency,
                                                           settings)
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
    "inprocess_images_per_s": "inprocess", "server_images_per_s": "grpc", "http_images_per_s": "http",
    "pil_ensemble_images_per_s": "pil_ensemble", "dali_preprocess_images_per_s": "dali_preprocess",
    "pil_preprocess_images_per_s": "pil_preprocess", "int8_ensemble_images_per_s": "int8_ensemble",
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
    results["client_cpu_share"] = float(np.median([phase.client_cpu_s / (settings.seconds + settings.warmup_s)
                                                   for phase in rounds["grpc"]]))


def _write_single_requests(results: dict, server, settings: Settings) -> int:
    """`repeats` phases at concurrency 1; returns their failures."""
    measured = [single_requests(server, DALI_ENSEMBLE, (DALI_PREPROCESS, CLASSIFIER), typical_image(),
                                settings.seconds, settings.warmup_s) for _ in range(settings.repeats)]
    write_median(results, "ensemble_overhead_ms_p50", [m.overhead_ms_p50 for m in measured if m.overhead_ms_p50 is not None])
    write_median(results, "ensemble_overhead_share", [m.overhead_share for m in measured if m.overhead_share is not None])
    write_median(results, "latency_ms_p50_concurrency_1", [m.phase.percentile_ms(50) for m in measured
                                                           if m.phase.latencies_s])
    results["grpc_round_trip_ms_p50"] = grpc_round_trip_ms(server)
    hops = {hop: [value for m in measured for value in m.hops_ms.get(hop, [])] for hop in measured[0].hops_ms}
    results["ensemble_hops_ms_p50"] = {hop: float(np.median(values)) for hop, values in hops.items() if values}
    return sum(m.phase.errors for m in measured)


def current_saturation(server, images: list[bytes], concurrency: int, settings: Settings) -> Phase:
    """The ensemble's closed-loop rate now. An open loop's rate is set from the
    saturation measured just before it: this machine's speed drifts by 10-25 % within
    minutes, and at 70 % of a stale saturation the real load can be 80 %, where the
    tail is twice as long."""
    return asyncio.run(closed_loop(server.grpc_url, "grpc", DALI_ENSEMBLE, images, concurrency,
                                   settings.seconds, settings.warmup_s))


def _write_open_loop(results: dict, server, images: list[bytes], settings: Settings, log) -> int:
    """p99/p50 at OPEN_LOOP_LOAD of the saturation measured right before, equal
    gaps, `repeats` times; returns failures."""
    log(f"open loop at {OPEN_LOOP_LOAD:.0%} of saturation (measured before each), {settings.repeats} times...")
    phases, errors = [], 0
    for _ in range(settings.repeats):
        saturation = current_saturation(server, images, results["server_best_concurrency"], settings)
        rate = OPEN_LOOP_LOAD * saturation.images_per_s or 1.0
        phases.append(asyncio.run(open_loop(server.grpc_url, DALI_ENSEMBLE, images, rate, settings.open_loop_s,
                                            settings.warmup_s)))
        errors += saturation.errors
    measured = [phase for phase in phases if phase.latencies_s]
    write_median(results, "open_loop_rate", [phase.offered_rate for phase in phases])
    write_median(results, "open_loop_ms_p50", [phase.percentile_ms(50) for phase in measured])
    write_median(results, "open_loop_ms_p99", [phase.percentile_ms(99) for phase in measured])
    write_median(results, "p99_over_p50", [phase.percentile_ms(99) / phase.percentile_ms(50) for phase in measured])
    return errors + sum(phase.errors for phase in phases)


def _write_capacity(results: dict, server, images: list[bytes], settings: Settings, log) -> int:
    single_p50 = results["latency_ms_p50_concurrency_1"]
    if not results["server_images_per_s"] or not single_p50:
        results["capacity_at_slo"], results["capacity_probes"] = None, []
        return 0
    slo_ms = results["capacity_slo_ms"] = SLO_P50_MULTIPLE * single_p50
    log(f"capacity: the highest Poisson rate whose p99 stays under {slo_ms:.1f} ms...")
    fraction, probes = capacity_at_slo(server, images, results["server_best_concurrency"], slo_ms, settings)
    results["capacity_at_slo"], results["capacity_probes"] = fraction, probes
    return sum(probe["errors"] for probe in probes)


def capacity_at_slo(server, images: list[bytes], concurrency: int, slo_ms: float,
                    settings: Settings) -> tuple[float, list[dict]]:
    """The highest fraction of closed-loop saturation (at `concurrency`, measured
    right before each probe) whose open loop (Poisson arrivals) keeps p99 under
    `slo_ms` with no failure: the upper bound CAPACITY_MAX_FRACTION first, then a
    bisection of [0, bound] in `settings.capacity_probes` steps. Returns it and
    every probe."""
    probes: list[dict] = []

    def meets(fraction: float) -> bool:
        saturation = current_saturation(server, images, concurrency, settings)
        rate = fraction * saturation.images_per_s or 1.0
        phase = asyncio.run(open_loop(server.grpc_url, DALI_ENSEMBLE, images, rate,
                                      settings.capacity_s, settings.warmup_s, poisson_seed=len(probes)))
        p99 = phase.percentile_ms(99)
        met = phase.errors == 0 and bool(phase.latencies_s) and p99 < slo_ms
        probes.append({"fraction": fraction, "saturation": saturation.images_per_s, "rate": rate, "p99_ms": p99,
                       "errors": phase.errors + saturation.errors, "met": met})
        return met

    return highest_passing(meets, CAPACITY_MAX_FRACTION, settings.capacity_probes), probes


def highest_passing(meets: Callable[[float], bool], bound: float, steps: int) -> float:
    """`bound` if it passes, else a bisection of [0, bound] in `steps` probes: the
    highest passing value found (0 when none passed), within bound / 2**steps of
    the threshold when passing is monotonic."""
    if meets(bound):
        return bound
    low, high = 0.0, bound
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def _write_int8_agreement(results: dict, repository: Path) -> None:
    """Top-1 agreement and mean top-5 overlap of the INT8 classifier with FP32, both
    fed by the same DALI tensors: on the parity corpus (13 images), and on the
    stricter crop corpus (216 images, `_crops`). ImageNet accuracy is not measured here."""
    served = (repository / INT8_ENSEMBLE).is_dir()
    for suffix, images in (("", None), ("_crops", crop_images() if served else None)):
        report = compare_classifiers(repository, DALI_PRESET, INT8_PRESET, images) if served else None
        results[f"int8_top1_agreement{suffix}"] = report.top1_agreement if report else None
        results[f"int8_top5_overlap{suffix}"] = report.mean_top5_overlap if report else None


def typical_image() -> bytes:
    """The corpus's most common kind: a medium-size photo."""
    return next(image.data for image in build_corpus() if "@640" in image.name)


def weighted_images(count: int) -> list[bytes]:
    """`count` encoded images drawn from the load tests' weighted corpus, the same every run."""
    sampler = WeightedSampler(build_corpus(), seed=0)
    return [sampler.draw().data for _ in range(count)]


# Every key the benchmark promises (issues 5 and 14), besides versions and settings.
# Each of RATIO_KEYS comes with `<key>_spread`: [min, max] over the rounds.
RATIO_KEYS = (
    "serving_efficiency", "dali_vs_pil_preprocess", "dali_vs_pil_per_cpu_second", "dali_vs_pil_ensemble",
    "http_vs_grpc", "int8_vs_fp32_ensemble", "ensemble_overhead_ms_p50", "ensemble_overhead_share",
    "p99_over_p50",
)
REQUIRED_KEYS = (
    "inprocess_images_per_s", "server_images_per_s", "dali_preprocess_images_per_s", "pil_preprocess_images_per_s",
    *RATIO_KEYS, *(f"{key}_spread" for key in RATIO_KEYS),
    "capacity_at_slo", "int8_top1_agreement", "int8_top5_overlap",
    "int8_top1_agreement_crops", "int8_top5_overlap_crops",
    # what loadtests/plan.py reads
    "latency_ms_p50_concurrency_1", "open_loop_rate", "open_loop_ms_p50", "open_loop_ms_p99",
    "server_rss_mb", "errors", "versions", "cpu_model", "cpu_count",
)

TARGETS = {
    "serving_efficiency": (">=", 0.90),
    "dali_vs_pil_preprocess": (">=", 1.5),
    "ensemble_overhead_ms_p50": ("<=", 1.0),
    "ensemble_overhead_share": ("<=", 0.04),
    "p99_over_p50": ("<=", 2.2),
    "capacity_at_slo": (">=", 0.85),
    "int8_vs_fp32_ensemble": (">=", 1.5),
    "int8_top1_agreement": (">=", 0.95),
    "int8_top5_overlap": (">=", 4.5),
    "server_rss_mb": ("<=", 2048),
    "errors": ("<=", 0),
}


def missed_targets(results: dict) -> list[str]:
    missed = []
    for key, (sense, target) in TARGETS.items():
        value = results[key]
        if value is None:  # not measurable here (a server on another host)
            continue
        if (sense == ">=" and value < target) or (sense == "<=" and value > target):
            missed.append(f"{key} = {value:.4g} (target {sense} {target})")
    return missed


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(benchmark, argv)


def benchmark(argv: list[str] | None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases: at most 4 minutes on 2 cores")
    parser.add_argument("--smoke", action="store_true", help="shortest phases (tests): every key, rough figures")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--model-repository", type=Path, default=PROJECT_ROOT / "model_repository",
                        help="what the server serves; model.dali and model.onnx for the in-process reference")
    running = parser.add_argument_group("a running server instead of starting one (e.g. the NGC container)")
    running.add_argument("--url", help="HTTP host:port (or http://host:port)")
    running.add_argument("--grpc-url", help="gRPC host:port (or grpc://host:port; default: --url's host:port)")
    running.add_argument("--metrics-url", help="host:port or http://host:port/metrics")
    running.add_argument("--server-pid", type=int, help="tritonserver's process id on this host, for CPU and memory")
    args = parser.parse_args(argv)
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
    results = run(settings, args.model_repository.resolve(), log=lambda text: print(text, flush=True), server=server)
    results["benchmark_seconds"] = time.monotonic() - started
    print(write_results(results, args.out))
    return 0 if results["errors"] == 0 else 1


def write_results(results: dict, out: Path) -> str:
    """Add the missed targets, write the JSON file, return its text."""
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise KeyError(f"benchmark results lack {missing}")
    results["missed_targets"] = missed_targets(results)
    text = json.dumps(results, indent=2, default=float) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
