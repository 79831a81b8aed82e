"""The served cost beside its floors (tritonstack.benchmark.cost.serving_cost), on known
inputs: which figure is which side of each ratio, round i served over round i in
process, and a round missing a side giving no ratio. Pure: no server."""

import pytest

from tritonstack.benchmark.cost import figures_of_costs, serving_cost
from tritonstack.measure.load_loops import Phase
from tritonstack.measure.measured_models import CLASSIFIER, DALI_PREPROCESS

# Three in-process rounds of each library, CPU ms per image.
FLOORS = {
    "dali": [2.0, 2.0, 2.0],
    "pil": [2.75, 2.75, 2.75],
    "pil_8bit": [4.0, 4.0, 5.0],
    "fp32": [9.0, 9.0, 10.0],
    "int8": [5.0, 5.0, 5.0],
    "fp32_two_threads": [9.9, 11.7, 10.0],
}


def served_round(dali: float, classifier: float, tritonserver: float = 1.0) -> dict[str, float]:
    return {"tritonserver": tritonserver, DALI_PREPROCESS: dali, CLASSIFIER: classifier, "efficientnet_lite2": 0.01}


def test_each_step_is_measured_against_its_own_library():
    rounds = [served_round(3.0, 10.0), served_round(3.0, 10.0), served_round(3.0, 10.0)]
    cost = serving_cost(rounds, FLOORS)
    assert "efficientnet_lite2" not in cost.served_cpu_ms_per_image  # a model the rounds did not call
    assert cost.served_overhead_ms_per_image == {DALI_PREPROCESS: 1.0, CLASSIFIER: 1.0, "tritonserver": 1.0}
    # All served over dali + fp32, round by round: 14 / 11, 14 / 11, 14 / 12.
    assert cost.served_vs_floor.value == pytest.approx(14.0 / 11.0, abs=1e-3)
    assert cost.served_vs_floor.spread == pytest.approx([14.0 / 12.0, 14.0 / 11.0], abs=1e-3)
    assert cost.served_vs_floor.n == 3
    # The DALI step served over the peer's Pillow: 3 / 4, 3 / 4, 3 / 5.
    assert cost.served_dali_vs_peer_preprocess.value == pytest.approx(0.75)
    assert cost.served_dali_vs_peer_preprocess.spread == pytest.approx([0.6, 0.75])


def test_round_i_served_is_set_against_round_i_in_process():
    rounds = [served_round(3.0, 10.0), served_round(3.0, 10.0), served_round(4.0, 12.0)]
    cost = serving_cost(rounds, FLOORS)
    # 14 / 11, 14 / 11, 17 / 12: the third served round against the third floor.
    assert cost.served_vs_floor.spread == pytest.approx([14.0 / 11.0, 17.0 / 12.0], abs=1e-3)
    assert cost.served_dali_vs_peer_preprocess.spread == pytest.approx([0.75, 0.8])


def test_the_interval_holds_the_median_of_five_rounds():
    floors = {"dali": [2.0] * 5, "fp32": [9.0] * 5, "pil_8bit": [4.0] * 5}
    rounds = [served_round(3.0, classifier) for classifier in (9.5, 10.0, 10.5, 11.0, 11.5)]
    cost = serving_cost(rounds, floors)
    low, high = cost.served_vs_floor.interval
    assert cost.served_vs_floor.value == pytest.approx(14.5 / 11.0, abs=1e-3)  # 1 + 3 + 10.5 over 2 + 9
    assert low <= cost.served_vs_floor.value <= high
    assert low >= 13.5 / 11.0 - 1e-9 and high <= 15.5 / 11.0 + 1e-9


def test_a_missing_side_gives_no_ratio_rather_than_a_wrong_one():
    without_classifier = {"tritonserver": 1.0, DALI_PREPROCESS: 3.0}
    cost = serving_cost([without_classifier] * 3, FLOORS)
    assert cost.served_vs_floor.value is None
    assert CLASSIFIER not in cost.served_overhead_ms_per_image
    assert serving_cost([{DALI_PREPROCESS: 3.0}], {"dali": [2.0]}).served_dali_vs_peer_preprocess.value is None
    # One round without its classifier: that round gives no ratio, the others do.
    cost = serving_cost([served_round(3.0, 10.0), without_classifier, served_round(3.0, 10.0)], FLOORS)
    assert cost.served_vs_floor.n == 2


def test_cpu_per_image_counts_the_warmup_window_at_the_measured_rate():
    # 100 images in 10 s counted, after 2 s of warm-up: 120 images over the 12 s of CPU.
    phase = Phase(latencies_s=[0.05] * 100, seconds=10.0, warmup_s=2.0)
    phase.server_cpu_by_model_s = {"tritonserver": 0.12, CLASSIFIER: 1.2}
    assert phase.cpu_ms_per_image_by_model == pytest.approx({"tritonserver": 1.0, CLASSIFIER: 10.0})
    other = Phase(latencies_s=[0.05] * 100, seconds=10.0, warmup_s=2.0, server_cpu_by_model_s={CLASSIFIER: 2.4})
    cost = serving_cost(
        [phase.cpu_ms_per_image_by_model, other.cpu_ms_per_image_by_model, Phase().cpu_ms_per_image_by_model], {}
    )
    assert cost.served_cpu_ms_per_image == pytest.approx({"tritonserver": 1.0, CLASSIFIER: 15.0})


def test_the_in_process_ratios_are_taken_round_by_round_each_the_right_way_up():
    figures = figures_of_costs(FLOORS)
    assert figures.cpu_ms_per_image["fp32"] == 9.0 and figures.cpu_ms_per_image_spread["fp32"] == [9.0, 10.0]
    # (dali + fp32) / (dali + int8): 11/7, 11/7, 12/7
    assert figures.int8_vs_fp32_ensemble_ceiling.value == pytest.approx(11 / 7)
    # (pil + fp32) / (dali + fp32): 11.75/11, 11.75/11, 12.75/12
    assert figures.dali_vs_pil_ensemble_ceiling.value == pytest.approx(11.75 / 11)
    # two threads over one: 1.1, 1.3, 1.0 -> 1.1 (the ratio of the medians, 10.0 / 9.0, would read 1.11)
    assert figures.classifier_two_threads_vs_one_cpu.value == pytest.approx(1.1)
    assert figures.classifier_two_threads_vs_one_cpu.n == 3
