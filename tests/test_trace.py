"""Where one request's time goes, from Triton's trace (tritonstack/measure/trace.py): a real
server started with the benchmark's trace flags, one traced phase, the file it
writes when it stops. The parts of each request add up to the client's latency."""

import statistics

from tritonstack.benchmark import single
from tritonstack.measure import measured_models
from tritonstack.measure.trace import PARTS, covered, read_traces, request_hops, trace_args
from tritonstack.serve.launcher import TritonServer
from tritonstack.serve.server_config import ServerConfig

COUNT = 12


def test_a_traced_phase_splits_each_request(lite0_repository, tmp_path):
    trace_file = tmp_path / "trace.json"
    with TritonServer(ServerConfig(lite0_repository, extra_args=trace_args(trace_file))) as server:
        client_times = single.traced_single_requests(server, COUNT)
    traces = read_traces(trace_file)
    # Only the traced phase: the untraced first request and readiness calls left no trace.
    assert len([t for t in traces.values() if t.parent_id is None]) == COUNT
    hops = request_hops(
        traces,
        client_times,
        measured_models.DALI_ENSEMBLE,
        (measured_models.DALI_PREPROCESS, measured_models.CLASSIFIER),
    )
    assert set(hops) == set(PARTS) and all(len(values) == COUNT for values in hops.values())
    for index, (sent, received) in enumerate(client_times):
        parts = {part: hops[part][index] for part in PARTS}
        assert abs(sum(parts.values()) - (received - sent) / 1e6) < 1e-3, parts
        assert all(value >= 0 for value in parts.values()), parts
    # Alone on the server, the steps compute longer than they queue: in the median, as a
    # busy 2-core machine can stall one request in a queue (seen once: 25 ms against 16).
    assert statistics.median(hops["steps_compute"]) > statistics.median(hops["steps_queue"]), hops
    medians = single.trace_medians(trace_file, client_times)
    assert medians["requests"] == COUNT and set(PARTS) <= set(medians)


def test_nothing_traced_gives_no_figures(tmp_path):
    assert read_traces(tmp_path / "missing.json") == {}
    assert single.trace_medians(tmp_path / "missing.json", [(1, 2)]) is None


def test_covered_time_counts_overlaps_once():
    assert covered([(0, 10), (5, 15), (20, 25)]) == 20
    assert covered([(0, 10), (2, 3)]) == 10
    assert covered([]) == 0
    assert covered([(0, 10), (5, 15), (20, 25)], within=(3, 22)) == 14
    assert covered([(0, 2)], within=(3, 22)) == 0
