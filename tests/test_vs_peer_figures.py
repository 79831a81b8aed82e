"""The figures against the peer from known rounds (tritonstack.benchmark.vs_peer):
which side is the numerator of each ratio, the median over rounds, the window the
server's CPU covers. A swapped operand or a wrong window fails here."""

from __future__ import annotations

import pytest

from tritonstack.benchmark.vs_peer import peer_figures, slower_rate
from tritonstack.measure.load_loops import Phase


def phase(images_per_s: float, cpu_ms_per_image: float, seconds: float = 10.0, warmup_s: float = 2.0) -> Phase:
    """A closed loop that answered `images_per_s` for `seconds`, its server using
    `cpu_ms_per_image` over the window with its warm-up."""
    images = round(images_per_s * seconds)
    cpu_s = cpu_ms_per_image / 1000 * images_per_s * (seconds + warmup_s)
    return Phase(latencies_s=[0.05] * images, seconds=seconds, server_cpu_s=cpu_s, warmup_s=warmup_s)


def test_ours_over_the_peers_images_and_our_cpu_over_theirs():
    rounds = {
        "http": [phase(120, 8.0), phase(110, 8.8), phase(130, 8.0)],
        "peer": [phase(100, 10.0), phase(100, 10.0), phase(100, 10.0)],
    }
    figures = peer_figures(rounds, open_loop=None)
    assert figures.vs_peer_throughput.value == pytest.approx(1.2)  # the median of 1.2, 1.1, 1.3
    assert figures.vs_peer_throughput.spread == pytest.approx([1.1, 1.3])
    assert figures.vs_peer_cpu.value == pytest.approx(0.8)  # the median of 0.8, 0.88, 0.8: below 1 is less CPU
    assert figures.peer_images_per_s.value == pytest.approx(100)
    assert figures.peer_cpu_ms_per_image.value == pytest.approx(10.0)
    assert slower_rate(rounds) == pytest.approx(100)


def test_each_ratio_is_taken_within_a_round_before_the_median():
    """A slow round slows both sides: the ratio of the round, not of the medians."""
    rounds = {
        "http": [phase(200, 5.0), phase(100, 5.0), phase(50, 5.0)],
        "peer": [phase(100, 5.0), phase(100, 5.0), phase(25, 5.0)],
    }
    assert peer_figures(rounds, open_loop=None).vs_peer_throughput.value == pytest.approx(2.0)  # 2, 1, 2


def test_the_saturation_p99_is_ours_over_the_peers_within_each_round():
    """Our p99 over the peer's, round by round (40/50, 120/100, 60/80 ms): median 0.8;
    a round where a side answered nothing gives no ratio."""

    def answered(ms_p99: float) -> Phase:
        return Phase(latencies_s=[0.01] * 98 + [ms_p99 / 1000] * 2, seconds=10.0)

    rounds = {
        "http": [answered(40), answered(120), answered(60), Phase(latencies_s=[], seconds=10.0)],
        "peer": [answered(50), answered(100), answered(80), answered(70)],
    }
    saturation_p99 = peer_figures(rounds, open_loop=None).vs_peer_saturation_p99
    assert saturation_p99.value == pytest.approx(0.8, rel=0.01) and saturation_p99.n == 3
    assert saturation_p99.spread == pytest.approx([0.75, 1.2], rel=0.01)


def test_the_peers_own_concurrency_is_reported_and_its_saturation_failures_counted():
    rounds = {"http": [phase(120, 8.0)], "peer": [phase(100, 10.0)]}
    figures = peer_figures(rounds, open_loop=None, saturation=(16, 3))
    assert (figures.peer_best_concurrency, figures.errors) == (16, 3)
    assert peer_figures(rounds, open_loop=None).peer_best_concurrency is None


def test_a_side_not_measured_gives_no_figure_rather_than_a_wrong_one():
    figures = peer_figures({"http": [phase(120, 8.0)]}, open_loop=None)
    assert figures.vs_peer_throughput.value is None and figures.vs_peer_cpu.value is None
    assert figures.int8_vs_peer_throughput.value is None
    assert slower_rate({"http": [phase(120, 8.0)]}) == 0.0


def test_the_cpu_window_includes_the_warmup_at_the_measured_rate():
    measured = phase(100, 10.0, seconds=10.0, warmup_s=5.0)
    assert measured.images_per_cpu_s == pytest.approx(100.0)  # 1500 images over 15 CPU-seconds
    assert Phase(latencies_s=[0.05] * 10, seconds=1.0, server_cpu_s=1.0).images_per_cpu_s is None  # no warm-up known
