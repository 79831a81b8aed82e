"""Single requests at concurrency 1: where a request's time goes (Triton's statistics and
trace), per hop and per ensemble step."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.measure.load_loops import Phase, typical_image
from tritonstack.measure.load_settings import REQUEST_TIMEOUT_S
from tritonstack.measure.measured_models import CLASSIFIER, DALI_ENSEMBLE, DALI_PREPROCESS
from tritonstack.measure.trace import read_traces, request_hops, traced


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
# + output); "outside_server" = latency - the ensemble's
# request time in Triton (gRPC, protobuf, network stack, our client);
# "in_server_outside_compute" = the ensemble's request time - the steps' compute
# (queues, the ensemble scheduler, the handoff between steps). Then each step's own
# queue and compute parts, as "<step>.<part>".
HOPS = ("overhead", "outside_server", "in_server_outside_compute")


STEP_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


COMPUTE_PARTS = ("compute_input", "compute_infer", "compute_output")


def single_requests(
    server, model: str, steps: tuple[str, ...], image: bytes, seconds: float, warmup_s: float
) -> SingleRequests:
    measured = SingleRequests(Phase(), {})
    headers = server.admin_headers("grpc")  # the statistics API is restricted
    with (
        ClassifierClient(server.grpc_url, "grpc", model, retry=NO_RETRY, timeout_s=REQUEST_TIMEOUT_S) as client,
        grpcclient.InferenceServerClient(server.grpc_url) as statistics,
    ):
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


def hop_costs(
    latency_ms: float, spent_ms: dict[tuple[str, str], float], model: str, steps: tuple[str, ...]
) -> dict[str, float]:
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
    with ClassifierClient(
        server.grpc_url, "grpc", DALI_ENSEMBLE, retry=NO_RETRY, timeout_s=REQUEST_TIMEOUT_S
    ) as client:
        image = typical_image()
        client.probabilities([image])  # the connection's first request, untraced
        with traced(server.grpc_url, server.admin_headers("grpc"), DALI_ENSEMBLE, count):
            for _ in range(count):
                sent = time.monotonic_ns()
                client.probabilities([image])
                times.append((sent, time.monotonic_ns()))
    return times


def trace_medians(trace_file: Path, client_times: list[tuple[int, int]]) -> dict[str, float] | None:
    """Median ms of each part of a request (tritonstack/measure/trace.py), and how many were matched."""
    hops = request_hops(read_traces(trace_file), client_times, DALI_ENSEMBLE, (DALI_PREPROCESS, CLASSIFIER))
    if not hops["steps_compute"]:
        return None
    return {part: float(np.median(values)) for part, values in hops.items()} | {"requests": len(hops["steps_compute"])}


def request_statistics(statistics, headers: dict[str, str], models: tuple[str, ...]) -> dict[tuple[str, str], int]:
    """Cumulative ns per (model, part) so far: success (whole request), queue, compute_*."""
    spent = {}
    for model in models:
        stats = statistics.get_inference_statistics(model, headers=headers, as_json=True)
        stats = stats["model_stats"][0]["inference_stats"]
        for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            spent[(model, part)] = int(stats.get(part, {}).get("ns", 0))
    return spent
