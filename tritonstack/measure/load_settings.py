"""How long the load loops measure (FULL, QUICK, SMOKE), LoadGen's plan, the SLO and
load fractions."""

from __future__ import annotations

from dataclasses import dataclass

REQUEST_TIMEOUT_S = 60.0


# LoadGen's early stopping judges a p99 only after ~460 queries all in time, more with a
# few late ones: below that a Server run is INVALID whatever its latencies.
SERVER_MIN_QUERIES = 800
# The latency bound of LoadGen's Server runs: a p99 a user of an interactive service accepts.
P99_BOUND_MS = 150.0


@dataclass(frozen=True)
class LoadGenPlan:
    """What `loadgen_figures` runs for each side: Offline at the side's own best
    concurrency, `offline_rounds` times interleaved with the other side's (a ratio per
    round, as the closed loops'), then the Server search between `low` and `high` times
    the median Offline throughput for the highest rate LoadGen judges VALID: its
    `percentile` latency under `bound_ms`."""

    bound_ms: float
    offline_seconds: float
    server_seconds: float
    steps: int
    offline_rounds: int = 5
    low: float = 0.4
    high: float = 1.0
    percentile: float = 0.99
    min_queries: int = SERVER_MIN_QUERIES


@dataclass(frozen=True)
class Settings:
    """How long each phase measures; warm-up runs before every measurement."""

    seconds: float  # per measured closed-loop phase
    warmup_s: float
    concurrency: tuple[int, ...]  # in-flight requests tried for saturation
    inprocess_grid: tuple[tuple[int, int, int], ...]  # (batch, DALI threads, ORT threads)
    open_loop_s: float
    # Interleaved rounds per ratio: at least 5 for a 95 % interval of the median. The
    # [min, max] of n rounds covers the true median with probability 1 - 2 / 2**n: 75 %
    # with 3, 94 % with 5 (where the bootstrap interval is about [min, max] too).
    repeats: int = 5
    capacity_probes: int = 4  # bisection steps after the first probe at the upper bound
    capacity_s: float = 8.0  # per capacity probe
    traced_requests: int = 100  # at concurrency 1 with Triton's tracing on
    open_loop_min_requests: int = 1000  # per open-loop phase: a p99 from ~10 slowest, not from one
    loadgen: LoadGenPlan | None = None  # MLPerf's LoadGen against ours and the peer (tritonstack/measure/loadgen.py)


FULL = Settings(
    20.0,
    3.0,
    (8, 16, 32, 48),
    ((1, 1, 1), (8, 1, 1), (32, 1, 1), (8, 2, 1), (8, 1, 2), (32, 2, 2)),
    30.0,
    repeats=5,
    capacity_probes=6,
    capacity_s=20.0,
    traced_requests=300,
    loadgen=LoadGenPlan(P99_BOUND_MS, offline_seconds=20.0, server_seconds=15.0, steps=5),
)


QUICK = Settings(
    5.0,
    1.0,
    (8, 24),
    ((8, 1, 1), (32, 1, 1), (8, 2, 2)),
    10.0,
    repeats=5,
    capacity_probes=4,
    capacity_s=6.0,
    loadgen=LoadGenPlan(P99_BOUND_MS, offline_seconds=6.0, server_seconds=6.0, steps=3),
)


# For the test suite: every key, in the least time that still measures something.
SMOKE = Settings(
    0.6,
    0.2,
    (4,),
    ((8, 2, 2),),
    1.5,
    repeats=2,
    capacity_probes=1,
    capacity_s=1.0,
    open_loop_min_requests=0,
    # The 90th percentile: LoadGen's early stopping is met by ~50 queries, not ~460.
    loadgen=LoadGenPlan(
        P99_BOUND_MS,
        offline_seconds=0.5,
        server_seconds=0.5,
        steps=1,
        percentile=0.9,
        min_queries=48,
        offline_rounds=2,
    ),
)


# capacity_at_slo: the p99 budget, in single-request medians, and the search's upper bound.
SLO_P50_MULTIPLE = 8.0


# p99_over_p50 is measured at this fraction of saturation.
OPEN_LOOP_LOAD = 0.7


CAPACITY_MAX_FRACTION = 1.1
