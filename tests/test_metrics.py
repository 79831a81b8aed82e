"""Triton's Prometheus metrics as a per-model breakdown, ensemble steps included."""

import pytest
from tritonclient.utils import InferenceServerException

from tests.processes import wait_for
from tritonstack.client.classifier import ClassifierClient
from tritonstack.client.retry import RetryPolicy
from tritonstack.loadtests import metrics
from tritonstack.samples.photos import photo_bytes

ENSEMBLE = "ensemble_dali_efficientnet_lite0"
STEPS = ("preprocess_dali_efficientnet_lite0", "efficientnet_lite0")

EXPOSITION = """\
# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="m",version="1"} 10
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 1
nv_inference_count{model="m",version="1"} 12
nv_inference_exec_count{model="m",version="1"} 4
nv_inference_queue_duration_us{model="m",version="1"} 5000
nv_inference_compute_input_duration_us{model="m",version="1"} 1000
nv_inference_compute_infer_duration_us{model="m",version="1"} 18000
nv_inference_compute_output_duration_us{model="m",version="1"} 1000
nv_inference_request_duration_us{model="m",version="1"} 30000
nv_cpu_utilization 0.5
"""


def test_breakdown_of_exposition_text():
    (row,) = metrics.breakdown({}, metrics.parse(EXPOSITION))
    assert (row.model, row.requests, row.failures) == ("m", 10, 3)
    assert row.mean_batch_size == 3.0  # 12 images in 4 executions
    assert row.mean_queue_ms == pytest.approx(0.5)
    assert row.mean_compute_ms == pytest.approx(2.0)
    assert row.mean_request_ms == pytest.approx(3.0)


def test_breakdown_of_a_real_server_includes_ensemble_steps(server):
    before = metrics.scrape(server.metrics_url)
    with ClassifierClient(server.grpc_url, "grpc", ENSEMBLE, retry=RetryPolicy(retries=0)) as client:
        client.classify([photo_bytes("chelsea.png"), photo_bytes("coffee.png")], top_k=1)
        client.classify([photo_bytes("rocket.jpg")], top_k=1)
        with pytest.raises(InferenceServerException):
            client.classify([b"\xff\xd8 not a jpeg"], top_k=1)

    def counted():
        # The ensemble counts its failure after answering the client: poll for it.
        rows = {row.model: row for row in metrics.breakdown(before, metrics.scrape(server.metrics_url))}
        return rows if ENSEMBLE in rows and rows[ENSEMBLE].failures >= 1 else None

    rows = wait_for(counted, timeout_s=15, what="the ensemble's failure in the metrics")

    assert rows[ENSEMBLE].requests == 2
    assert rows[ENSEMBLE].inferences == 3  # images
    # Triton 2.51 counts a failed ensemble request under reason OTHER, once or twice;
    # the step that answered with an error counts it as a success (a response).
    assert rows[ENSEMBLE].failures >= 1
    assert rows[STEPS[0]].requests in (2, 3) and rows[STEPS[1]].requests == 2
    for step in STEPS:
        assert 1.0 <= rows[step].mean_batch_size <= 2.0
        assert rows[step].mean_compute_ms > 0
        assert rows[step].mean_queue_ms >= 0
    assert rows[ENSEMBLE].mean_request_ms > 0
