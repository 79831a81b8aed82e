"""Where one request's time goes, from Triton's own trace timestamps.

A server started with `trace_args(file)` has tracing configured but off. `traced()`
turns it on for one model and a bounded number of requests (Triton's trace API);
the client notes its own send and receive times on the same clock as Triton's
timestamps (CLOCK_MONOTONIC on Linux: steady_clock there, time.monotonic_ns here).
Once the server has written the file (at its stop), `request_hops()` splits every
traced request's latency into parts that add up to it exactly:

    client_to_server   client's send -> the server has read the request
                       (client serialization, loopback, the frontend's read)
    steps_compute      time in which a step computes (input + infer + output)
    steps_queue        time in which a step is queued (its dynamic batcher) and none
                       computes
    server_other       the rest of the server's time until it starts sending the
                       response: the frontend's parsing, the ensemble scheduler,
                       hand-offs between steps
    server_to_client   the server starts sending the response -> the client has the
                       result (the frontend's write, loopback, the client's parsing)

Every part is non-negative by causality, and no time is counted twice: times are
unions of intervals (a step may start while the one before is still finishing its
output), cut at the response's send (a step's output stage can still be closing
while the response is already on its way; the frontend's send-end stamp can even
come after the client has the answer, so it is not used). The benchmark's overhead
(latency - steps' compute) is then about client_to_server + steps_queue +
server_other + server_to_client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import tritonclient.grpc as grpcclient

PARTS = ("client_to_server", "steps_queue", "steps_compute", "server_other", "server_to_client")
# The frontend's timestamps that bound a request in the server, gRPC or HTTP.
READ_END = ("GRPC_WAITREAD_END", "HTTP_RECV_END")
SEND_START = ("GRPC_SEND_START", "HTTP_SEND_START")


def trace_args(trace_file: Path) -> tuple[str, ...]:
    """tritonserver flags: Triton's trace mode writing to `trace_file`, level OFF
    until `traced()` turns it on."""
    return ("--trace-config", f"triton,file={trace_file}", "--trace-config", "level=OFF", "--trace-config", "rate=1")


@contextlib.contextmanager
def traced(grpc_url: str, headers: dict[str, str], model: str, count: int) -> Iterator[None]:
    """Every request to `model` traced (at most `count`), then tracing off again."""
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.update_trace_settings(
            model, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": str(count)}, headers=headers
        )
        try:
            yield
        finally:
            client.update_trace_settings(model, {"trace_level": ["OFF"]}, headers=headers)


@dataclass
class Trace:
    """One traced request: its model, its parent (an ensemble step's), its timestamps (ns)."""

    model: str = ""
    parent_id: int | None = None
    ns: dict[str, int] = field(default_factory=dict)

    def first(self, names: tuple[str, ...]) -> int | None:
        return next((self.ns[name] for name in names if name in self.ns), None)


def read_traces(trace_file: Path) -> dict[int, Trace]:
    """Triton's trace files (JSON lists of records, several per trace id) by id:
    `trace_file` and the `<trace_file>.<n>` Triton starts when settings change."""
    traces: dict[int, Trace] = {}
    files = [trace_file, *trace_file.parent.glob(f"{trace_file.name}.*")] if trace_file.parent.is_dir() else []
    records = [
        record for file in files if file.is_file() and file.stat().st_size for record in json.loads(file.read_text())
    ]
    for record in records:
        trace = traces.setdefault(int(record["id"]), Trace())
        trace.model = record.get("model_name", trace.model)
        trace.parent_id = int(record["parent_id"]) if record.get("parent_id") else trace.parent_id
        for stamp in record.get("timestamps", []):
            trace.ns.setdefault(stamp["name"], int(stamp["ns"]))
    return traces


def request_hops(
    traces: dict[int, Trace], client_times: list[tuple[int, int]], model: str, steps: tuple[str, ...]
) -> dict[str, list[float]]:
    """Per part, ms per request: each of `model`'s top-level traces, in order,
    matched to the client's (sent, received) ns of the same requests."""
    children: dict[int, dict[str, Trace]] = {}
    for trace in traces.values():
        if trace.parent_id is not None:
            children.setdefault(trace.parent_id, {})[trace.model] = trace
    tops = sorted(
        (trace_id for trace_id, trace in traces.items() if trace.model == model and trace.parent_id is None),
        key=lambda trace_id: traces[trace_id].ns.get("REQUEST_START", 0),
    )
    hops: dict[str, list[float]] = {part: [] for part in PARTS}
    for (sent, received), trace_id in zip(client_times, tops):
        top, step_traces = traces[trace_id], children.get(trace_id, {})
        read, replying = top.first(READ_END), top.first(SEND_START)
        if read is None or replying is None or any(step not in step_traces for step in steps):
            continue
        span = (read, replying)
        busy = covered([(step_traces[s].ns["QUEUE_START"], step_traces[s].ns["COMPUTE_END"]) for s in steps], span)
        compute = covered([(step_traces[s].ns["COMPUTE_START"], step_traces[s].ns["COMPUTE_END"]) for s in steps], span)
        for part, ns in (
            ("client_to_server", read - sent),
            ("steps_queue", busy - compute),
            ("steps_compute", compute),
            ("server_other", replying - read - busy),
            ("server_to_client", received - replying),
        ):
            hops[part].append(ns / 1e6)
    return hops


def covered(intervals: list[tuple[int, int]], within: tuple[int, int] | None = None) -> int:
    """The length of the union of [start, end] intervals, cut to `within`."""
    if within is not None:
        intervals = [(max(start, within[0]), min(end, within[1])) for start, end in intervals]
        intervals = [(start, end) for start, end in intervals if end > start]
    total, reached = 0, None
    for start, end in sorted(intervals):
        if reached is None or start > reached:
            total, reached = total + end - start, end
        elif end > reached:
            total, reached = total + end - reached, end
    return total
