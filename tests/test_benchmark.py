"""The benchmark writes every key it promises, with consistent ratios, on the
session's real server (the shortest settings: figures are rough, keys are real)."""

import json
import math

from loadtests import benchmark


def test_benchmark_writes_every_key(server, model_repository, tmp_path):
    results = benchmark.run(benchmark.SMOKE, model_repository, log=lambda _: None, server=server)
    out = tmp_path / "benchmark.json"
    benchmark.write_results(results, out)
    written = json.loads(out.read_text())

    for key in benchmark.REQUIRED_KEYS:
        assert key in written, key
    assert written["errors"] == 0
    for key in benchmark.REQUIRED_KEYS:
        if isinstance(written[key], float):
            assert math.isfinite(written[key]), key
    for rate in ("inprocess_images_per_s", "server_images_per_s", "dali_preprocess_images_per_s",
                 "pil_preprocess_images_per_s", "http_images_per_s", "pil_ensemble_images_per_s"):
        assert written[rate] > 1, rate
    assert math.isclose(written["serving_efficiency"],
                        written["server_images_per_s"] / written["inprocess_images_per_s"])
    assert math.isclose(written["dali_vs_pil_preprocess"],
                        written["dali_preprocess_images_per_s"] / written["pil_preprocess_images_per_s"])
    assert written["p99_over_p50"] >= 1
    # Per request, the client waited at least as long as the steps computed.
    assert written["ensemble_overhead_ms_p50"] >= 0
    assert 100 < written["server_rss_mb"] < 24 * 1024
    assert written["versions"]["tritonserver"] and written["cpu_count"] >= 1
    assert isinstance(written["missed_targets"], list)
