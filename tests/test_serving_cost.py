"""The served cost beside its floors (tritonstack.benchmark.cost.serving_cost), on known
inputs: which figure is which side of each ratio. Pure: no server."""

import pytest

from tritonstack.benchmark.cost import serving_cost
from tritonstack.benchmark.serving_ratios import median_by_model
from tritonstack.measure.load_loops import Phase
from tritonstack.measure.measured_models import CLASSIFIER, DALI_PREPROCESS

FLOORS = {"dali": 2.0, "pil": 2.75, "pil_8bit": 4.0, "fp32": 9.0, "int8": 5.0}


def test_each_step_is_measured_against_its_own_library():
    served = {"tritonserver": 1.0, DALI_PREPROCESS: 3.0, CLASSIFIER: 10.0, "efficientnet_lite2": 0.01}
    cost = serving_cost(served, FLOORS)
    assert "efficientnet_lite2" not in cost.served_cpu_ms_per_image  # a model the rounds did not call
    assert cost.served_overhead_ms_per_image == {DALI_PREPROCESS: 1.0, CLASSIFIER: 1.0, "tritonserver": 1.0}
    assert cost.served_vs_floor == pytest.approx(14.0 / 11.0, abs=1e-3)  # all served over dali + fp32
    assert cost.served_dali_vs_peer_preprocess == pytest.approx(0.75)  # 3.0 served over the peer's 4.0


def test_a_missing_side_gives_no_ratio_rather_than_a_wrong_one():
    cost = serving_cost({"tritonserver": 1.0, DALI_PREPROCESS: 3.0}, FLOORS)  # the classifier not measured
    assert cost.served_vs_floor is None
    assert CLASSIFIER not in cost.served_overhead_ms_per_image
    assert serving_cost({DALI_PREPROCESS: 3.0}, {"dali": 2.0}).served_dali_vs_peer_preprocess is None


def test_cpu_per_image_counts_the_warmup_window_at_the_measured_rate():
    # 100 images in 10 s counted, after 2 s of warm-up: 120 images over the 12 s of CPU.
    phase = Phase(latencies_s=[0.05] * 100, seconds=10.0, warmup_s=2.0)
    phase.server_cpu_by_model_s = {"tritonserver": 0.12, CLASSIFIER: 1.2}
    assert phase.cpu_ms_per_image_by_model == pytest.approx({"tritonserver": 1.0, CLASSIFIER: 10.0})
    other = Phase(latencies_s=[0.05] * 100, seconds=10.0, warmup_s=2.0, server_cpu_by_model_s={CLASSIFIER: 2.4})
    assert median_by_model([phase, other, Phase()]) == pytest.approx({"tritonserver": 1.0, CLASSIFIER: 15.0})
