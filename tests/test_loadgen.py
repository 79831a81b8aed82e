"""MLPerf's LoadGen against the real stack (tritonstack.measure.loadgen): its verdicts
on a real server and on the peer, its logs kept, and the arithmetic around it (the
detail log read back, the search for the highest valid rate) on known inputs."""

from __future__ import annotations

import json

import pytest

from tritonstack.benchmark.peer import peer_server
from tritonstack.measure.loadgen import (
    PeerHttpTarget,
    Scenario,
    ScenarioResult,
    TritonHttpTarget,
    comparison,
    detail_records,
    highest_valid_rate,
    read_result,
    run_scenario,
)
from tritonstack.samples.corpus import VARIANTS, build_corpus

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
PRESET = "dali_efficientnet_lite0"
IMAGES = [image.data for image in build_corpus((VARIANTS[0],))]  # 320 px: short runs
# At the 90th percentile LoadGen's early stopping is satisfied by ~50 queries (~460 at the
# 99th): a VALID run in 6 s.
SERVER_SCENARIO = Scenario.server(8, 5_000, seconds=6, min_queries=48, percentile=0.9)


def detail_line(key: str, value) -> str:
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": 1.0, "namespace": "mlperf::logging"})


def test_the_result_is_read_from_loadgens_detail_log(tmp_path):
    (tmp_path / "mlperf_log_detail.txt").write_text(
        "\n".join(
            [
                detail_line("result_validity", "INVALID"),
                detail_line("result_completed_samples_per_sec", 41.5),
                detail_line("result_scheduled_samples_per_sec", 42.0),
                detail_line("result_99.00_percentile_latency_ns", 123_400_000),
                detail_line("result_min_duration_met", False),
                "a line that is not a record",
            ]
        )
    )
    result = read_result("Server", tmp_path, errors=3)
    assert (result.valid, result.samples_per_s, result.scheduled_per_s, result.p99_ms) == (False, 41.5, 42.0, 123.4)
    assert result.too_short
    assert not result.met


@pytest.mark.parametrize(("constraints_met", "short"), [(True, 38), (False, 0)])
def test_the_queries_early_stopping_asked_for_are_read_when_nothing_else_failed(tmp_path, constraints_met, short):
    (tmp_path / "mlperf_log_detail.txt").write_text(
        "\n".join(
            [
                detail_line("result_validity", "INVALID"),
                detail_line("result_completed_samples_per_sec", 46.2),
                detail_line("result_99.00_percentile_latency_ns", 97_000_000),
                detail_line("result_query_count", 800),
                detail_line("result_perf_constraints_met", constraints_met),
                detail_line("early_stopping_met", False),
                detail_line(
                    "early_stopping_result", " * Run unsuccessful.  * Would need to run at least 38 more queries"
                ),
            ]
        )
    )
    result = read_result("Server", tmp_path)
    assert (result.queries, result.queries_short) == (800, short)


def test_the_last_record_of_a_key_wins():
    assert detail_records("\n".join([detail_line("k", 1), detail_line("k", 2)])) == {"k": 2}


def synthetic(rate: float, limit: float, errors: int = 0) -> ScenarioResult:
    """A Server run that LoadGen judges VALID up to `limit` requests/s."""
    return ScenarioResult("Server", rate <= limit, rate, rate, 10.0 if rate <= limit else 999.0, errors, None)


def test_the_search_finds_the_highest_valid_rate_within_its_resolution():
    best, runs = highest_valid_rate(lambda rate: synthetic(rate, limit=73.0), low=10, high=200, steps=8)
    assert best is not None and 73.0 - (200 - 10) / 2**7 <= best.samples_per_s <= 73.0
    assert all(run.met == (run.samples_per_s <= 73.0) for run in runs)


def test_a_rate_answered_with_errors_is_not_a_valid_rate():
    best, _ = highest_valid_rate(lambda rate: synthetic(rate, limit=500.0, errors=int(rate > 50)), 10, 200, 8)
    assert best is not None and 45 <= best.samples_per_s <= 50


def test_the_search_stops_when_the_lowest_rate_fails():
    best, runs = highest_valid_rate(lambda rate: synthetic(rate, limit=5.0), low=10, high=200)
    assert best is None and len(runs) == 1


def side(offline_rounds: list[float | None], server_valid_rate: float | None) -> dict:
    return {"offline_rounds": offline_rounds, "server_valid_rate": server_valid_rate}


def test_ours_over_the_peers_offline_round_by_round_and_server_rate():
    figures = {"ours": side([120.0, 100.0, 110.0], 90.0), "peer": side([100.0, 100.0, 100.0], 60.0)}
    compared = comparison(figures)
    # Round by round, ours over the peer's: 1.2, 1.0, 1.1.
    assert compared.loadgen_vs_peer_offline.value == pytest.approx(1.1)
    assert compared.loadgen_vs_peer_offline.spread == pytest.approx([1.0, 1.2])
    assert compared.loadgen_vs_peer_offline.n == 3
    assert compared.loadgen_vs_peer_server == pytest.approx(1.5)


def test_a_round_not_valid_gives_no_offline_ratio_and_no_rate_no_server_ratio():
    compared = comparison({"ours": side([120.0, None, 110.0], None), "peer": side([100.0, 100.0, None], 60.0)})
    assert compared.loadgen_vs_peer_offline.value == pytest.approx(1.2)  # only round 1 has both sides
    assert compared.loadgen_vs_peer_offline.n == 1
    assert compared.loadgen_vs_peer_server is None
    assert comparison(None).loadgen_vs_peer_offline.value is None


def test_loadgen_judges_our_server_and_keeps_its_logs(server, tmp_path):
    target = TritonHttpTarget(server.http_url, ENSEMBLE)
    met = run_scenario(target, IMAGES, SERVER_SCENARIO, tmp_path / "a")
    assert met.valid and met.errors == 0 and 4 <= met.samples_per_s <= 12
    assert "Result is : VALID" in (tmp_path / "a" / "mlperf_log_summary.txt").read_text()
    # No request through the ensemble (a JPEG decoded, resized, classified) answers in 1 ms.
    missed = run_scenario(
        target, IMAGES, Scenario.server(8, 1, seconds=2, min_queries=8, percentile=0.9), tmp_path / "b"
    )
    assert not missed.valid and missed.p99_ms > 1
    assert "Result is : INVALID" in (tmp_path / "b" / "mlperf_log_summary.txt").read_text()


def test_offline_counts_what_the_server_answered(server, tmp_path):
    """LoadGen issues expected_qps x seconds x 1.1 queries at once and judges the run VALID
    only if answering them took the minimum duration: 330 queries take more than 1 s on
    any 2-core machine (the classifier alone costs ~5-10 ms an image a core)."""
    target = TritonHttpTarget(server.http_url, ENSEMBLE)
    offline = run_scenario(target, IMAGES, Scenario.offline(seconds=1, expected_qps=300), tmp_path, max_connections=4)
    assert offline.valid and offline.errors == 0 and offline.samples_per_s > 0


def test_the_peer_sees_the_same_scenario_through_its_own_adaptor(session_repository, tmp_path):
    with peer_server(session_repository, [PRESET], workers=1) as peer:
        result = run_scenario(PeerHttpTarget(peer.url, "efficientnet_lite0"), IMAGES, SERVER_SCENARIO, tmp_path)
    assert result.met and result.scheduled_per_s is not None
    settings = detail_records((tmp_path / "mlperf_log_detail.txt").read_text())
    assert (settings["effective_target_qps"], settings["effective_scenario"]) == (8, "Server")
