"""capacity_at_slo: the highest Poisson rate whose p99 meets the SLO, found by a bisection
of fractions of the saturation, `repeats` times, each against an ideal queue given the
same saturation, SLO, arrivals, probe length and bisection (tritonstack.measure.ideal_queue)."""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack.measure.figures import Median
from tritonstack.measure.ideal_queue import ideal_capacity
from tritonstack.measure.load_loops import CapacitySearch, capacity_at_slo
from tritonstack.measure.load_settings import CAPACITY_MAX_FRACTION, SLO_P50_MULTIPLE, Settings

# Distinct Poisson seeds for every probe of every search (a search makes at most steps + 1).
PROBE_SEEDS_A_SEARCH = 100


@dataclass(frozen=True)
class CapacityFigures:
    capacity_slo_ms: float | None
    capacity_at_slo: Median
    capacity_probes: list[dict]
    ideal_queue_capacity: Median
    capacity_vs_ideal_queue: Median
    errors: int


def capacity_figures(
    server,
    images: list[bytes],
    concurrency: int,
    single_p50_ms: float | None,
    settings: Settings,
    log,
) -> CapacityFigures:
    """capacity_at_slo, `repeats` searches, each against an ideal queue with the same
    SLO, arrivals, probe length and search, the saturation measured before that search
    and the single-request latency (tritonstack.measure.ideal_queue)."""
    if not single_p50_ms:
        return CapacityFigures(None, Median.of([]), [], Median.of([]), Median.of([]), 0)
    slo_ms = SLO_P50_MULTIPLE * single_p50_ms
    log(f"capacity: the highest Poisson rate whose p99 stays under {slo_ms:.1f} ms, {settings.repeats} searches...")
    searches = [
        capacity_at_slo(server, images, concurrency, slo_ms, settings, first_seed=index * PROBE_SEEDS_A_SEARCH)
        for index in range(settings.repeats)
    ]
    return capacity_against_ideal(slo_ms, searches, single_p50_ms, settings)


def capacity_against_ideal(
    slo_ms: float, searches: list[CapacitySearch], floor_ms: float, settings: Settings
) -> CapacityFigures:
    """Each search's capacity over the ideal queue's at that search's saturation, the
    single-request latency `floor_ms`, the same SLO, probe length and bisection (the
    same grid of fractions): medians over the searches, each probe kept with its search."""
    ideals = [
        ideal_capacity(
            search.saturation.images_per_s,
            floor_ms,
            slo_ms,
            settings.capacity_s,
            CAPACITY_MAX_FRACTION,
            settings.capacity_probes,
        )
        for search in searches
    ]
    probes = [probe | {"search": index} for index, search in enumerate(searches, 1) for probe in search.probes]
    return CapacityFigures(
        capacity_slo_ms=slo_ms,
        capacity_at_slo=Median.of([search.fraction for search in searches]),
        capacity_probes=probes,
        ideal_queue_capacity=Median.of(ideals),
        # An SLO the floor alone misses gives no ideal capacity: no ratio, not a division by 0.
        capacity_vs_ideal_queue=Median.of(
            [search.fraction / ideal for search, ideal in zip(searches, ideals) if ideal]
        ),
        errors=sum(search.saturation.errors for search in searches) + sum(probe["errors"] for probe in probes),
    )
