"""The soak's short version, against the session's server: mixed good and bad
images over HTTP and gRPC for 20 s. The memory-growth limit (2% after
warm-up, over 600 s or more) is judged by `make soak` (30 minutes); 20 s only catches
a gross leak."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import NO_RETRY
from tritonstack.diagnostics.memory_growth import MixedLoad, is_refusal_of_bad_data, run_soak, summary
from tritonstack.samples.photos import bad_samples

QUICK_S = 20
GROSS_GROWTH_PCT = 20.0


def test_quick_soak_fails_no_valid_request_and_leaks_nothing_gross(server):
    report = run_soak(server, duration_s=QUICK_S, warmup_s=10, workers_per_protocol=2, period_s=0.5)
    print(summary(report))
    counts = report["counts"]
    assert report["failed_valid_requests"] == 0, report["failures"]
    assert report["bad_server_errors"] == 0, report["failures"]
    assert counts["valid_ok"] > 50 and counts["bad_refused"] > 10
    assert counts["http_requests"] > 20 and counts["grpc_requests"] > 20
    assert report["memory_passed"] is None  # 10 s after warm-up: too short to judge
    processes = set(report["rss_growth"])
    assert {"tritonserver", "stub:preprocess_dali_efficientnet_lite0", "stub:efficientnet_lite0"} <= processes
    for name in processes:
        rss, fds = report["rss_growth"][name], report["fd_growth"][name]
        assert rss["growth_pct"] < GROSS_GROWTH_PCT, (name, rss)
        assert fds["last"] <= fds["first"] + 4, (name, fds)  # no descriptor leak per request


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_oracle_tells_a_refusal_of_bad_data_from_a_pipeline_failure(server, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    with ClassifierClient(url, protocol, retry=NO_RETRY, batch=True) as client:  # as the soak's own clients
        outcomes = [MixedLoad._send(client, sample) for sample in bad_samples()]
    refused = [(outcome, error) for outcome, error in outcomes if outcome != "bad_accepted"]
    assert refused, outcomes  # random bytes and text never decode
    assert all(outcome == "bad_refused" and is_refusal_of_bad_data(error) for outcome, error in refused), outcomes
    # The same status without the data's problem in it is a pipeline failing for
    # another reason (here: Triton's words for a dead backend stub): not a refusal.
    status = "400" if protocol == "http" else "StatusCode.UNKNOWN"
    other = InferenceServerException("DALI pipeline failed: Stub process 'x_0_0' is not healthy.", status=status)
    assert not is_refusal_of_bad_data(other)
