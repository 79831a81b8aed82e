"""MLPerf Inference LoadGen against a server: the Offline and Server scenarios, judged
by LoadGen itself, through one client adaptor a protocol.

    target = TritonHttpTarget("127.0.0.1:8000", "ensemble_dali_efficientnet_lite0")
    offline = run_scenario(target, images, Scenario.offline(seconds=20), log_dir)
    best, runs = highest_valid_rate(server_run(target, images, plan, log_dir), low=20, high=200)

LoadGen decides when each query is issued (all at once for Offline, Poisson arrivals at
`server_target_qps` for Server), records every latency, and writes its verdict:
VALID when the run met the scenario's rules (for Server: the p99 under the bound, the
minimum duration and query count), INVALID otherwise. This module only carries
queries to the server and completions back, so the figures are LoadGen's, and ours and
the peer see the same query set under the same settings (MLPerf's rule for a
comparison): both adaptors send one encoded image a query, over HTTP, from one asyncio
loop on a thread of this process.

Each run writes LoadGen's own logs (`mlperf_log_summary.txt`, `mlperf_log_detail.txt`)
into a folder of its own under `log_dir`; the result is read back from the detail
log's structured records, not recomputed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import mlperf_loadgen as lg
import numpy as np
import tritonclient.http as httpclient

from tritonstack.contract import pad_batch
from tritonstack.measure.figures import Median
from tritonstack.measure.load_settings import SERVER_MIN_QUERIES, LoadGenPlan
from tritonstack.measure.rounds import interleaved, ratios

# The records of mlperf_log_detail.txt that a result is read from.
DETAIL_PREFIX = ":::MLLOG "
VALIDITY_KEY = "result_validity"
P99_KEY = "result_99.00_percentile_latency_ns"
RATE_KEYS = {"Offline": "result_samples_per_second", "Server": "result_completed_samples_per_sec"}
SCHEDULED_KEY = "result_scheduled_samples_per_sec"
QUERY_COUNT_KEY = "result_query_count"
CONSTRAINTS_MET_KEY = "result_perf_constraints_met"
MIN_DURATION_MET_KEY = "result_min_duration_met"
EARLY_STOPPING_MET_KEY = "early_stopping_met"
EARLY_STOPPING_KEY = "early_stopping_result"
# A Server run that met everything but early stopping is run once more with what LoadGen
# asked for, this many times over (the extra queries may be late too), at most MAX_QUERIES.
EARLY_STOPPING_MARGIN = 2
MAX_QUERIES = 4000
REQUEST_TIMEOUT_S = 60.0
# Offline: queries for this many times the rate measured before, so that they take at
# least the minimum duration even if this run is a little faster.
OFFLINE_MARGIN = 1.5


class TritonHttpTarget:
    """KServe v2 over HTTP, the image as a binary tensor and the top 5 asked for: the body
    Triton's stock HTTP client builds (tritonclient's generate_request_body), as the
    Locust users send it."""

    def __init__(self, url: str, model: str, input_name: str = "INPUT", output_name: str = "OUTPUT"):
        self.endpoint = f"http://{url}/v2/models/{model}/infer"
        self.input_name, self.output_name = input_name, output_name

    def request(self, image: bytes) -> tuple[bytes, dict[str, str]]:
        batch = pad_batch([image])
        tensor = httpclient.InferInput(self.input_name, list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch, binary_data=True)
        output = httpclient.InferRequestedOutput(self.output_name, binary_data=True, class_count=5)
        body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[output])
        headers = {"Inference-Header-Content-Length": str(header_length), "Content-Type": "application/octet-stream"}
        return body, headers


class PeerHttpTarget:
    """The peer's own API (tritonstack.benchmark.peer_service): the encoded image as the body."""

    def __init__(self, url: str, model: str):
        self.endpoint = f"http://{url}/classify/{model}"

    def request(self, image: bytes) -> tuple[bytes, dict[str, str]]:
        return image, {}


Target = TritonHttpTarget | PeerHttpTarget


@dataclass(frozen=True)
class Scenario:
    """One LoadGen run's settings."""

    name: str  # "Offline" or "Server"
    seconds: float  # LoadGen's minimum duration
    min_queries: int
    target_qps: float = 0.0  # Server: the Poisson rate; Offline: LoadGen's expected rate
    bound_ms: float = 0.0  # Server: the latency bound at `percentile`
    percentile: float = 0.99  # LoadGen's early stopping needs ~460 queries at 0.99, ~50 at 0.9

    @classmethod
    def offline(cls, seconds: float, expected_qps: float = 100.0) -> Scenario:
        return cls("Offline", seconds, min_queries=1, target_qps=expected_qps)

    @classmethod
    def server(
        cls,
        rate: float,
        bound_ms: float,
        seconds: float,
        min_queries: int = SERVER_MIN_QUERIES,
        percentile: float = 0.99,
    ) -> Scenario:
        return cls("Server", seconds, min_queries, target_qps=rate, bound_ms=bound_ms, percentile=percentile)

    def test_settings(self) -> lg.TestSettings:
        settings = lg.TestSettings()
        settings.mode = lg.TestMode.PerformanceOnly
        settings.min_duration_ms = int(self.seconds * 1000)
        settings.min_query_count = self.min_queries
        if self.name == "Offline":
            settings.scenario = lg.TestScenario.Offline
            settings.offline_expected_qps = self.target_qps
        else:
            settings.scenario = lg.TestScenario.Server
            settings.server_target_qps = self.target_qps
            settings.server_target_latency_ns = int(self.bound_ms * 1e6)
            settings.server_target_latency_percentile = self.percentile
        return settings


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    valid: bool  # LoadGen's verdict
    samples_per_s: float  # Offline: its throughput; Server: the completed rate
    scheduled_per_s: float | None  # Server: the Poisson rate LoadGen issued at
    p99_ms: float
    errors: int  # queries the server answered with an error (LoadGen counts them as done)
    log_dir: Path
    queries: int = 0  # how many LoadGen sent
    queries_short: int = 0  # Server: more queries LoadGen's early stopping asked for, all else met
    too_short: bool = False  # answered before the minimum duration (Offline: more queries needed)

    @property
    def met(self) -> bool:
        """VALID by LoadGen and no query answered with an error: LoadGen counts an
        error as a completed query, a user does not."""
        return self.valid and self.errors == 0


class _Sender:
    """An asyncio loop on a thread of its own: LoadGen's issue callback hands each query
    to it and returns at once; each answer completes its query from the loop's thread."""

    def __init__(self, target: Target, images: Sequence[bytes], max_connections: int):
        self.target, self.images, self.errors = target, images, 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loadgen-sender", daemon=True)
        self.thread.start()
        self.session = asyncio.run_coroutine_threadsafe(self._session(max_connections), self.loop).result()

    async def _session(self, max_connections: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=max_connections)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))

    def issue(self, queries) -> None:
        for query in queries:
            asyncio.run_coroutine_threadsafe(self._send(query.id, query.index), self.loop)

    async def _send(self, query_id: int, index: int) -> None:
        body, headers = self.target.request(self.images[index % len(self.images)])
        try:
            async with self.session.post(self.target.endpoint, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    self.errors += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            self.errors += 1
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.session.close(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def run_scenario(
    target: Target, images: Sequence[bytes], scenario: Scenario, log_dir: Path, max_connections: int = 64
) -> ScenarioResult:
    """One LoadGen run; its logs in `log_dir` (created)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    sender = _Sender(target, images, max_connections)
    sut = lg.ConstructSUT(sender.issue, lambda: None)
    qsl = lg.ConstructQSL(len(images), len(images), lambda indices: None, lambda indices: None)
    log_settings = lg.LogSettings()
    log_settings.log_output.outdir = str(log_dir)
    log_settings.log_output.copy_summary_to_stdout = False
    try:
        lg.StartTestWithLogSettings(sut, qsl, scenario.test_settings(), log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        sender.close()
    return read_result(scenario.name, log_dir, sender.errors)


def read_result(scenario: str, log_dir: Path, errors: int = 0) -> ScenarioResult:
    """The result LoadGen recorded in `log_dir`'s mlperf_log_detail.txt."""
    records = detail_records((log_dir / "mlperf_log_detail.txt").read_text())
    scheduled = records.get(SCHEDULED_KEY)
    short = 0
    if records.get(EARLY_STOPPING_MET_KEY) is False and records.get(CONSTRAINTS_MET_KEY) is True:
        wanted = re.search(r"at least (\d+) more queries", str(records.get(EARLY_STOPPING_KEY, "")))
        short = int(wanted[1]) if wanted else 0
    return ScenarioResult(
        scenario=scenario,
        valid=records[VALIDITY_KEY] == "VALID",
        samples_per_s=float(records[RATE_KEYS[scenario]]),
        scheduled_per_s=float(scheduled) if scheduled is not None else None,
        p99_ms=float(records[P99_KEY]) / 1e6,
        errors=errors,
        log_dir=log_dir,
        queries=int(records.get(QUERY_COUNT_KEY, 0)),
        queries_short=short,
        too_short=records.get(MIN_DURATION_MET_KEY) is False,
    )


def detail_records(text: str) -> dict[str, object]:
    """The `key: value` of each ":::MLLOG {json}" line (the last one of a key wins)."""
    records = {}
    for line in text.splitlines():
        if line.startswith(DETAIL_PREFIX):
            record = json.loads(line[len(DETAIL_PREFIX) :])
            records[record["key"]] = record["value"]
    return records


def highest_valid_rate(
    run: Callable[[float], ScenarioResult], low: float, high: float, steps: int = 5
) -> tuple[ScenarioResult | None, list[ScenarioResult]]:
    """The highest Poisson rate in [low, high] that LoadGen judges VALID, with no error
    answered: `run(rate)` is one Server run (server_run), bisected `steps` times from
    `low`. Returns the best such result (None when even `low` is not) and every run."""
    runs, best = [], None
    for _ in range(steps):
        rate = (low + high) / 2 if runs else low
        result = run(rate)
        runs.append(result)
        if result.met:
            best, low = result, rate
        elif len(runs) == 1:
            break  # the lowest rate asked for is already beyond the bound
        else:
            high = rate
    return best, runs


def server_run(target: Target, images: Sequence[bytes], plan: LoadGenPlan, log_dir: Path):
    """`run(rate)` for highest_valid_rate: each rate's logs in log_dir/server_<rate>."""

    def run(rate: float) -> ScenarioResult:
        folder = log_dir / f"server_{rate:.1f}".replace(".", "_")
        scenario = Scenario.server(rate, plan.bound_ms, plan.server_seconds, plan.min_queries, plan.percentile)
        result = run_scenario(target, images, scenario, folder)
        wanted = result.queries + EARLY_STOPPING_MARGIN * result.queries_short
        if result.queries_short and wanted <= MAX_QUERIES:  # LoadGen's own recommendation, followed once
            longer = dataclasses.replace(scenario, min_queries=wanted)
            result = run_scenario(target, images, longer, folder.with_name(folder.name + "_longer"))
        return result

    return run


def loadgen_figures(
    sides: dict[str, tuple[Target, int, float]], images: Sequence[bytes], plan: LoadGenPlan, log_dir: Path, log=print
) -> dict[str, dict]:
    """For each side (name -> its adaptor, its best concurrency and the rate the
    benchmark's closed loop measured there): LoadGen's Offline throughput in
    `plan.offline_rounds` rounds interleaved across the sides, and the highest Poisson
    rate it judges VALID, each run's logs under log_dir/<side>. Both sides see the same
    images and settings."""
    offline = offline_rounds(sides, images, plan, log_dir, log)
    figures = {}
    for name, (target, _, _) in sides.items():
        rates = [result.samples_per_s if result.met else None for result in offline[name]]
        seed = float(np.median([result.samples_per_s for result in offline[name]]))
        run = server_run(target, images, plan, log_dir / name)
        best, runs = highest_valid_rate(run, plan.low * seed, plan.high * seed, plan.steps)
        log(f"LoadGen, {name}: Offline {seed:.1f} images/s (median), Server {_rate(best)} requests/s VALID")
        met = [rate for rate in rates if rate is not None]
        figures[name] = {
            "offline_images_per_s": round(float(np.median(met)), 2) if met else None,
            "offline_rounds": [round(rate, 2) if rate is not None else None for rate in rates],
            "server_valid_rate": round(best.scheduled_per_s, 2) if best else None,
            "server_p99_ms": round(best.p99_ms, 1) if best else None,  # LoadGen reports the p99 always
            "server_runs": [[round(r.scheduled_per_s or 0, 2), r.met, round(r.p99_ms, 1)] for r in runs],
            "percentile": plan.percentile,
            "bound_ms": plan.bound_ms,
        }
    return figures


def offline_rounds(
    sides: dict[str, tuple[Target, int, float]], images: Sequence[bytes], plan: LoadGenPlan, log_dir: Path, log=print
) -> dict[str, list[ScenarioResult]]:
    """Each side's Offline run once a round, the sides in turn (measure.rounds), so
    that drift on a shared machine moves both alike; round k's logs in
    log_dir/<side>/offline_<k>."""

    def measure(name: str) -> Callable[[], ScenarioResult]:
        target, concurrency, rate = sides[name]
        done = itertools.count(1)
        return lambda: run_offline(
            target, images, plan.offline_seconds, log_dir / name / f"offline_{next(done)}", concurrency, rate
        )

    log("LoadGen Offline, interleaved:")
    return interleaved({name: measure(name) for name in sides}, plan.offline_rounds, log)


def run_offline(target: Target, images: Sequence[bytes], seconds: float, log_dir: Path, concurrency: int, rate: float):
    """Offline: LoadGen issues expected x seconds x 1.1 queries at once, VALID only if
    answering them took `seconds`: expecting more than the side's measured `rate`
    makes the run last at least that long. A run that was over sooner (the rate measured
    before was low) is run once more expecting what it served, as LoadGen recommends."""
    result = run_scenario(target, images, Scenario.offline(seconds, rate * OFFLINE_MARGIN), log_dir, concurrency)
    if result.too_short and result.errors == 0:
        expected = result.samples_per_s * OFFLINE_MARGIN
        result = run_scenario(target, images, Scenario.offline(seconds, expected), log_dir, concurrency)
    return result


def _rate(result: ScenarioResult | None) -> str:
    return f"{result.scheduled_per_s:.1f}" if result and result.scheduled_per_s else "none"


@dataclass(frozen=True)
class LoadGenFigures:
    """The benchmark's LoadGen keys: each side's results and ours over the peer's."""

    loadgen: dict | None
    loadgen_vs_peer_offline: Median
    loadgen_vs_peer_server: float | None


def comparison(figures: dict[str, dict] | None, ours: str = "ours", theirs: str = "peer") -> LoadGenFigures:
    """Ours over the peer's Offline throughput, round by round (a Median with its
    interval; a round where a side's run was not VALID gives no ratio), and ours over
    the peer's highest valid Server rate (one search each a run); None where a side has
    no valid result."""
    if not figures:
        return LoadGenFigures(None, Median.of([]), None)
    offline = ratios(figures[ours]["offline_rounds"], figures[theirs]["offline_rounds"])
    mine, peer = figures[ours]["server_valid_rate"], figures[theirs]["server_valid_rate"]
    return LoadGenFigures(figures, Median.of(offline), round(mine / peer, 3) if mine and peer else None)
