#!/usr/bin/env python3
"""One benchmark of the serving stack, as ratios measured side by side in one run.

    python loadtests/benchmark.py --quick --out reports/benchmark.json

It starts its own tritonserver on loopback and writes (see README, "Performance"):
inprocess_images_per_s, server_images_per_s, serving_efficiency,
dali_preprocess_images_per_s, pil_preprocess_images_per_s, dali_vs_pil_preprocess,
dali_vs_pil_per_cpu_second, dali_vs_pil_ensemble, ensemble_overhead_ms_p50,
p99_over_p50, http_vs_grpc, server_rss_mb, errors, versions, CPU model and cores.

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
import threading
import time
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

from loadtests.corpus import WeightedSampler, build_corpus  # noqa: E402
from tritonstack.client.aio import AsyncClassifierClient  # noqa: E402
from tritonstack.client.classifier import ClassifierClient  # noqa: E402
from loadtests.target import GivenServer, given_endpoints, server_processes, target_server  # noqa: E402
from tritonstack import cli  # noqa: E402
from tritonstack.client.preflight import check_model  # noqa: E402
from tritonstack.client.retry import NO_RETRY, RetryPolicy  # noqa: E402
from tritonstack.contract import admin_headers, pad_batch  # noqa: E402
from tritonstack.serve.launcher import TritonServer  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = "efficientnet_lite0"
DALI_PREPROCESS = f"preprocess_dali_{CLASSIFIER}"
PIL_PREPROCESS = f"preprocess_python_{CLASSIFIER}"
DALI_ENSEMBLE = f"ensemble_dali_{CLASSIFIER}"
PIL_ENSEMBLE = f"ensemble_python_{CLASSIFIER}"
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    """How long each phase measures; warm-up runs before every measurement."""

    seconds: float  # per saturation phase
    warmup_s: float
    concurrency: tuple[int, ...]  # in-flight requests tried for saturation
    inprocess_grid: tuple[tuple[int, int, int], ...]  # (batch, DALI threads, ORT threads)
    open_loop_s: float


FULL = Settings(30.0, 5.0, (8, 16, 32, 48), ((1, 1, 1), (8, 1, 1), (32, 1, 1), (8, 2, 1), (8, 1, 2), (32, 2, 2)), 60.0)
QUICK = Settings(8.0, 2.0, (8, 24), ((8, 1, 1), (32, 1, 1), (8, 2, 2)), 15.0)
# For the test suite: every key, in the least time that still measures something.
SMOKE = Settings(2.0, 0.5, (4,), ((8, 2, 2),), 3.0)


@dataclass
class Phase:
    """One measured load: latencies of successful requests, failures, duration."""

    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def images_per_s(self) -> float:
        return len(self.latencies_s) / self.seconds if self.seconds else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q)) * 1000 if self.latencies_s else float("nan")


# ---------------------------------------------------------------- in process


def inprocess_images_per_s(repository: Path, images: list[bytes], settings: Settings) -> tuple[float, dict]:
    """The same model.dali and model.onnx in this process, DALI and ONNX Runtime in
    two threads (both release the GIL), as the server overlaps its two models.
    Returns the best rate over the thread/batch grid and that setting."""
    best, best_setting = 0.0, {}
    for batch, dali_threads, ort_threads in settings.inprocess_grid:
        rate = _inprocess_run(repository, images, batch, dali_threads, ort_threads, settings)
        if rate > best:
            best, best_setting = rate, {"batch": batch, "dali_threads": dali_threads, "ort_threads": ort_threads}
    return best, best_setting


def _inprocess_run(repository, images, batch, dali_threads, ort_threads, settings) -> float:
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
    while time.perf_counter() < deadline:
        session.run(None, {"input": handoff.get()})
        if started is None and time.perf_counter() > deadline - settings.seconds:
            started = time.perf_counter()  # warm-up over: count from here
        elif started is not None:
            done += batch
    stop.set()
    while handoff.get() is not None:
        pass
    producer.join()
    return done / (time.perf_counter() - started) if started else 0.0


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


async def open_loop(url: str, model: str, images: list[bytes], rate: float, seconds: float, warmup_s: float) -> Phase:
    """Requests sent at a fixed rate whatever the answers do; latency counts from the
    scheduled send time (no coordinated omission)."""
    phase = Phase()
    async with AsyncClassifierClient(url, "grpc", model, retry=NO_RETRY, timeout_s=REQUEST_TIMEOUT_S) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()
        measure_from = start + warmup_s
        total = int((warmup_s + seconds) * rate)

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
            scheduled = start + index / rate
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


def preprocess_rate(server: TritonServer, model: str, images: list[bytes],
                    settings: Settings) -> tuple[Phase, float | None, int]:
    """A preprocessing model alone at saturation (best over the concurrency levels):
    its throughput, images per second of server CPU, failures of all levels."""
    best, best_per_cpu, errors = None, 0.0, 0
    for concurrency in settings.concurrency:
        cpu = server_cpu_seconds(server)
        phase = asyncio.run(closed_loop(server.grpc_url, "grpc", model, images, concurrency,
                                        settings.seconds, settings.warmup_s))
        used = server_cpu_seconds(server) - cpu
        errors += phase.errors
        # CPU time covers warm-up too: count the images of the same window.
        images_in_window = phase.images_per_s * (settings.seconds + settings.warmup_s)
        if best is None or phase.images_per_s > best.images_per_s:
            best, best_per_cpu = phase, (images_in_window / used if used else None)
    return best, best_per_cpu, errors


def ensemble_overhead_ms(server, image: bytes, settings: Settings) -> tuple[float, Phase]:
    """At concurrency 1, per request: client latency minus the compute time of the
    ensemble's steps for that request (Triton's statistics API, read before and
    after each request); the median of that.

    One image over and over, so every request does the same work."""
    phase, overheads = Phase(), []
    headers = server.admin_headers("grpc")  # the statistics API is restricted
    with ClassifierClient(server.grpc_url, "grpc", DALI_ENSEMBLE, retry=NO_RETRY,
                          timeout_s=REQUEST_TIMEOUT_S) as client, \
            grpcclient.InferenceServerClient(server.grpc_url) as statistics:
        measure_from = time.monotonic() + settings.warmup_s
        end = measure_from + settings.seconds
        while time.monotonic() < end:
            compute_before = steps_compute_ns(statistics, headers)
            sent = time.perf_counter()
            try:
                client.probabilities([image])
            except Exception:
                phase.errors += time.monotonic() >= measure_from
                continue
            latency = time.perf_counter() - sent
            if time.monotonic() >= measure_from:
                phase.latencies_s.append(latency)
                overheads.append(latency * 1000 - (steps_compute_ns(statistics, headers) - compute_before) / 1e6)
    phase.seconds = settings.seconds
    return float(np.median(overheads)), phase


def steps_compute_ns(statistics, headers: dict[str, str]) -> int:
    """Compute time (input + infer + output) the DALI ensemble's steps spent so far."""
    total = 0
    for model in (DALI_PREPROCESS, CLASSIFIER):
        stats = statistics.get_inference_statistics(model, headers=headers, as_json=True)
        stats = stats["model_stats"][0]["inference_stats"]
        total += sum(int(stats[part].get("ns", 0)) for part in ("compute_input", "compute_infer", "compute_output"))
    return total


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
    images = [image.data for image in _weighted_sequence(400)]
    results: dict = {"settings": settings.__dict__ | {"quick": settings is QUICK}, "cpu_model": cpu_model(),
                     "cpu_count": os.cpu_count()}
    errors = 0

    log("in-process reference (DALI + ONNX Runtime, no server)...")
    results["inprocess_images_per_s"], results["inprocess_best_setting"] = inprocess_images_per_s(
        repository, images, settings)

    with contextlib.nullcontext(server) if server else target_server(repository) as server:
        results["versions"] = versions(server)
        log("DALI ensemble at saturation over gRPC...")
        grpc_phase, concurrency, saturation_errors = saturate(server.grpc_url, "grpc", DALI_ENSEMBLE, images, settings)
        errors += saturation_errors
        results["server_images_per_s"] = grpc_phase.images_per_s
        results["server_best_concurrency"] = concurrency
        results["client_cpu_share"] = grpc_phase.client_cpu_s / (settings.seconds + settings.warmup_s)
        results["serving_efficiency"] = results["server_images_per_s"] / results["inprocess_images_per_s"]
        results["server_rss_mb"] = server_rss_mb(server)  # right after saturation: steady state

        log("HTTP at the same concurrency...")
        http_phase = asyncio.run(closed_loop(server.http_url, "http", DALI_ENSEMBLE, images, concurrency,
                                             settings.seconds, settings.warmup_s))
        errors += http_phase.errors
        results["http_images_per_s"] = http_phase.images_per_s
        results["http_vs_grpc"] = http_phase.images_per_s / grpc_phase.images_per_s

        log("preprocessing models alone: DALI, then Pillow...")
        dali, dali_per_cpu, dali_errors = preprocess_rate(server, DALI_PREPROCESS, images, settings)
        pil, pil_per_cpu, pil_errors = preprocess_rate(server, PIL_PREPROCESS, images, settings)
        errors += dali_errors + pil_errors
        results["dali_preprocess_images_per_s"] = dali.images_per_s
        results["pil_preprocess_images_per_s"] = pil.images_per_s
        results["dali_vs_pil_preprocess"] = dali.images_per_s / pil.images_per_s
        results["dali_preprocess_images_per_cpu_s"] = dali_per_cpu
        results["pil_preprocess_images_per_cpu_s"] = pil_per_cpu
        results["dali_vs_pil_per_cpu_second"] = dali_per_cpu / pil_per_cpu if dali_per_cpu and pil_per_cpu else None

        log("Pillow ensemble at the same concurrency...")
        pil_ensemble = asyncio.run(closed_loop(server.grpc_url, "grpc", PIL_ENSEMBLE, images, concurrency,
                                               settings.seconds, settings.warmup_s))
        errors += pil_ensemble.errors
        results["pil_ensemble_images_per_s"] = pil_ensemble.images_per_s
        results["dali_vs_pil_ensemble"] = grpc_phase.images_per_s / pil_ensemble.images_per_s

        log("ensemble overhead at concurrency 1...")
        overhead, single = ensemble_overhead_ms(server, typical_image(), settings)
        errors += single.errors
        results["ensemble_overhead_ms_p50"] = overhead
        results["latency_ms_p50_concurrency_1"] = single.percentile_ms(50)

        rate = 0.7 * grpc_phase.images_per_s
        log(f"open loop at {rate:.1f} requests/s (70% of saturation)...")
        steady = asyncio.run(open_loop(server.grpc_url, DALI_ENSEMBLE, images, rate,
                                       settings.open_loop_s, settings.warmup_s))
        errors += steady.errors
        results["open_loop_rate"] = rate
        results["open_loop_ms_p50"] = steady.percentile_ms(50)
        results["open_loop_ms_p99"] = steady.percentile_ms(99)
        results["p99_over_p50"] = results["open_loop_ms_p99"] / results["open_loop_ms_p50"]
    results["errors"] = errors
    return results


def typical_image() -> bytes:
    """The corpus's most common kind: a medium-size photo."""
    return next(image.data for image in build_corpus() if "@640" in image.name)


def _weighted_sequence(count: int):
    sampler = WeightedSampler(build_corpus(), seed=0)
    return [sampler.draw() for _ in range(count)]


# Every key the benchmark promises (issue 5), besides versions and settings.
REQUIRED_KEYS = (
    "inprocess_images_per_s", "server_images_per_s", "serving_efficiency",
    "dali_preprocess_images_per_s", "pil_preprocess_images_per_s", "dali_vs_pil_preprocess",
    "dali_vs_pil_per_cpu_second", "dali_vs_pil_ensemble", "ensemble_overhead_ms_p50",
    "p99_over_p50", "http_vs_grpc", "server_rss_mb", "errors", "versions", "cpu_model", "cpu_count",
)

TARGETS = {
    "serving_efficiency": (">=", 0.90),
    "dali_vs_pil_preprocess": (">=", 1.5),
    "ensemble_overhead_ms_p50": ("<=", 1.0),
    "p99_over_p50": ("<=", 2.5),
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
    if not args.model_repository.is_dir():
        raise cli.UsageError(f"{args.model_repository}: no such folder (a fresh clone needs `make build` first)")
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
