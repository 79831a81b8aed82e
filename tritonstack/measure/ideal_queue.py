"""What an ideal server would sustain under the benchmark's SLO: the yardstick of
`capacity_vs_ideal_queue`.

The ideal server is one queue in front of one worker that takes exactly 1/μ per
image (μ: the measured saturation rate) and adds the measured single-request latency
L0 to every answer (network, both models, hand-offs): an M/D/1 queue shifted by L0.
It sees the arrivals the real probes see (Poisson at fraction × μ, for as long as
one probe), and its p99 is what the SLO is held to. No real server beats it at the
same μ and L0, so the ratio of the measured capacity to its capacity says how much
of the gap is ours rather than queueing itself. Seeded: the same inputs give the
same figure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

SEEDS = 20  # simulated probes per fraction: a stable p99 from short windows
STEPS = 30  # bisection steps: far below the measured fraction's own resolution


def p99_ms(fraction: float, service_s: float, floor_ms: float, seconds: float, seed: int) -> float:
    """p99 latency of one simulated probe: Poisson arrivals at fraction / service_s
    for `seconds`, waits by Lindley's recursion, plus the floor."""
    rate = fraction / service_s
    count = max(int(rate * seconds), 1)
    gaps = np.random.default_rng(seed).exponential(1 / rate, count)
    waits = np.empty(count)
    wait = 0.0
    for index, gap in enumerate(gaps):
        wait = max(0.0, wait + service_s - gap) if index else 0.0
        waits[index] = wait
    return float(np.percentile(waits, 99)) * 1000 + floor_ms


def meets_slo(fraction: float, service_s: float, floor_ms: float, slo_ms: float, seconds: float) -> bool:
    return float(np.median([p99_ms(fraction, service_s, floor_ms, seconds, seed) for seed in range(SEEDS)])) < slo_ms


def ideal_capacity(
    saturation_per_s: float, floor_ms: float, slo_ms: float, seconds: float, bound: float, steps: int = STEPS
) -> float:
    """The highest fraction of saturation (up to `bound`) whose simulated p99 stays
    under `slo_ms`, found by `highest_passing` in `steps` (the benchmark gives the
    server's own, so both are read on the same grid); 0 when even an idle queue's
    floor misses it."""
    service_s = 1 / saturation_per_s
    return highest_passing(lambda fraction: meets_slo(fraction, service_s, floor_ms, slo_ms, seconds), bound, steps)


def highest_passing(meets: Callable[[float], bool], bound: float, steps: int) -> float:
    """`bound` if it passes, else a bisection of [0, bound] in `steps` probes: the
    highest passing value found (0 when none passed), within bound / 2**steps of
    the threshold when passing is monotonic. The search of the measured capacity and
    of the ideal queue's alike."""
    if meets(bound):
        return bound
    low, high = 0.0, bound
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low
