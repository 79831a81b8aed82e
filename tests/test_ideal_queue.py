"""The benchmark's ideal queue (M/D/1 shifted by the single-request latency): the
yardstick of capacity_vs_ideal_queue. Pure: no server."""

import math

import numpy as np

from tritonstack.measure import ideal_queue
from tritonstack.measure.ideal_queue import ideal_capacity


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


def md1_wait_cdf(wait_s: float, rho: float, service_s: float) -> float:
    """Erlang's M/D/1 waiting-time distribution: P(W <= x) = (1 - rho) * sum over
    k <= x/D of (lambda (kD - x))^k / k! * exp(-lambda (kD - x)) (exact; fine for x of a
    few D, before the alternating terms cancel)."""
    rate = rho / service_s
    return (1 - rho) * sum(
        (rate * (k * service_s - wait_s)) ** k / math.factorial(k) * math.exp(-rate * (k * service_s - wait_s))
        for k in range(int(wait_s // service_s) + 1)
    )


def test_the_modules_p99_is_the_md1_p99_plus_the_floor():
    """The module's p99 against the one Erlang's formula gives, on a window long enough
    for the sample p99 to settle (180,000 arrivals), the floor added once."""
    service_s, rho, floor_ms = 0.01, 0.6, 7.0
    low, high = 0.0, 10 * service_s
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if md1_wait_cdf(middle, rho, service_s) < 0.99 else (low, middle)
    exact_ms = high * 1000  # 45.5 ms
    simulated = ideal_queue.p99_ms(rho, service_s, floor_ms, 3000.0, seed=3)
    assert abs(simulated - floor_ms - exact_ms) < 0.05 * exact_ms, (simulated, exact_ms)
    assert ideal_queue.p99_ms(rho, service_s, floor_ms, 60.0, seed=3) == ideal_queue.p99_ms(
        rho, service_s, floor_ms, 60.0, seed=3
    )  # seeded: the same inputs give the same figure


def test_capacity_rises_with_the_slo_and_stops_at_its_bounds():
    saturation, floor_ms, seconds = 150.0, 15.0, 6.0
    assert ideal_capacity(saturation, floor_ms, floor_ms * 0.9, seconds, 1.1) == 0.0  # the floor alone misses it
    tight, loose = (ideal_capacity(saturation, floor_ms, slo, seconds, 1.1) for slo in (30.0, 120.0))
    assert 0.0 < tight < loose < 1.0
    assert ideal_capacity(saturation, floor_ms, 60_000.0, seconds, 1.1) == 1.1  # any backlog fits a minute
