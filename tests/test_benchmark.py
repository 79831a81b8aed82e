"""The benchmark writes every key it promises, each median of every round, on the
session's real server (the shortest settings: figures are rough, keys are real).
Performance itself is never asserted here."""

import dataclasses
import json
import math

import pytest

from tritonstack.benchmark import serving_ratios, single
from tritonstack.measure import ideal_queue, load_settings, rounds
from tritonstack.measure import results as result_keys


def test_benchmark_writes_every_key(server, model_repository, tmp_path):
    loadgen_logs = tmp_path / "benchmark_loadgen"
    results = serving_ratios.run(
        load_settings.SMOKE, model_repository, lambda _: None, server, loadgen_dir=loadgen_logs
    )
    out = tmp_path / "benchmark.json"
    result_keys.write_results(results, out)
    written = json.loads(out.read_text())

    for key in result_keys.REQUIRED_KEYS:
        assert key in written, key
        assert written[key] is not None, key  # this repository has every preset the benchmark measures
        if isinstance(written[key], float):
            assert math.isfinite(written[key]), key
    assert written["errors"] == 0
    for key in result_keys.RATIO_KEYS:  # every round measured both sides of every ratio
        assert written[f"{key}_n"] == load_settings.SMOKE.repeats, key
    assert isinstance(written["inconclusive_targets"], list)
    for rate in serving_ratios.ROUND_RATES:
        assert written[rate] > 1, rate
    assert written["p99_over_p50"] >= 1
    # Per request, the client waited at least as long as the steps computed.
    assert written["ensemble_overhead_ms_p50"] >= 0
    assert 0 <= written["ensemble_overhead_share"] < 1
    assert set(single.HOPS) <= set(written["ensemble_hops_ms_p50"])
    assert 0 < written["grpc_round_trip_ms_p50"] < written["latency_ms_p50_concurrency_1"]
    assert written["capacity_probes"] and all(probe["rate"] > 0 for probe in written["capacity_probes"])
    for suffix in ("", "_crops"):
        assert 0 <= written[f"int8_top1_agreement{suffix}"] <= 1 and 0 <= written[f"int8_top5_overlap{suffix}"] <= 5
    costs = written["cpu_ms_per_image"]
    assert set(costs) == {"dali", "pil", "pil_8bit", "fp32", "int8", "fp32_two_threads"} and all(
        cost > 0 for cost in costs.values()
    )
    # The peer served the same classifier files beside our server, over the same client.
    assert written["peer_images_per_s"] > 1 and written["int8_peer_images_per_s"] > 1
    assert written["peer_cpu_ms_per_image"] > 0
    latency = written["vs_peer_latency"]
    for side in ("ours", "peer"):
        assert 0 < latency["saturation"][side]["ms_p50"] <= latency["saturation"][side]["ms_p99"]
        assert 0 < latency["open_loop"][side]["ms_p50"] <= latency["open_loop"][side]["ms_p99"]
    # A ceiling is its parts' ratio: INT8 and FP32 share the DALI step.
    assert written["int8_vs_fp32_ensemble_ceiling"] == pytest.approx(
        (costs["dali"] + costs["fp32"]) / (costs["dali"] + costs["int8"]), rel=0.25
    )
    assert 100 < written["server_rss_mb"] < 24 * 1024
    assert {"tritonserver", "stub:preprocess_dali_efficientnet_lite0", "stub:efficientnet_lite0_int8"} <= set(
        written["server_rss_mb_by_process"]
    )
    assert written["versions"]["tritonserver"] and written["cpu_count"] >= 1
    assert isinstance(written["missed_targets"], list)
    # LoadGen ran Offline and the Server search against both sides, and its logs are kept.
    for side in ("ours", "peer"):
        assert written["loadgen"][side]["offline_images_per_s"] > 1 and written["loadgen"][side]["server_runs"]
        assert "Result is" in (loadgen_logs / side / "offline_1" / "mlperf_log_summary.txt").read_text()
        assert len(written["loadgen"][side]["offline_rounds"]) == load_settings.SMOKE.loadgen.offline_rounds


def test_a_ratio_is_taken_per_round_and_skips_empty_ones():
    values = rounds.ratios([10.0, 0.0, 30.0, None, 12.0], [5.0, 5.0, 0.0, 4.0, 4.0])
    assert values == [2.0, 0.0, 3.0]  # a zero or missing denominator gives no ratio, not a crash


def test_capacity_search_is_a_bounded_bisection():
    probed = []

    def below(threshold):
        def meets(fraction):
            probed.append(fraction)
            return fraction <= threshold

        return meets

    found = ideal_queue.highest_passing(below(0.8), 1.1, steps=4)
    assert probed == pytest.approx([1.1, 0.55, 0.825, 0.6875, 0.75625])  # the bound, then 4 halvings
    assert found == pytest.approx(0.75625) and 0.8 - found <= 1.1 / 2**4
    probed.clear()
    assert ideal_queue.highest_passing(below(2.0), 1.1, steps=4) == 1.1 and probed == [1.1]
    assert ideal_queue.highest_passing(below(-1.0), 1.1, steps=3) == 0.0


def test_a_missed_ratio_names_the_ceiling_this_cpu_sets():
    results = {key: None for key in result_keys.TARGETS}
    results |= {
        "int8_vs_fp32_ensemble": 1.2,
        "int8_vs_fp32_ensemble_ceiling": 1.38,
        "dali_vs_pil_ensemble": 1.6,
        "dali_vs_pil_ensemble_ceiling": 1.13,
    }
    assert result_keys.targets_with_verdict(results, "missed") == [
        "int8_vs_fp32_ensemble = 1.2 (target >= 1.5; this CPU's ceiling 1.38)"
    ]


def test_regions_benchmark_writes_its_figures(server):
    from tritonstack.benchmark.region_speedup import run_regions

    # Rounds of 3 s: a one-second round on a loaded machine may end before a photo's crops are answered.
    written = run_regions(server, 4, dataclasses.replace(load_settings.SMOKE, seconds=3.0), log=lambda _: None)
    assert written["boxes"] == 4 and written["errors"] == 0
    # A round that measured nothing is skipped, not every round.
    for key in ("regions_crops_per_s", "per_crop_crops_per_s", "regions_crops_per_cpu_s", "per_crop_crops_per_cpu_s"):
        assert written[f"{key}_n"] >= 1 and written[f"{key}_spread"][0] > 0, key
    for key in ("regions_speedup", "regions_speedup_per_cpu_s"):
        if written[key] is not None:  # None: no round measured both sides
            assert written[f"{key}_spread"][0] > 0, key
