"""The benchmark's formulas on known inputs (tritonstack/benchmark/): the closed loop's
window, images per CPU-second, capacity against the ideal queue. A flipped ratio, a
wrong window or a dropped term fails here. Pure: no server."""

from __future__ import annotations

import pytest

from tritonstack.benchmark.ideal_queue import ideal_capacity
from tritonstack.benchmark.phases import Ended, Phase, window_phase
from tritonstack.benchmark.run import capacity_against_ideal
from tritonstack.benchmark.settings import CAPACITY_MAX_FRACTION


def test_a_closed_loop_counts_the_requests_that_ended_in_its_window_whenever_sent():
    """Window [10, 20]: a request sent during warm-up that ends in it counts, as one
    sent in it; one that ends before it or after it does not; a failure in it is an
    error, not a latency."""
    ended = [
        Ended(sent=8.0, done=9.5, ok=True),  # warm-up: before the window
        Ended(sent=9.5, done=10.5, ok=True),  # sent in warm-up, ended in the window: counts
        Ended(sent=12.0, done=12.25, ok=True),
        Ended(sent=15.0, done=15.5, ok=False),  # an error in the window
        Ended(sent=19.5, done=20.0, ok=True),  # ends at the window's end: counts
        Ended(sent=19.75, done=21.0, ok=True),  # ends after the window
        Ended(sent=9.0, done=21.0, ok=False),  # an error outside it
    ]
    phase = window_phase(ended, measure_from=10.0, end=20.0)
    assert phase.latencies_s == [1.0, 0.25, 0.5]
    assert phase.errors == 1
    assert phase.seconds == 10.0
    assert phase.images_per_s == pytest.approx(0.3)  # 3 answered in 10 s


def test_images_per_cpu_second_divides_the_windows_images_by_the_servers_cpu():
    # 200 answered in 10 s (20/s); the server's CPU covers 2 s of warm-up too: 240 images
    # over 12 CPU-seconds.
    phase = Phase(latencies_s=[0.05] * 200, seconds=10.0, server_cpu_s=12.0, warmup_s=2.0)
    assert phase.images_per_s == pytest.approx(20.0)
    assert phase.images_per_cpu_s == pytest.approx(20.0)
    # The in-process reference: images counted, CPU over the counted window only.
    assert Phase(images=300, seconds=10.0, server_cpu_s=20.0, warmup_s=0.0).images_per_cpu_s == pytest.approx(15.0)
    assert Phase(latencies_s=[0.05] * 10, seconds=1.0, server_cpu_s=0.0, warmup_s=0.0).images_per_cpu_s is None


def test_capacity_vs_ideal_queue_is_the_measured_fraction_over_the_ideal_one():
    probes = [
        {"saturation": saturation, "errors": errors} for saturation, errors in ((140.0, 0), (150.0, 1), (400.0, 2))
    ]
    figures = capacity_against_ideal(slo_ms=60.0, fraction=0.5, probes=probes, floor_ms=15.0, probe_s=6.0)
    # The ideal queue at the probes' median saturation (150/s; the 400/s outlier left out).
    ideal = ideal_capacity(150.0, 15.0, 60.0, 6.0, CAPACITY_MAX_FRACTION)
    assert 0.5 < ideal < 1.0
    assert figures.ideal_queue_capacity == ideal
    assert figures.capacity_vs_ideal_queue == pytest.approx(0.5 / ideal)  # below 1: the ideal queue did better
    assert figures.errors == 3
    # An SLO the floor alone misses: no ideal capacity, no ratio rather than a division by 0.
    missed = capacity_against_ideal(slo_ms=10.0, fraction=0.0, probes=probes, floor_ms=15.0, probe_s=6.0)
    assert missed.ideal_queue_capacity == 0.0 and missed.capacity_vs_ideal_queue is None
