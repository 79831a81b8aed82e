"""Soak: mixed good and bad images over HTTP and gRPC for a while, watching the
server's memory and file descriptors.

    tritonstack soak --duration 1800 --out reports/soak.json   # make soak

Plain threads, one tritonclient per worker (no gevent: NOTES.md), batch-1
requests so that good and bad images share the server's dynamic batches. Every
valid image must come back with its label; a bad one must get a client error
(HTTP 4xx, gRPC UNKNOWN or INVALID_ARGUMENT) that names the decoder or the limit
it broke (a pipeline failing for another reason is not a refusal) or, when its
bytes still decode, a classification; anything else (5xx, a dropped connection, a hang) is a failure.
The resident memory (RSS) and open file descriptors of tritonserver and of each
backend stub process are sampled over time (one sample a second).

The memory verdict (docs/memory.md): for each process, a least-squares line through
its RSS samples after warm-up (default: the first quarter of the run, when buffers,
the Python backend's shared memory and the allocator's pools reach their working
size; before the run, bursts of full batches bring the batch-sized ones there, see
`saturate`); its growth is the line's rise over the window, as a percentage of the
line's value at the window's start, and must stay under MAX_GROWTH_PCT. A line, not the
first and last samples: the stub's RSS swings by a few MiB with the dynamic batch
sizes, and a fit over hundreds of samples is not fooled by one swing. The window
must last MIN_JUDGED_WINDOW_S at least: over a shorter one a slow leak hides in
the noise, and the memory is reported as not judged. `make soak` runs 30 minutes
(450 s warm-up, 1350 s judged). Loopback only, bounded by duration and request count.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from tritonclient.utils import InferenceServerException

from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.protocol import PROTOCOLS
from tritonstack.client.retry import NO_RETRY, describe_error
from tritonstack.contract import DEFAULT_MODEL
from tritonstack.samples.photos import Sample, bad_samples, good_samples
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.process_tree import MAX_GROWTH_PCT, ResourceSampler

# Simultaneous requests of the burst before the run: the models' max_batch_size.
BURST_CONCURRENCY = 32
# Shortest window after warm-up over which the memory is judged (docs/memory.md).
MIN_JUDGED_WINDOW_S = 600.0
CLIENT_ERRORS = {"StatusCode.UNKNOWN", "StatusCode.INVALID_ARGUMENT"}


# What a refusal of bad data names: the decoder that could not read it, or the
# limit it broke. An UNKNOWN (or 400) without one of these is a pipeline failing
# for another reason, which the soak counts as a server error.
REFUSAL_REASONS = ("decoders.image", "max_pixels", "max_input_bytes")


def is_client_error(error: BaseException) -> bool:
    status = str(error.status()) if isinstance(error, InferenceServerException) else ""
    return status.startswith("4") or status in CLIENT_ERRORS


def is_refusal_of_bad_data(error: BaseException) -> bool:
    """A client error that says what is wrong with the input."""
    return is_client_error(error) and any(reason in str(error.message()) for reason in REFUSAL_REASONS)


@dataclass
class Tally:
    """What happened to the requests, by kind, and the first few failures."""

    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    times: list[tuple[float, bool]] = field(default_factory=list)  # (monotonic, valid request ok)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, protocol: str, sample: Sample, outcome: str, error: BaseException | None) -> None:
        with self.lock:
            self.counts[outcome] += 1
            self.counts[f"{protocol}_requests"] += 1
            if sample.valid:
                self.times.append((time.monotonic(), outcome == "valid_ok"))
            if outcome in ("valid_failed", "bad_server_error") and len(self.failures) < 20:
                self.failures.append(f"{protocol} {sample.name}: {describe_error(error) if error else outcome}")


class MixedLoad:
    """Worker threads sending one image per request until stopped or out of budget."""

    def __init__(
        self,
        urls: dict[str, str],
        workers_per_protocol: int = 2,
        bad_ratio: float = 0.25,
        max_requests: int = 1_000_000,
        model: str = DEFAULT_MODEL,
        timeout_s: float = 60.0,
        seed: int = 0,
    ):
        self.urls = urls
        self.workers_per_protocol = workers_per_protocol
        self.bad_ratio = bad_ratio
        self.model = model
        self.timeout_s = timeout_s
        self.seed = seed
        self.tally = Tally()
        self._good, self._bad = good_samples(), bad_samples(seed)
        self._budget = threading.Semaphore(max_requests)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "MixedLoad":
        for protocol in PROTOCOLS:
            for index in range(self.workers_per_protocol):
                worker = threading.Thread(target=self._work, args=(protocol, index), daemon=True)
                worker.start()
                self._threads.append(worker)
        return self

    def join(self) -> Tally:
        """Wait until the request budget is spent."""
        for worker in self._threads:
            worker.join()
        return self.tally

    def stop(self) -> Tally:
        self._stopping.set()
        for worker in self._threads:
            worker.join(timeout=self.timeout_s + 10)
        return self.tally

    def __enter__(self) -> "MixedLoad":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _work(self, protocol: str, index: int) -> None:
        chooser = random.Random(f"{self.seed}-{protocol}-{index}")
        with ClassifierClient(
            self.urls[protocol], protocol, self.model, timeout_s=self.timeout_s, retry=NO_RETRY, batch=True
        ) as client:
            while not self._stopping.is_set() and self._budget.acquire(blocking=False):
                bad = chooser.random() < self.bad_ratio
                sample = chooser.choice(self._bad if bad else self._good)
                self.tally.add(protocol, sample, *self._send(client, sample))

    @staticmethod
    def _send(client: ClassifierClient, sample: Sample) -> tuple[str, BaseException | None]:
        try:
            top = client.classify([sample.data], top_k=1)[0][0]
        except Exception as error:  # every failure is counted, none ends the run
            if sample.valid:
                return "valid_failed", error
            return ("bad_refused" if is_refusal_of_bad_data(error) else "bad_server_error"), error
        if not sample.valid:
            return "bad_accepted", None
        if top.label in sample.labels:
            return "valid_ok", None
        return "valid_failed", ValueError(f"classified as {top.label!r}")


def growth(samples: list[dict], key: str, process: str, warmup_s: float) -> dict | None:
    """Least-squares slope of one process's series after warm-up, and the growth
    over that window as a percentage of the fitted value at its start."""
    points = [(row["t_s"], row[key][process]) for row in samples if row["t_s"] >= warmup_s and process in row[key]]
    if len(points) < 3:
        return None
    t, y = np.array(points, dtype=float).T
    slope, intercept = np.polyfit(t, y, 1)
    start = slope * t[0] + intercept
    window = t[-1] - t[0]
    return {
        "slope_per_min": round(float(slope * 60), 4),
        "fitted_start": round(float(start), 2),
        "fitted_end": round(float(slope * t[-1] + intercept), 2),
        "window_s": round(float(window), 1),
        "first": float(y[0]),
        "last": float(y[-1]),
        "max": float(y.max()),
        "growth_pct": round(float(100 * slope * window / start), 3) if start > 0 else None,
    }


def analyse(tally: Tally, samples: list[dict], duration_s: float, warmup_s: float) -> dict:
    processes = sorted({name for row in samples for name in row["rss_mib"]})
    rss = {name: growth(samples, "rss_mib", name, warmup_s) for name in processes}
    fds = {name: growth(samples, "fds", name, warmup_s) for name in processes}
    # Where the RSS growth lies: the heap, or the shared-memory region's pages (bounded).
    anon = {name: growth(samples, "anon_mib", name, warmup_s) for name in processes}
    shmem = {name: growth(samples, "shmem_mib", name, warmup_s) for name in processes}
    worst = max((g["growth_pct"] for g in rss.values() if g and g["growth_pct"] is not None), default=0.0)
    window = max((g["window_s"] for g in rss.values() if g), default=0.0)
    memory_judged = window >= MIN_JUDGED_WINDOW_S
    counts = dict(tally.counts)
    requests_ok = counts.get("valid_failed", 0) == 0 and counts.get("bad_server_error", 0) == 0
    return {
        "duration_s": round(duration_s, 1),
        "warmup_s": warmup_s,
        "requests": sum(
            counts.get(k, 0) for k in ("valid_ok", "valid_failed", "bad_refused", "bad_accepted", "bad_server_error")
        ),
        "counts": counts,
        "failed_valid_requests": counts.get("valid_failed", 0),
        "bad_server_errors": counts.get("bad_server_error", 0),
        "failures": tally.failures,
        "rss_growth": rss,
        "fd_growth": fds,
        "anon_growth": anon,
        "shmem_growth": shmem,
        "worst_rss_growth_pct": worst,
        "max_rss_growth_pct": MAX_GROWTH_PCT,
        "judged_window_s": window,
        "min_judged_window_s": MIN_JUDGED_WINDOW_S,
        # None: the window after warm-up was too short to judge the memory.
        "memory_passed": (worst < MAX_GROWTH_PCT) if memory_judged else None,
        "passed": requests_ok and (worst < MAX_GROWTH_PCT or not memory_judged),
        "samples": samples,
    }


def saturate(server: TritonServer, concurrency: int = BURST_CONCURRENCY, rounds: int = 3) -> Tally:
    """Bursts of `concurrency` simultaneous valid requests: the dynamic batcher forms
    full batches, so DALI's reused buffers and the Python backend's shared-memory
    region reach the working size of the largest batch before the run is measured
    (docs/memory.md: their pages, touched only by larger batches, would otherwise
    rise whenever a busy moment first forms one)."""
    burst = MixedLoad(
        {"http": server.http_url, "grpc": server.grpc_url},
        concurrency // 2,
        bad_ratio=0.0,
        max_requests=concurrency * rounds,
    ).start()
    return burst.join()


def run_soak(
    server: TritonServer,
    duration_s: float,
    warmup_s: float | None = None,
    workers_per_protocol: int = 2,
    bad_ratio: float = 0.25,
    period_s: float = 1.0,
    max_requests: int = 1_000_000,
    burst: bool = True,
) -> dict:
    """Soak a running server; the report says whether it passed and why."""
    warmup_s = duration_s / 4 if warmup_s is None else warmup_s
    burst_tally = saturate(server) if burst else None
    sampler = ResourceSampler(server.process.pid, period_s)
    sampler.start()
    started = time.monotonic()
    load = MixedLoad(
        {"http": server.http_url, "grpc": server.grpc_url}, workers_per_protocol, bad_ratio, max_requests
    ).start()
    time.sleep(duration_s)
    tally = load.stop()
    report = analyse(tally, sampler.stop(), time.monotonic() - started, warmup_s)
    report["burst_counts"] = dict(burst_tally.counts) if burst_tally else None
    return report


def summary(report: dict) -> str:
    lines = [
        f"soak: {report['duration_s']} s, {report['requests']} requests "
        f"({report['counts'].get('http_requests', 0)} HTTP, {report['counts'].get('grpc_requests', 0)} gRPC)",
        f"  valid ok {report['counts'].get('valid_ok', 0)}, failed valid {report['failed_valid_requests']}; "
        f"bad refused {report['counts'].get('bad_refused', 0)}, bad accepted "
        f"{report['counts'].get('bad_accepted', 0)}, bad with server error {report['bad_server_errors']}",
        f"  after {report['warmup_s']:.0f} s of warm-up, over {report['judged_window_s']:.0f} s "
        f"(limit {MAX_GROWTH_PCT}% RSS growth of a least-squares line, "
        f"judged over {MIN_JUDGED_WINDOW_S:.0f} s or more):",
    ]
    for name, rss in report["rss_growth"].items():
        fds = report["fd_growth"].get(name)
        if rss:
            lines.append(
                f"    {name:48s} RSS {rss['first']:8.1f} -> {rss['last']:8.1f} MiB, "
                f"slope {rss['slope_per_min']:+8.3f} MiB/min, growth {rss['growth_pct']:+6.2f}%; "
                f"fds {fds['first']:.0f} -> {fds['last']:.0f}"
            )
            anon, shmem = report["anon_growth"].get(name), report["shmem_growth"].get(name)
            if anon and shmem:
                lines.append(
                    f"    {'':48s} of which heap (RssAnon) {anon['fitted_start']:.1f} -> {anon['fitted_end']:.1f}, "
                    f"shared memory (RssShmem) {shmem['fitted_start']:.1f} -> {shmem['fitted_end']:.1f} MiB (fitted)"
                )
    lines += [f"  failure: {failure}" for failure in report["failures"]]
    if report["memory_passed"] is None:
        lines.append(
            f"  memory not judged: {report['judged_window_s']:.0f} s after warm-up, below {MIN_JUDGED_WINDOW_S:.0f} s"
        )
    lines.append("  PASSED" if report["passed"] else "  FAILED")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(cli.replaced_by("tritonstack soak"))
