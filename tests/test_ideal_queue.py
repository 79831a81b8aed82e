"""The benchmark's ideal queue (M/D/1 shifted by the single-request latency): the
yardstick of capacity_vs_ideal_queue. Pure: no server."""

import numpy as np

from tritonstack.benchmark import ideal_queue
from tritonstack.benchmark.ideal_queue import ideal_capacity


def test_waits_match_the_md1_mean_wait():
    """Pollaczek-Khinchine for deterministic service: mean wait = rho / (2 mu (1 - rho))."""
    service_s, rho = 0.01, 0.6
    rate = rho / service_s
    gaps = np.random.default_rng(1).exponential(1 / rate, 200_000)
    wait, total = 0.0, 0.0
    for gap in gaps[1:]:
        wait = max(0.0, wait + service_s - gap)
        total += wait
    expected = rho * service_s / (2 * (1 - rho))
    assert abs(total / (len(gaps) - 1) - expected) < 0.05 * expected
    # the module's own recursion gives the same p99 for the same seed
    assert ideal_queue.p99_ms(rho, service_s, 0.0, 60.0, seed=3) == ideal_queue.p99_ms(
        rho, service_s, 0.0, 60.0, seed=3
    )


def test_capacity_rises_with_the_slo_and_stops_at_its_bounds():
    saturation, floor_ms, seconds = 150.0, 15.0, 6.0
    assert ideal_capacity(saturation, floor_ms, floor_ms * 0.9, seconds, 1.1) == 0.0  # the floor alone misses it
    tight, loose = (ideal_capacity(saturation, floor_ms, slo, seconds, 1.1) for slo in (30.0, 120.0))
    assert 0.0 < tight < loose < 1.0
    assert ideal_capacity(saturation, floor_ms, 60_000.0, seconds, 1.1) == 1.1  # any backlog fits a minute
