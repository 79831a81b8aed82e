"""The benchmark's formulas on known inputs (tritonstack/benchmark/): the closed loop's
window, images per CPU-second, capacity against the ideal queue, the interval of a
median and the verdict it gives a target, the peer's open-loop seeds. A flipped ratio, a
wrong window or a dropped term fails here. Pure: no server."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tritonstack.benchmark.capacity import capacity_against_ideal
from tritonstack.benchmark.serving_ratios import ROUND_CPU_RATIOS, ROUND_RATIOS, round_figures
from tritonstack.benchmark.vs_peer import seeded_rounds
from tritonstack.measure.figures import Median
from tritonstack.measure.ideal_queue import ideal_capacity
from tritonstack.measure.load_loops import CapacitySearch, Ended, Phase, window_phase
from tritonstack.measure.load_settings import CAPACITY_MAX_FRACTION, QUICK, Settings
from tritonstack.measure.results import TARGETS, target_verdict, targets_with_verdict
from tritonstack.measure.rounds import interleaved


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


def known_search(saturation_per_s: float, fraction: float, saturation_errors: int = 0) -> CapacitySearch:
    saturation = Phase(latencies_s=[0.01] * int(saturation_per_s * 10), seconds=10.0, errors=saturation_errors)
    return CapacitySearch(saturation, fraction, [{"fraction": 1.1, "errors": 1}, {"fraction": fraction, "errors": 0}])


def test_capacity_vs_ideal_queue_is_each_searchs_fraction_over_its_own_ideal_queue():
    settings = dataclasses.replace(QUICK, capacity_s=6.0, capacity_probes=4)
    searches = [known_search(140.0, 0.5), known_search(150.0, 0.55, saturation_errors=2), known_search(400.0, 0.9)]
    figures = capacity_against_ideal(slo_ms=60.0, searches=searches, floor_ms=15.0, settings=settings)
    # Each ideal queue at its own search's saturation, searched on the server's grid.
    ideals = [ideal_capacity(rate, 15.0, 60.0, 6.0, CAPACITY_MAX_FRACTION, steps=4) for rate in (140.0, 150.0, 400.0)]
    assert all(0 < ideal <= CAPACITY_MAX_FRACTION for ideal in ideals)
    assert all(
        ideal / (CAPACITY_MAX_FRACTION / 2**4) == pytest.approx(round(ideal / (CAPACITY_MAX_FRACTION / 2**4)))
        for ideal in ideals
    )
    assert figures.ideal_queue_capacity.value == pytest.approx(np.median(ideals))
    ratios = [0.5 / ideals[0], 0.55 / ideals[1], 0.9 / ideals[2]]  # below 1: the ideal queue did better
    assert figures.capacity_vs_ideal_queue.value == pytest.approx(np.median(ratios))
    assert figures.capacity_vs_ideal_queue.n == 3 and figures.capacity_vs_ideal_queue.interval is not None
    assert figures.capacity_at_slo.value == 0.55
    assert [probe["search"] for probe in figures.capacity_probes] == [1, 1, 2, 2, 3, 3]
    assert figures.errors == 2 + 3  # the saturations' and every probe's
    # An SLO the floor alone misses: no ideal capacity, no ratio rather than a division by 0.
    missed = capacity_against_ideal(slo_ms=10.0, searches=searches, floor_ms=15.0, settings=settings)
    assert missed.ideal_queue_capacity.value == 0.0 and missed.capacity_vs_ideal_queue.value is None


def test_a_median_carries_a_bootstrap_interval_narrower_than_its_spread_with_more_rounds():
    nine = Median.of([5.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0])
    assert (nine.value, nine.spread, nine.n) == (5.0, [1.0, 9.0], 9)
    # A resampled median of 9 lands on the lowest or highest value in 0.2 % of draws,
    # at or below the second in 3 %: the 95 % interval is [2, 8], not the spread.
    assert nine.interval == [2.0, 8.0]
    assert Median.of([1.0, 2.0, 3.0, 4.0, 5.0]).interval == [1.0, 5.0]  # with 5, as wide as the rounds
    assert Median.of([2.0]).interval is None and Median.of([2.0]).n == 1  # one round: no interval
    assert Median.of([0.9, 1.0, 1.1, 1.2, 1.3]).interval == Median.of([1.3, 1.2, 1.1, 1.0, 0.9]).interval  # seeded


@pytest.mark.parametrize(
    ("value", "interval", "sense", "target", "verdict"),
    [
        (1.03, [1.01, 1.05], ">=", 1.0, "met"),
        (1.03, [0.98, 1.06], ">=", 1.0, "inconclusive"),  # the median above, the interval across
        (0.97, [0.98, 1.06], ">=", 1.0, "inconclusive"),
        (0.95, [0.93, 0.99], ">=", 1.0, "missed"),
        (0.8, [0.7, 0.9], "<=", 1.0, "met"),
        (0.9, [0.8, 1.1], "<=", 1.0, "inconclusive"),
        (1.2, [1.1, 1.3], "<=", 1.0, "missed"),
        (1.2, None, "<=", 1.0, "missed"),  # a single measure: its value decides
        (0.9, None, ">=", 1.0, "missed"),
    ],
)
def test_a_target_is_met_or_missed_only_by_its_whole_interval(value, interval, sense, target, verdict):
    assert target_verdict(value, interval, sense, target) == verdict


def test_the_report_lists_inconclusive_targets_with_interval_and_n():
    results = {key: None for key in TARGETS}
    results |= {"vs_peer_throughput": 1.031, "vs_peer_throughput_interval": [0.98, 1.06], "vs_peer_throughput_n": 5}
    results |= {"vs_peer_cpu": 1.2, "vs_peer_cpu_interval": [1.1, 1.3], "vs_peer_cpu_n": 5}
    assert targets_with_verdict(results, "inconclusive") == [
        "vs_peer_throughput = 1.031 [0.98, 1.06] n=5 (target >= 1.0)"
    ]
    assert targets_with_verdict(results, "missed") == ["vs_peer_cpu = 1.2 [1.1, 1.3] n=5 (target <= 1.0)"]


def test_the_peers_open_loop_rounds_share_arrivals_within_a_round_and_not_across():
    seeds: list[tuple[str, int]] = []
    measures = seeded_rounds(("ours", "peer"), lambda side, seed: seeds.append((side, seed)))
    interleaved(measures, repeats=3, log=lambda _: None)
    assert seeds == [("ours", 0), ("peer", 0), ("ours", 1), ("peer", 1), ("ours", 2), ("peer", 2)]


def rate_phase(images_per_s: float, images_per_cpu_s: float) -> Phase:
    """A 10 s round (2 s of warm-up) at `images_per_s`, its server at `images_per_cpu_s`."""
    return Phase(
        latencies_s=[0.05] * round(images_per_s * 10),
        seconds=10.0,
        warmup_s=2.0,
        server_cpu_s=images_per_s * 12 / images_per_cpu_s,
        client_cpu_s=3.0,
    )


def test_each_round_ratio_is_its_numerator_over_its_denominator_per_round():
    """Every ratio of run.ROUND_RATIOS and ROUND_CPU_RATIOS from rounds whose rates are
    known: each numerator twice its denominator in images/s, thrice in images/CPU-s
    (a swapped ratio reads 0.5 or 0.33)."""
    names = {name for pair in (*ROUND_RATIOS.values(), *ROUND_CPU_RATIOS.values()) for name in pair}
    rates = {"inprocess": 100.0, "grpc": 200.0, "http": 400.0, "pil_ensemble": 100.0}
    rates |= {"dali_preprocess": 800.0, "pil_preprocess": 400.0, "int8_ensemble": 400.0}
    per_cpu = {"inprocess": 100.0, "grpc": 300.0, "dali_preprocess": 900.0, "pil_preprocess": 300.0}
    rounds = {name: [rate_phase(rates[name], per_cpu.get(name, 50.0))] * 3 for name in names}
    figures = round_figures(rounds, Settings(10.0, 2.0, (8,), (), 10.0), saturation_errors=1)
    for key in ROUND_RATIOS:
        assert getattr(figures, key).value == pytest.approx(2.0), key
        assert getattr(figures, key).n == 3, key
    for key in ROUND_CPU_RATIOS:
        assert getattr(figures, key).value == pytest.approx(3.0), key
    assert figures.server_images_per_s.value == pytest.approx(200.0)
    assert figures.server_images_per_cpu_s.value == pytest.approx(300.0)
    assert figures.client_cpu_share == pytest.approx(0.25)  # 3 CPU-s over 12 s
    assert figures.errors == 1
