"""`tritonstack compare`'s verdict on known rounds (tritonstack/experiments/interleaved.py):
B is faster or slower than A only where the 95 % bootstrap interval of the median
B/A lies wholly on one side of 1. Fake rounds given as numbers: no server."""

from __future__ import annotations

from tritonstack.experiments import interleaved
from tritonstack.measure.figures import Median, median_interval
from tritonstack.measure.load_loops import Phase

MODEL = "m"


def rounds(a_rates: list[float], b_rates: list[float], a_p99_ms: float = 50.0, b_p99_ms: float = 50.0) -> dict:
    """Each round's Phase of A and B: the given rate (images/s) and every latency at the given p99."""

    def phase(rate: float, p99_ms: float) -> Phase:
        return Phase(latencies_s=[p99_ms / 1000] * 10, images=int(rate), seconds=1.0)

    return {
        ("a", MODEL): [phase(rate, a_p99_ms) for rate in a_rates],
        ("b", MODEL): [phase(rate, b_p99_ms) for rate in b_rates],
    }


A = [100, 100, 100, 100, 100, 100, 100]
STRADDLING = [103, 97, 105, 99, 102, 98, 104]  # median B/A 1.02, rounds on both sides of 1
CLEARLY_ABOVE = [110, 112, 109, 111, 113, 108, 114]  # every round 8-14 % faster


def test_a_ratio_whose_interval_holds_1_is_inconclusive():
    figures = interleaved.summary(rounds(A, STRADDLING), [MODEL])[MODEL]
    assert figures["b_over_a"] > 1  # the median alone would call it faster
    low, high = figures["b_over_a_interval"]
    assert low < 1 < high and figures["b_over_a_n"] == 7
    assert figures["b_over_a_verdict"] == "inconclusive"


def test_a_ratio_clearly_above_1_is_faster_and_swapping_the_sides_makes_it_slower():
    figures = interleaved.summary(rounds(A, CLEARLY_ABOVE), [MODEL])[MODEL]
    assert figures["b_over_a_interval"] == median_interval([b / a for a, b in zip(A, CLEARLY_ABOVE)])
    assert 1 < figures["b_over_a_interval"][0] <= figures["b_over_a"] <= figures["b_over_a_interval"][1]
    assert figures["b_over_a_n"] == 7 and figures["b_over_a_verdict"] == "faster"
    swapped = interleaved.summary(rounds(CLEARLY_ABOVE, A), [MODEL])[MODEL]
    assert swapped["b_over_a_interval"][1] < 1 and swapped["b_over_a_verdict"] == "slower"
    straddling_swapped = interleaved.summary(rounds(STRADDLING, A), [MODEL])[MODEL]
    assert straddling_swapped["b_over_a_verdict"] == "inconclusive"


def test_a_lower_p99_is_faster_and_a_higher_one_slower():
    """B/A p99 below 1 is B faster: the sense of a latency is the rate's, inverted."""
    lower = interleaved.summary(rounds(A, A, a_p99_ms=50.0, b_p99_ms=40.0), [MODEL])[MODEL]
    assert lower["b_over_a_ms_p99"] == 0.8 and lower["b_over_a_ms_p99_verdict"] == "faster"
    assert lower["b_over_a_verdict"] == "inconclusive"  # equal rates: the interval is [1, 1], no change
    higher = interleaved.summary(rounds(A, A, a_p99_ms=40.0, b_p99_ms=50.0), [MODEL])[MODEL]
    assert higher["b_over_a_ms_p99_verdict"] == "slower"


def test_one_round_gives_no_interval_and_no_verdict():
    assert interleaved.change_verdict(Median.of([1.5])) == "inconclusive"
    assert interleaved.change_verdict(Median.of([])) == "inconclusive"


def test_the_printed_table_gives_each_ratio_with_its_interval_n_and_verdict():
    results = {
        "models": interleaved.summary(rounds(A, CLEARLY_ABOVE), [MODEL]),
        "server_rss_mb": {"a": 100.0, "b": 100.0},
    }
    printed = interleaved.table(results)
    low, high = results["models"][MODEL]["b_over_a_interval"]
    assert f"[{low:.3f}, {high:.3f}] n=7 faster" in printed
