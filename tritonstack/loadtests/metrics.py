"""Triton's Prometheus metrics, scraped before and after a run, as a per-model
breakdown: where the time goes inside an ensemble.

    before = scrape(server.metrics_url)
    ...  # the load
    for row in breakdown(before, scrape(server.metrics_url)):
        print(row.model, row.requests, row.mean_queue_ms, row.mean_compute_ms)

Triton's counters are cumulative since start-up, so a run's figures are the
difference of two scrapes. The per-request durations are sums over requests; for
a batched execution every request of the batch is charged the batch's compute time,
so mean compute per request is what one request waited for its batch to run.

Failures are Triton's own count, summed over reasons. Seen with Triton 2.51: a
failed ensemble request is counted under reason OTHER (sometimes twice), while
a Python-based backend step that answers with an error response counts it as a
success; the client-side failure count (Locust) is the one to trust.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
# The failure reason of a request refused by a queue policy (a full queue, or its timeout
# passed while queued): counted by the step that refused it; an ensemble counts its own
# failure as OTHER (Triton 2.51).
REFUSED_REASON = "REJECTED"
INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
REQUEST_US = "nv_inference_request_duration_us"
QUEUE_US = "nv_inference_queue_duration_us"
# A gauge: requests a model has received and not yet started (Triton 2.51).
PENDING = "nv_inference_pending_request_count"
COMPUTE_US = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
_COUNTERS = (SUCCESS, FAILURE, INFERENCES, EXECUTIONS, REQUEST_US, QUEUE_US, *COMPUTE_US, PENDING)

# model name -> counter name -> value (summed over versions and failure reasons)
Snapshot = dict[str, dict[str, float]]


def parse(text: str) -> Snapshot:
    """Prometheus text exposition -> per-model totals of Triton's inference counters."""
    snapshot: Snapshot = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        if family.name not in _COUNTERS:
            continue
        # The parser names a counter's samples <family>_total: count by family.
        for sample in family.samples:
            if "model" in sample.labels:
                snapshot[sample.labels["model"]][family.name] += sample.value
    return {model: dict(counters) for model, counters in snapshot.items()}


def failures_by_reason(metrics_url: str, timeout_s: float = 10.0) -> dict[tuple[str, str], float]:
    """(model, reason) -> Triton's failure count, summed over versions."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode()
    counts: dict[tuple[str, str], float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        if family.name == FAILURE:
            for sample in family.samples:
                counts[(sample.labels["model"], sample.labels["reason"])] += sample.value
    return dict(counts)


def scrape(metrics_url: str, timeout_s: float = 10.0) -> Snapshot:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return parse(response.read().decode())


@dataclass(frozen=True)
class ModelBreakdown:
    model: str
    requests: int  # successful requests
    failures: int
    inferences: int  # images (batch rows)
    executions: int  # model executions (batches)
    mean_batch_size: float  # inferences / executions
    mean_request_ms: float  # end to end inside the server, per request
    mean_queue_ms: float
    mean_compute_ms: float  # input + infer + output

    def as_dict(self) -> dict:
        return asdict(self)


def breakdown(before: Snapshot, after: Snapshot) -> list[ModelBreakdown]:
    """One row per model that saw traffic between the two scrapes, by name."""
    rows = []
    for model in sorted(after):
        delta = {name: after[model].get(name, 0.0) - before.get(model, {}).get(name, 0.0) for name in _COUNTERS}
        if delta[SUCCESS] == 0 and delta[FAILURE] == 0:
            continue
        requests = delta[SUCCESS]
        rows.append(
            ModelBreakdown(
                model=model,
                requests=int(requests),
                failures=int(delta[FAILURE]),
                inferences=int(delta[INFERENCES]),
                executions=int(delta[EXECUTIONS]),
                mean_batch_size=_ratio(delta[INFERENCES], delta[EXECUTIONS]),
                mean_request_ms=_ratio(delta[REQUEST_US], requests) / 1000,
                mean_queue_ms=_ratio(delta[QUEUE_US], requests) / 1000,
                mean_compute_ms=_ratio(sum(delta[name] for name in COMPUTE_US), requests) / 1000,
            )
        )
    return rows


def markdown_table(rows: list[ModelBreakdown]) -> str:
    lines = [
        "| model | requests | failures | mean batch size | mean request ms | mean queue ms | mean compute ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.model} | {row.requests} | {row.failures} | {row.mean_batch_size:.2f} "
            f"| {row.mean_request_ms:.2f} | {row.mean_queue_ms:.2f} | {row.mean_compute_ms:.2f} |"
        )
    return "\n".join(lines)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
