"""The soak's short version, against the session's server: mixed good and bad
images over HTTP and gRPC for half a minute. The memory-growth limit (2% after
warm-up, over 600 s or more) is judged by `make soak` (30 minutes); half a minute only
catches a gross leak."""

from __future__ import annotations

from loadtests.soak import run_soak, summary

QUICK_S = 30
GROSS_GROWTH_PCT = 20.0


def test_quick_soak_fails_no_valid_request_and_leaks_nothing_gross(server):
    report = run_soak(server, duration_s=QUICK_S, warmup_s=10, workers_per_protocol=2, period_s=0.5)
    print(summary(report))
    counts = report["counts"]
    assert report["failed_valid_requests"] == 0, report["failures"]
    assert report["bad_server_errors"] == 0, report["failures"]
    assert counts["valid_ok"] > 50 and counts["bad_refused"] > 10
    assert counts["http_requests"] > 20 and counts["grpc_requests"] > 20
    assert report["memory_passed"] is None  # 20 s after warm-up: too short to judge
    processes = set(report["rss_growth"])
    assert {"tritonserver", "stub:preprocess_dali_efficientnet_lite0", "stub:efficientnet_lite0"} <= processes
    for name in processes:
        rss, fds = report["rss_growth"][name], report["fd_growth"][name]
        assert rss["growth_pct"] < GROSS_GROWTH_PCT, (name, rss)
        assert fds["last"] <= fds["first"] + 4, (name, fds)  # no descriptor leak per request
